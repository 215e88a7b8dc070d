"""Request bodies from the plan: synthetic or dataset text of the planned token counts, shared prefixes,
Mooncake prefix blocks, and the growing history of multi-turn sessions.

Text rules (counts under the run's tokenizer, see prompts.py). The planned length of a request is its
whole prompt as the server counts it (usage.prompt_tokens: chat template, special tokens, every message):
the last user message's text is fitted to it (PromptMaker.fit_last); shared pieces are counted alone:
- a request without a shared prefix sends `new_tokens` of its own text (its whole prompt);
- a request in prefix group g sends the group's K-token text first: as a system message (chat), or
  followed by a newline and its own text (completions); every request of group g sends the same
  K tokens (counted alone), generated once from (seed, g); its own text is fitted so that the whole
  request counts the planned K + new_tokens;
- Mooncake replay: the prompt is the concatenation of its 512-token blocks, block h generated from
  (seed, h), so rows with equal leading hash_ids share exactly those blocks; the last block is cut to
  the row's input_length;
- a session's turn t sends [prefix] + u_0, r_0, ..., u_(t-1), r_(t-1), u_t, where u are this session's
  user messages and r the server's actual replies (text taken from the stream), so the prompt grows
  by what the server really said. Its planned_prompt_tokens is the previous turn's planned prompt +
  that turn's reply (its usage completion tokens) + new_tokens of turn t: u_t is fitted, when the turn
  is built (next_turn, after r_(t-1) has arrived; the runner calls it off the event loop), so that the
  whole list counts that. So the template's per-message tokens and the replies' re-tokenisation come out
  of u_t, and every turn's usage.prompt_tokens equals its plan; when the history alone already counts
  more, u_t is empty and the turn's count is off (prompt_checks.impossible; the run's verdict says so).
  ShareGPT turns (a dataset's text) are sent as they are.
- an agentic session (Schedule.max_tool_rounds > 0; docs/design.md "Agentic sessions"): when the reply
  r_(t-1) streamed tool calls and fewer than max_tool_rounds tool rounds came just before, turn t sends
  instead the history + r_(t-1) as an assistant message with its `tool_calls` (ids, names, arguments as
  streamed: backend.reply_message) + one `role: tool` message per call, in the calls' order: results
  of tool_tokens[t] tokens in all, deterministic from (seed, salt, t), the first calls an equal share
  each, the last fitted so that the whole list counts previous planned + its output + tool_tokens[t];
  a reply with calls past the bound goes back as its text (name and arguments, no tool_calls), and
  turn t is then the next user message, as after a reply without calls. next_turn returns the turn's
  tool round (0: a user message; k: the k-th tool round in a row), which the runner times by.

Images ([image]): row i's n images, generated from (seed, salt, i) (plan/images.py), are content parts of
its last user message after the text; the text is fitted as without them (the planned prompt counts text
only; the server adds its own image tokens, which the row's prompt_tokens then include).

Rerank ([rerank], api = "rerank"): the request's text is the query (fitted as a whole prompt, as above), and
its documents are texts of their planned lengths, counted alone, document k of row i drawn from
(seed, salt, i, k); no two documents share a word by construction.

Salt (`prompt.salt`, manifest `config.prompt_salt`): every text above is drawn from (seed, salt, ...), so
the salt changes every word and no length (lengths and times come from the seed alone, schedule.py).
What the rules above share, they share within one run; two runs share nothing unless they use the same
salt (run_workload draws a random one unless the workload or --prompt-salt gives it). Dataset text is
the dataset's own and is not salted.
"""
from __future__ import annotations

import numpy as np

from loadgen.plan import images
from loadgen.plan.prompts import PromptMaker
from loadgen.plan.schedule import NONE, Schedule

BLOCK_TOKENS = 512


class Bodies:
    def __init__(self, schedule: Schedule, backend, maker: PromptMaker, seed: int, conversations=None,
                 salt: int | None = None, mix: tuple = (), image_fill: str | None = None):
        # mix: the run's [[mix]] classes (config.MixClass): a row of class j sends mix[j]'s model and priority
        self.s, self.backend, self.maker, self.seed = schedule, backend, maker, seed
        self.mix = mix
        self._key = [seed, 3] if salt is None else [seed, 3, salt]
        self.convs = conversations
        self.image_fill = image_fill   # [image] fill (plan/images.py)
        self._prefix: dict[int, str] = {}
        self._blocks: dict[tuple[int, int], str] = {}
        self.user_text: list[str] = []
        # session history per row that has a next turn: its message list (chat messages: role, content,
        # an assistant's tool_calls, a tool result's tool_call_id); filled at run time
        self._history: dict[int, list[dict]] = {}
        self._round: dict[int, int] = {}  # agentic sessions: row -> its tool round (next_turn)
        self.turns_impossible = 0  # next_turn: turns whose history alone counted more than planned

    @property
    def blocking(self) -> bool:
        """next_turn may wait on the network (the server counts the messages): the runner calls it in a
        thread. A local or approximate count is quick and stays on the event loop."""
        return self.maker.tokenizer.mode == "server"

    def _rng(self, *key: int) -> np.random.Generator:
        return np.random.default_rng(np.random.SeedSequence([*self._key, *key]))

    def prefix_text(self, group: int) -> str:
        if group not in self._prefix:
            self._prefix[group] = self.maker.text(self.s.prefix_tokens, self._rng(1, group))
        return self._prefix[group]

    def _block(self, h: int, n: int) -> str:
        if (h, n) not in self._blocks:
            # same walk: a cut block is a prefix of the full one
            self._blocks[(h, n)] = self.maker.text(n, self._rng(2, h))
        return self._blocks[(h, n)]

    def build_all(self) -> list[bytes]:
        """Bodies for every row; a later turn's body is a placeholder until its previous turn ends."""
        s, out = self.s, []
        for i in range(len(s)):
            if s.after[i] != NONE:  # a later turn: its text is fitted to the history when it is built
                self.user_text.append(self._dataset_text(i) or "")
                out.append(b"")
                continue
            prefix = self._prefix_of(i)
            own = self._own_text(i, prefix)
            self.user_text.append(own)
            out.append(self._body(i, prefix, [{"role": "user", "content": own}]))
        return out

    def _prefix_of(self, i: int) -> str:
        s = self.s
        return self.prefix_text(int(s.prefix_group[i])) if s.prefix_group[i] != NONE and s.prefix_tokens else ""

    def _dataset_text(self, i: int) -> str | None:
        s = self.s
        if s.conversation[i] != NONE and self.convs is not None:
            turns = self.convs.human_turns[int(s.conversation[i])]
            return turns[max(int(s.turn[i]), 0) % len(turns)]
        return None

    def _own_text(self, i: int, prefix: str) -> str:
        s = self.s
        n = int(s.new_tokens[i])
        if s.conversation[i] != NONE and self.convs is not None:
            turns = self.convs.human_turns[int(s.conversation[i])]
            return turns[max(int(s.turn[i]), 0) % len(turns)]
        if s.blocks is not None:
            ids = s.blocks[i] or [-(i + 1)]  # no hash ids: a private block per row
            parts, left = [], n
            for h in ids:
                if left <= 0:
                    break
                k = min(BLOCK_TOKENS, left)
                parts.append(self._block(int(h), k))
                left -= k
            if left > 0:  # longer than its blocks say: the rest is private text
                parts.append(self.maker.text(left, self._rng(4, i)))
            return " ".join(parts)
        if prefix:  # the whole request (system prompt + this text) counts the planned prompt
            group = int(s.prefix_group[i])
            return self.maker.fit_last([{"role": "system", "content": prefix}], int(s.prompt_tokens[i]),
                                       self._rng(0, i), key=("prefix", group))
        # The request's whole prompt: counted as the server counts it, special tokens and chat template
        # included (prompts.py).
        return self.maker.text(n, self._rng(0, i), whole=True)

    def _body(self, i: int, prefix: str, messages: list[dict]) -> bytes:
        # The prefix is a system message; a completions-style endpoint gets the contents joined by
        # newlines (backends.joined), prefix first. Row i's [[mix]] class gives its model and priority;
        # its images ([image]) go with its last user message, after its text, as OpenAI content parts (a
        # session's earlier turns are resent as text only).
        msgs: list[dict] = ([{"role": "system", "content": prefix}] if prefix else []) + [dict(m) for m in messages]
        n = int(self.s.images[i])
        if n:
            w, h, fill = int(self.s.image_width[i]), int(self.s.image_height[i]), self.image_fill or "noise"
            msgs[-1]["content"] = [{"type": "text", "text": msgs[-1]["content"]},
                                   *images.parts(n, w, h, self._rng(5, i), fill)]
        j = int(self.s.mix_class[i])
        cls = self.mix[j] if j != NONE and self.mix else None
        if self.s.document_tokens is not None:  # api = "rerank": the text is the query, then its documents
            return self.backend.body_documents(msgs[-1]["content"], self.documents(i),
                                               model=cls.model if cls else None)
        return self.backend.body_messages(msgs, int(self.s.max_tokens[i]), model=cls.model if cls else None,
                                          priority=cls.priority if cls else None)

    def documents(self, i: int) -> list[str]:
        """Row i's rerank documents: each of its planned length, counted alone, drawn from (seed, salt, i, k)."""
        assert self.s.document_tokens is not None
        return [self.maker.text(int(n), self._rng(7, i, k)) for k, n in enumerate(self.s.document_tokens[i])]

    def next_turn(self, j: int, prev_row, prev_reads: list[bytes]) -> tuple[bytes, int, int | None]:
        """Body of row j, the turn after prev_row, built when prev_row's reply is complete; its planned
        prompt tokens: prev_row's planned prompt + its reply's usage count + what row j adds (new_tokens[j]
        of user text, or tool_tokens[j] of tool results), which the whole message list is fitted to (module
        docstring); and its tool round (None: not an agentic session; 0: it sends a user message; k >= 1:
        the k-th request in a row that answers tool calls). May ask the server to count (a blocking
        /tokenize): the runner calls it off its event loop, one turn at a time."""
        s, p = self.s, prev_row.idx
        history = self._history.pop(p, None) or [{"role": "user", "content": self.user_text[p]}]
        prev_round = self._round.pop(p, 0)
        prefix = self._prefix_of(j)
        context = [{"role": "system", "content": prefix}] if prefix else []
        if s.max_tool_rounds:
            reply = self.backend.reply_message(prev_reads)
            if reply.get("tool_calls") and prev_round < s.max_tool_rounds:
                return self._tool_round(j, prev_row, prefix, context, history + [reply], prev_round + 1)
        # A reply without calls, or one past max_tool_rounds (its calls resent as text: an assistant
        # message with tool_calls must be followed by their results), then the next user message.
        history.append({"role": "assistant", "content": self.backend.reply_text(prev_reads)})
        planned = int(prev_row.planned_prompt_tokens) + int(prev_row.output_tokens or 0) + int(s.new_tokens[j])
        text = self._dataset_text(j)
        if text is None:
            before = self.maker.impossible
            text = self.maker.fit_last(context + history, planned, self._rng(0, j))
            self.turns_impossible += self.maker.impossible - before
        messages = history + [{"role": "user", "content": text}]
        self._history[j] = messages
        if s.max_tool_rounds:
            self._round[j] = 0
        return self._body(j, prefix, messages), planned, (0 if s.max_tool_rounds else None)

    def _tool_round(self, j: int, prev_row, prefix: str, context: list[dict], history: list[dict],
                    round_: int) -> tuple[bytes, int, int]:
        # history ends with the assistant message that called tools: one `role: tool` message per call,
        # in the calls' order, answers it. Their texts (tool_tokens[j] in all) are deterministic from
        # (seed, salt, j): the first calls get an equal share each, counted alone; the last one is fitted so
        # that the whole list counts the plan, as a user message would be.
        calls = history[-1]["tool_calls"]
        total = int(self.s.tool_tokens[j])
        planned = int(prev_row.planned_prompt_tokens) + int(prev_row.output_tokens or 0) + total
        share = total // len(calls)
        results = [{"role": "tool", "tool_call_id": c["id"], "content": self.maker.text(share, self._rng(6, j, k))}
                   for k, c in enumerate(calls[:-1])]
        last = {"role": "tool", "tool_call_id": calls[-1]["id"]}
        before = self.maker.impossible
        text = self.maker.fit_last(context + history + results, planned, self._rng(0, j), last=last)
        self.turns_impossible += self.maker.impossible - before
        messages = history + results + [{**last, "content": text}]
        self._history[j] = messages
        self._round[j] = round_
        return self._body(j, prefix, messages), planned, round_
