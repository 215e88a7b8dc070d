"""Request bodies from the plan: synthetic or dataset text of the planned token counts, shared prefixes,
Mooncake prefix blocks, and the growing history of multi-turn sessions.

Text rules (counts under the run's tokenizer, see prompts.py; a request's text that is its whole prompt
is counted as the server counts a whole prompt, every other piece alone):
- a request without a shared prefix sends `new_tokens` of its own text;
- a request in prefix group g sends the group's K-token text first: as a system message (chat), or
  followed by a newline and its own text (completions); every request of group g sends the same
  K tokens, generated once from (seed, g);
- Mooncake replay: the prompt is the concatenation of its 512-token blocks, block h generated from
  (seed, h), so rows with equal leading hash_ids share exactly those blocks; the last block is cut to
  the row's input_length;
- a session's turn t sends [prefix] + u_0, r_0, ..., u_(t-1), r_(t-1), u_t, where u are this session's
  user messages and r the server's actual replies (text taken from the stream), so the prompt grows
  by what the server really said. Its planned_prompt_tokens becomes prefix + sum(u) + sum(reply
  usage tokens) when the turn is sent.

Salt (`prompt.salt`, manifest `config.prompt_salt`): every text above is drawn from (seed, salt, ...), so
the salt changes every word and no length (lengths and times come from the seed alone, schedule.py).
What the rules above share, they share within one run; two runs share nothing unless they use the same
salt (run_workload draws a random one unless the workload or --prompt-salt gives it). Dataset text is
the dataset's own and is not salted.
"""
from __future__ import annotations

import numpy as np

from loadgen.plan.prompts import PromptMaker
from loadgen.plan.schedule import NONE, Schedule

BLOCK_TOKENS = 512


class Bodies:
    def __init__(self, schedule: Schedule, backend, maker: PromptMaker, seed: int, conversations=None,
                 salt: int | None = None):
        self.s, self.backend, self.maker, self.seed = schedule, backend, maker, seed
        self._key = [seed, 3] if salt is None else [seed, 3, salt]
        self.convs = conversations
        self._prefix: dict[int, str] = {}
        self._blocks: dict[tuple[int, int], str] = {}
        self.user_text: list[str] = []
        # session history per row that has a next turn: list of (role, text); filled at run time
        self._history: dict[int, list[tuple[str, str]]] = {}
        self._history_tokens: dict[int, int] = {}

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
            own = self._own_text(i)
            self.user_text.append(own)
            if s.after[i] != NONE:
                out.append(b"")
                continue
            prefix = self.prefix_text(int(s.prefix_group[i])) if s.prefix_group[i] != NONE and s.prefix_tokens else ""
            out.append(self._body(prefix, [("user", own)], int(s.max_tokens[i])))
        return out

    def _own_text(self, i: int) -> str:
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
        # The request's whole prompt (no shared prefix, no session): counted as the server counts it,
        # special tokens and chat template included (prompts.py); parts are counted alone.
        whole = (s.prefix_group[i] == NONE or not s.prefix_tokens) and s.session[i] == NONE
        return self.maker.text(n, self._rng(0, i), whole=bool(whole))

    def _body(self, prefix: str, messages: list[tuple[str, str]], max_tokens: int) -> bytes:
        # The prefix is a system message; a completions-style endpoint gets the contents joined by
        # newlines (backends.joined), prefix first.
        msgs = ([{"role": "system", "content": prefix}] if prefix else []) + [
            {"role": role, "content": text} for role, text in messages]
        return self.backend.body_messages(msgs, max_tokens)

    def next_turn(self, j: int, prev_row, prev_reads: list[bytes]) -> tuple[bytes, int]:
        """Body of row j, the turn after prev_row, built when prev_row's reply is complete; and its
        planned prompt tokens (prefix + user messages + the replies' usage counts)."""
        s, p = self.s, prev_row.idx
        history = self._history.pop(p, [("user", self.user_text[p])]) + [
            ("assistant", self.backend.reply_text(prev_reads))]
        tokens = self._history_tokens.pop(p, int(s.new_tokens[p])) + int(prev_row.output_tokens or 0)
        messages = history + [("user", self.user_text[j])]
        self._history[j], self._history_tokens[j] = messages, tokens + int(s.new_tokens[j])
        has_prefix = s.prefix_group[j] != NONE and s.prefix_tokens
        prefix = self.prefix_text(int(s.prefix_group[j])) if has_prefix else ""
        return self._body(prefix, messages, int(s.max_tokens[j])), \
            (s.prefix_tokens if has_prefix else 0) + tokens + int(s.new_tokens[j])

