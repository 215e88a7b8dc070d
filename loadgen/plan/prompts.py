"""Prompt text of an exact token count, and the tokenizers that count it.

Tokenizers (chosen by `prompt.tokenizer`, recorded in the manifest):
    server       the target's own tokenize endpoint, its request shape found by probing (vLLM/SGLang,
                 llama.cpp, TGI: server_tokenizer.py); a whole prompt is counted as the server counts
                 it (special tokens; chat template where the server can apply it)
    local        a tokenizer.json on disk through the `tokenizers` package (never downloaded); for chat, the
                 model's own template from tokenizer_config.json (or chat_template.jinja) beside it,
                 rendered as transformers' apply_chat_template renders it (jinja2, the optional `chat`
                 extra); without one, chat lengths are not exact and the verdict says why
    approximate  no tokenizer: a token is a run of non-whitespace (exact for the simulator, a guess for
                 a real model; each row's server-reported `prompt_tokens` shows the real count)
    auto         (default) server when the target's /tokenize answers, else approximate with a warning

Whole prompts vs parts: `text(n, rng, whole=True)` makes the request's entire prompt, counted by
`count_prompt` (what the server's usage will say); parts of a prompt (shared prefixes, blocks) are
counted alone by `count`. A request whose prompt is a message list (a system prompt, a session's history)
gets its last user message from `fit_last(context, n, rng)`: the text whose whole list, context + that
message, counts n under `count_messages` (chat: the server's chat template applied with the generation
prompt, so its per-message tokens and the re-tokenised replies are counted; completions: the contents
joined by newlines as one whole prompt). That count is what the server's usage.prompt_tokens says.
`verdict()` says whether a run's lengths are exact; a run whose lengths are not exact says so on stderr,
in the manifest and report, and exits ExitCode.INVALID (3) unless `prompt.tokenizer = "approximate"` was
asked for.

Synthetic text: words of 2-letter syllables drawn without repetition from 16^5 = 1,048,576 distinct
words by a seeded affine walk (index_j = (a + j*b) mod P, P prime, b != 0), so no word repeats within a
prompt and two prompts start at unrelated words: a prefix cache gets no free hit across requests that
should not share. Under a whitespace tokenizer each word is one token and the text is N words. For any
other tokenizer, fit() searches the number of words whose text counts <= N, then appends single-token
fillers until the count is exactly N, and the final count is checked by a round trip.

Round-trip checks (an exact tokenizer counts the finished text; the manifest gets checked / exact /
max_abs_error): every fitted prompt; for a whitespace-exact tokenizer, where the text is N words by
construction, the first FULL_CHECKS prompts and then every CHECK_EVERY-th (each check is one
/tokenize request before the run starts).
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from loadgen.errors import TokenizerError  # noqa: F401  (raised here; importable from here too)
from loadgen.config.options import takes_messages

_SYLLABLES = ["ka", "lo", "mi", "ne", "ru", "sa", "te", "vo", "zu", "pe", "di", "go", "ha", "ji", "fu", "be"]
_SPACE = 16 ** 5
_PRIME = 1_048_573  # largest prime below 16^5: the walk visits P distinct indices before repeating
MAX_PROMPT_WORDS = _PRIME  # the longest synthetic text of distinct words: plan/limits.py bounds prompts by it
_WS = re.compile(r"\S+")
# Pieces tried, in order, when a real tokenizer needs a few more tokens than whole words give.
_FILLERS = [" " + s for s in _SYLLABLES] + [" a", " I", " 1", " 2", " 3", " x", " y", " z", ".", ","]
FULL_CHECKS, CHECK_EVERY = 500, 20


class Tokenizer:
    mode = "approximate"
    exact = False     # True when counts are the target model's own
    detail = ""

    prompt_exact = True  # whole prompts can be counted as the server counts them (see count_prompt)

    def count(self, text: str) -> int:
        return sum(1 for _ in _WS.finditer(text))

    def count_prompt(self, text: str) -> int:
        """Tokens of `text` sent as a request's whole prompt (special tokens, chat template included)."""
        return self.count(text)

    def count_messages(self, messages: list[dict]) -> int:
        """Tokens of a request's whole message list as the server counts it. Without a chat template to
        apply (approximate, local) the messages' texts joined by newlines (backends.base.joined) as one
        prompt; a message's text is its content and its tool calls' names and arguments (message_text)."""
        return self.count_prompt("\n".join(map(message_text, messages)))

    def whitespace_exact(self, count=None) -> bool:
        """True when each whitespace-separated word is one token (the simulator): no search needed."""
        count = count or self.count
        return count("kalo mine rusa") == 3 and count("kalomine rusate vozupe di") == 4

    def describe(self) -> dict:
        return {"mode": self.mode, "exact": self.exact, "detail": self.detail}


class ApproximateTokenizer(Tokenizer):
    detail = "a token is a run of non-whitespace (no tokenizer consulted)"


class LocalTokenizer(Tokenizer):
    mode, exact = "local", True

    def __init__(self, path: str | Path, api: str = "completions"):
        p = Path(path)
        if not p.is_file():
            raise TokenizerError(
                f"prompt.tokenizer_file: no such file {str(p)!r}. loadgen never downloads tokenizers: copy the "
                f"model's tokenizer.json next to the workload (it ships with the model weights, e.g. in the "
                f"server's model folder) and set tokenizer_file to it, or use tokenizer = \"server\" (the "
                f"target's /tokenize) or \"approximate\"")
        try:
            from tokenizers import Tokenizer as HFTokenizer
        except ImportError:
            raise TokenizerError("prompt.tokenizer = \"local\" needs the `tokenizers` package: "
                                 "pip install tokenizers") from None
        try:
            self._tok = HFTokenizer.from_file(str(p))
        except Exception as e:  # noqa: BLE001 - the library raises a bare Exception on a bad file
            raise TokenizerError(f"prompt.tokenizer_file: {p} is not a tokenizer.json the `tokenizers` "
                                 f"package can read: {e}") from None
        self.detail = str(p)
        self._template = None
        if takes_messages(api):
            self._template, note = local_chat_template(p)
            self.prompt_exact = self._template is not None
            self.detail += f"; {note}"

    def count(self, text: str) -> int:
        return len(self._tok.encode(text, add_special_tokens=False).ids)

    def count_prompt(self, text: str) -> int:
        if self._template is None:
            return self.count(text)
        return self.count_messages([{"role": "user", "content": text}])

    def count_messages(self, messages: list[dict[str, str]]) -> int:
        if self._template is None:
            return super().count_messages(messages)
        # as apply_chat_template(tokenize=True): the rendered text holds the special tokens itself
        return len(self._tok.encode(self._template(messages), add_special_tokens=False).ids)


def message_text(m: dict) -> str:
    """A chat message as text, where no chat template renders it: its content ("" when null), then each
    of its tool calls' function name and arguments, separated by spaces (an assistant message that called
    tools; the simulator counts the same words, sim/tokenizer.py)."""
    parts = [m.get("content") or ""]
    for call in m.get("tool_calls") or ():
        fn = call.get("function") or {}
        parts += [fn.get("name") or "", fn.get("arguments") or ""]
    return " ".join(parts) if len(parts) > 1 else parts[0]


def local_chat_template(tokenizer_json: Path):
    """(render(messages) -> the prompt text, a note for `detail`) from the model's chat template beside its
    tokenizer.json (chat_template.jinja, else tokenizer_config.json's `chat_template`, its `default` when
    it names several), rendered as transformers does (a sandboxed jinja2 environment, trim_blocks,
    lstrip_blocks, bos_token/eos_token, add_generation_prompt); (None, why not) when there is none."""
    folder = tokenizer_json.parent
    cfg_path, jinja_path = folder / "tokenizer_config.json", folder / "chat_template.jinja"
    try:
        cfg = json.loads(cfg_path.read_text()) if cfg_path.is_file() else {}
        source = jinja_path.read_text() if jinja_path.is_file() else cfg.get("chat_template")
    except (OSError, ValueError) as e:
        raise TokenizerError(f"prompt.tokenizer_file: cannot read the chat template beside it: {e}") from None
    if isinstance(source, list):  # [{"name", "template"}, ...]
        source = next((t.get("template") for t in source if isinstance(t, dict) and t.get("name") == "default"), None)
    if not isinstance(source, str):
        return None, (f"chat template tokens NOT counted: no chat_template in {cfg_path} (or {jinja_path.name}) "
                      f"beside the tokenizer")
    try:
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError:
        return None, "chat template tokens NOT counted: the model's template needs jinja2 (pip install jinja2)"

    def raise_exception(message):
        raise TokenizerError(f"the chat template in {folder} refused the messages: {message}")

    def special(name: str) -> str:
        v = cfg.get(name)
        return v.get("content", "") if isinstance(v, dict) else v if isinstance(v, str) else ""

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    try:
        template = env.from_string(source)
    except Exception as e:  # noqa: BLE001 - jinja2's TemplateSyntaxError and friends
        raise TokenizerError(f"the chat template in {folder} does not parse: {e}") from None
    tokens = {"bos_token": special("bos_token"), "eos_token": special("eos_token")}

    def render(messages: list[dict[str, str]]) -> str:
        return template.render(messages=messages, add_generation_prompt=True, **tokens)
    return render, f"chat template from {jinja_path if jinja_path.is_file() else cfg_path}"




def verdict(tokenizer: Tokenizer, checks: dict, requested: str) -> dict:
    """The manifest's `workload.prompt_lengths` before the run: exact (bool), asked_approximate (bool),
    reason (why not exact, or None). usage_check() adds the comparison with the server's usage."""
    reason = None
    if not tokenizer.exact:
        reason = f"no exact tokenizer (prompt.tokenizer = {requested!r} -> {tokenizer.mode})"
    elif not tokenizer.prompt_exact:
        reason = f"the chat template's tokens are not counted ({tokenizer.detail})"
    elif checks.get("impossible"):
        reason = (f"{checks['impossible']} prompts cannot be as short as planned: what comes before their own "
                  f"text (system prompt, chat template) already counts more tokens than their planned length")
    elif checks["checked"] > checks["exact"]:
        reason = (f"{checks['checked'] - checks['exact']} of {checks['checked']} checked prompts have another "
                  f"length than planned (max abs error {checks['max_abs_error']} tokens)")
    return {"exact": reason is None, "asked_approximate": requested == "approximate", "reason": reason}


def usage_check(lengths: dict, pairs: list[tuple[int, int | None]]) -> None:
    """After the run: compare planned prompt tokens with the server's own count (usage) of each ok request;
    adds `usage` {compared, equal, max_abs_error} to `lengths` and marks it not exact on a mismatch
    (when the pre-run checks called it exact)."""
    got = [(p, r) for p, r in pairs if r is not None]
    equal = sum(1 for p, r in got if p == r)
    lengths["usage"] = {"compared": len(got), "equal": equal,
                        "max_abs_error": max((abs(p - r) for p, r in got), default=0)}
    if equal < len(got) and lengths["exact"]:
        lengths["exact"] = False
        lengths["reason"] = (f"the server counted another prompt length than planned for {len(got) - equal} of "
                             f"{len(got)} requests (max abs error {lengths['usage']['max_abs_error']} tokens)")
        if lengths.get("turns_impossible"):
            lengths["reason"] += (f"; {lengths['turns_impossible']} session turns could not be fitted: their "
                                  f"history alone (chat template included) counted more than planned")


def word_walk(rng: np.random.Generator, n: int) -> list[str]:
    """n distinct words (n <= P) from a seeded affine walk over the word space."""
    if n > _PRIME:
        raise ValueError(f"at most {_PRIME} distinct words per prompt, asked for {n}")
    a, b = int(rng.integers(0, _PRIME)), int(rng.integers(1, _PRIME))
    idx = (a + np.arange(n, dtype=np.int64) * b) % _PRIME
    out = []
    for i in idx.tolist():
        w = []
        for _ in range(5):
            w.append(_SYLLABLES[i & 15])
            i >>= 4
        out.append("".join(w))
    return out


@dataclass
class PromptMaker:
    tokenizer: Tokenizer
    checked: int = 0
    exact: int = 0
    max_abs_error: int = 0
    made: int = 0
    impossible: int = 0   # fit_last: the context alone already had more tokens than planned
    _ws: dict | None = field(default=None, repr=False)  # whole -> whitespace-exact under that count
    # fit_last's context key -> tokens of the context with an empty last message, and whether a text of k
    # words then counts exactly that + k (whitespace-exact parts, a template that never merges with them)
    _base: dict = field(default_factory=dict, repr=False)

    def text(self, n: int, rng: np.random.Generator, whole: bool = False) -> str:
        """Text of exactly n tokens under self.tokenizer (round-trip checked when it is exact); whole: the
        request's entire prompt, counted as the server counts it (count_prompt)."""
        if n <= 0:
            return ""
        count = self.tokenizer.count_prompt if whole else self.tokenizer.count
        if self._ws is None:
            self._ws = {}
        if whole not in self._ws:
            self._ws[whole] = self.tokenizer.whitespace_exact(count)
        words = word_walk(rng, n)
        self.made += 1
        if self._ws[whole]:
            text = " ".join(words)
            if self.made <= FULL_CHECKS or self.made % CHECK_EVERY == 0:
                self.check(text, n, count)
        elif whole:  # one user message (chat) or one prompt (completions): the message-list fit
            self.made -= 1
            return self.fit_last([], n, rng, key=("whole",))
        else:
            text = self._fit(n, words, rng, count)
            self.check(text, n, count)
        return text

    def fit_last(self, context: list[dict], n: int, rng: np.random.Generator,
                 key: tuple | None = None, last: dict | None = None) -> str:
        """The text of a last user message (or of `last`, a message without its content: a tool result's
        role and tool_call_id) such that context + [that message] counts n tokens under
        tokenizer.count_messages (as the server counts the whole request); "" and `impossible` counted
        when the context alone (with an empty message) counts more than n. key names a context that
        recurs (a shared system prompt): its empty-message count is asked once, and when texts of k words
        count exactly that + k, later texts are k words with sampled round-trip checks as in text().
        Otherwise an interpolation search over the word count (count_messages is non-decreasing in it,
        each word at least one token), then single-token fillers, round-trip checked."""
        tok, self.made = self.tokenizer, self.made + 1

        shell = last or {"role": "user"}

        def total(text: str) -> int:
            return tok.count_messages([*context, {**shell, "content": text}])

        if key is not None and key in self._base:
            base, additive = self._base[key]
        else:
            base, additive = total(""), False
        if base > n:
            self.impossible += 1
            self._record(base, n)
            return ""
        words = word_walk(rng, n - base) if n > base else []
        if additive:
            text = " ".join(words)
            if self.made <= FULL_CHECKS or self.made % CHECK_EVERY == 0:
                self.check(text, n, total)
            return text
        k, have = self._search(words, base, n, total)
        text = " ".join(words[:k])
        if key is not None:
            ws = self._ws if self._ws is not None else {}
            self._ws = ws
            if False not in ws:
                ws[False] = tok.whitespace_exact(tok.count)
            self._base[key] = (base, ws[False] and have == base + k)
        if have < n:
            text, have = self._fill(text, have, n, rng, total)
        self._record(have, n)
        return text

    @staticmethod
    def _search(words: list[str], base: int, n: int, total) -> tuple[int, int]:
        # Largest k with total(first k words) <= n, and that total: interpolation between a bracket
        # (exact in one step when each word is one token), bisection after a few steps.
        lo, f_lo, hi, f_hi = 0, base, len(words) + 1, None
        k, steps = len(words), 0
        while lo < hi - 1:
            f = total(" ".join(words[:k]))
            if f == n:
                return k, f
            if f < n:
                lo, f_lo = k, f
            else:
                hi, f_hi = k, f
            steps += 1
            if hi == len(words) + 1:  # no upper bound yet: every word so far fits
                if lo == len(words):
                    break
                k = min(len(words), lo + max(1, n - f_lo))
            elif f_hi is not None and steps <= 4:
                k = lo + round((n - f_lo) * (hi - lo) / max(1, f_hi - f_lo))
                k = min(max(k, lo + 1), hi - 1)
            else:
                k = (lo + hi) // 2
        return lo, f_lo

    def _record(self, have: int, n: int) -> None:
        # a count already asked of an exact tokenizer: recorded as a round-trip check
        if self.tokenizer.exact:
            self.checked += 1
            self.exact += have == n
            self.max_abs_error = max(self.max_abs_error, abs(have - n))

    def check(self, text: str, n: int, count=None) -> None:
        if not self.tokenizer.exact:
            return
        c = (count or self.tokenizer.count)(text)
        self.checked += 1
        self.exact += c == n
        self.max_abs_error = max(self.max_abs_error, abs(c - n))

    def _fit(self, n: int, words: list[str], rng: np.random.Generator, count) -> str:
        # Largest k with count(first k words) <= n (count is non-decreasing in k).
        lo, hi = 0, len(words)
        if count(" ".join(words)) <= n:
            lo = hi
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if count(" ".join(words[:mid])) <= n:
                lo = mid
            else:
                hi = mid - 1
        text = " ".join(words[:lo])
        return self._fill(text, count(text), n, rng, count)[0]

    @staticmethod
    def _fill(text: str, have: int, n: int, rng: np.random.Generator, count) -> tuple[str, int]:
        # Appends single-token fillers while have < n; (text, its count). Stops short when none fits.
        fillers = list(_FILLERS)
        rng.shuffle(fillers)
        while have < n:
            for f in fillers:
                piece = f.lstrip() if not text else f
                if count(text + piece) == have + 1:
                    text, have = text + piece, have + 1
                    break
            else:
                break  # no filler adds exactly one token here: leave the text short, the check records it
        return text, have

    def summary(self) -> dict:
        return {"prompts": self.made, "checked": self.checked, "exact": self.exact,
                "max_abs_error": self.max_abs_error,
                **({"impossible": self.impossible} if self.impossible else {})}  # only when some were


def synthetic_text(n_tokens: int, rng: np.random.Generator) -> str:
    """n distinct words (n tokens under the simulator's whitespace rule); kept for the skeleton's callers."""
    return " ".join(word_walk(rng, n_tokens)) if n_tokens > 0 else ""
