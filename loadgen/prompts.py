"""Prompt text of an exact token count, and the tokenizers that count it.

Tokenizers (chosen by `prompt.tokenizer`, recorded in the manifest):
    server       the target's POST /tokenize: vLLM and the simulator ({"prompt": ...} -> "count" or
                 "tokens"), llama.cpp ({"content": ...} -> "tokens"); special tokens are not counted
    local        a tokenizer.json on disk through the `tokenizers` package (never downloaded)
    approximate  no tokenizer: a token is a run of non-whitespace (exact for the simulator, a guess for
                 a real model; each row's server-reported `prompt_tokens` shows the real count)
    auto         (default) server when the target's /tokenize answers, else approximate with a warning

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

import http.client
import re
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import numpy as np
import orjson
from loadgen.errors import TokenizerError  # noqa: F401  (raised here; importable from here too)

_SYLLABLES = ["ka", "lo", "mi", "ne", "ru", "sa", "te", "vo", "zu", "pe", "di", "go", "ha", "ji", "fu", "be"]
_SPACE = 16 ** 5
_PRIME = 1_048_573  # largest prime below 16^5: the walk visits P distinct indices before repeating
_WS = re.compile(r"\S+")
# Pieces tried, in order, when a real tokenizer needs a few more tokens than whole words give.
_FILLERS = [" " + s for s in _SYLLABLES] + [" a", " I", " 1", " 2", " 3", " x", " y", " z", ".", ","]
FULL_CHECKS, CHECK_EVERY = 500, 20


class Tokenizer:
    mode = "approximate"
    exact = False     # True when counts are the target model's own
    detail = ""

    def count(self, text: str) -> int:
        return sum(1 for _ in _WS.finditer(text))

    def whitespace_exact(self) -> bool:
        """True when each whitespace-separated word is one token (the simulator): no search needed."""
        return self.count("kalo mine rusa") == 3 and self.count("kalomine rusate vozupe di") == 4

    def describe(self) -> dict:
        return {"mode": self.mode, "exact": self.exact, "detail": self.detail}


class ApproximateTokenizer(Tokenizer):
    detail = "a token is a run of non-whitespace (no tokenizer consulted)"


class LocalTokenizer(Tokenizer):
    mode, exact = "local", True

    def __init__(self, path: str | Path):
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

    def count(self, text: str) -> int:
        return len(self._tok.encode(text, add_special_tokens=False).ids)


class ServerTokenizer(Tokenizer):
    """POST {base}/tokenize over one kept-alive connection (used before the run, never during it)."""
    mode, exact = "server", True

    def __init__(self, base_url: str, timeout_s: float = 5.0):
        u = urlsplit(base_url.rstrip("/").removesuffix("/v1"))
        self._host, self._port = u.hostname or "127.0.0.1", u.port or (443 if u.scheme == "https" else 80)
        self._https, self._timeout_s = u.scheme == "https", timeout_s
        self._conn: http.client.HTTPConnection | None = None
        self.detail = f"{u.scheme}://{self._host}:{self._port}/tokenize"
        self.shape = None
        for shape in ("vllm", "llamacpp"):  # probe: the first shape that answers with tokens wins
            self.shape = shape
            try:
                self.count("probe")
                break
            except TokenizerError:
                self.shape = None
        if self.shape is None:
            raise TokenizerError(f"{self.detail} did not answer a tokenize request (vLLM or llama.cpp shape)")
        self.detail += f" ({self.shape} shape)"

    def _post(self, body: bytes) -> tuple[int, bytes]:
        for attempt in (0, 1):  # one reconnect if the kept-alive connection was closed
            if self._conn is None:
                cls = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
                self._conn = cls(self._host, self._port, timeout=self._timeout_s)
            try:
                self._conn.request("POST", "/tokenize", body, {"Content-Type": "application/json"})
                r = self._conn.getresponse()
                return r.status, r.read()
            except (OSError, http.client.HTTPException) as e:
                self._conn.close()
                self._conn = None
                if attempt:
                    raise TokenizerError(f"{self.detail}: {type(e).__name__}: {e}") from None
        raise AssertionError("unreachable")

    def count(self, text: str) -> int:
        body = ({"prompt": text, "add_special_tokens": False} if self.shape == "vllm" else {"content": text})
        status, data = self._post(orjson.dumps(body))
        try:
            obj = orjson.loads(data) if status == 200 else None
        except orjson.JSONDecodeError:
            obj = None
        if not isinstance(obj, dict) or not isinstance(obj.get("count", obj.get("tokens")), (int, list)):
            raise TokenizerError(f"{self.detail}: HTTP {status}, not a tokenize answer: {data[:120]!r}")
        c = obj.get("count")
        return c if isinstance(c, int) else len(obj["tokens"])


def resolve(mode: str, url: str | None, tokenizer_file: str | None) -> tuple[Tokenizer, str | None]:
    """The tokenizer for a run, and a warning to show (stderr and manifest) when auto fell back."""
    if mode == "approximate":
        return ApproximateTokenizer(), None
    if mode == "local":
        return LocalTokenizer(tokenizer_file or ""), None
    if url is None:
        if mode == "server":
            raise TokenizerError("prompt.tokenizer = \"server\" needs a target (--url)")
        return ApproximateTokenizer(), None
    try:
        return ServerTokenizer(url), None
    except TokenizerError as e:
        if mode == "server":
            raise
        return ApproximateTokenizer(), (f"the target has no usable /tokenize ({e}); prompt lengths are "
                                        f"APPROXIMATE (a token = a whitespace-separated word): compare "
                                        f"planned_prompt_tokens with prompt_tokens in requests.parquet")


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
    _ws: bool | None = field(default=None, repr=False)

    def text(self, n: int, rng: np.random.Generator) -> str:
        """Text of exactly n tokens under self.tokenizer (round-trip checked when it is exact)."""
        if n <= 0:
            return ""
        if self._ws is None:
            self._ws = self.tokenizer.whitespace_exact()
        words = word_walk(rng, n)
        self.made += 1
        if self._ws:
            text = " ".join(words)
            if self.made <= FULL_CHECKS or self.made % CHECK_EVERY == 0:
                self.check(text, n)
        else:
            text = self._fit(n, words, rng)
            self.check(text, n)
        return text

    def check(self, text: str, n: int) -> None:
        if not self.tokenizer.exact:
            return
        c = self.tokenizer.count(text)
        self.checked += 1
        self.exact += c == n
        self.max_abs_error = max(self.max_abs_error, abs(c - n))

    def _fit(self, n: int, words: list[str], rng: np.random.Generator) -> str:
        count = self.tokenizer.count
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
        have = count(text)
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
        return text

    def summary(self) -> dict:
        return {"prompts": self.made, "checked": self.checked, "exact": self.exact,
                "max_abs_error": self.max_abs_error}


def synthetic_text(n_tokens: int, rng: np.random.Generator) -> str:
    """n distinct words (n tokens under the simulator's whitespace rule); kept for the skeleton's callers."""
    return " ".join(word_walk(rng, n_tokens)) if n_tokens > 0 else ""
