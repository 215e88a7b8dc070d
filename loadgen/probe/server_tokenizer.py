"""Counting prompt tokens with the target's own tokenizer, over its tokenize endpoint.

Shapes (request -> answer), found by probing, never by guessing from the URL or the server's name:
    vllm      vLLM, SGLang, loadgen's simulator: POST /tokenize {"model", "prompt", "add_special_tokens"}
              -> {"count", "tokens", "max_model_len"}; chat: {"model", "messages",
              "add_generation_prompt": true} (the chat template applied, as chat completions count it)
    llamacpp  llama.cpp's llama-server: POST /tokenize {"content", "add_special"} -> {"tokens": [...]}
              (sent the vLLM shape it answers {"tokens": []}); chat: POST /apply-template {"messages"}
              -> {"prompt"}, then that text tokenized with add_special and parse_special
    tgi       Text Generation Inference: POST /tokenize {"inputs"} -> [{"id", "text", ...}, ...]
              (its special tokens always added; no way to apply the chat template: chat is not exact)
The probe sends two texts (the second longer) in each shape, in the order above, and takes the first
shape whose counts are plausible: non-zero for non-empty text, at most a few tokens beyond one per byte,
and larger for the longer text. An empty or implausible answer is never taken as a count.

Counts: `count(text)` counts text alone (no special tokens; for parts of a prompt), `count_prompt(text)`
counts it the way the server will count the request's whole prompt through `api` (completions: with
BOS/special tokens; chat: one user message with the template), `count_messages(messages)` a whole
message list so (chat: system prompt, history and the new user message in one /tokenize `messages` call,
or llama.cpp's /apply-template then /tokenize; completions: the contents joined by newlines).
`prompt_exact` is False where the server cannot count that (TGI chat); the run then says its lengths are not exact.
Every request has a total deadline (probe_http.py); the probe says on stderr what it waits for.
"""
from __future__ import annotations

import ssl
from typing import TextIO

import orjson

from loadgen.client.backends import make_backend
from loadgen.client.recorder import Row
from loadgen.config.credentials import clipped
from loadgen.config.options import EVENT_APIS, takes_messages
from loadgen.probe.probe_http import Probe, ProbeError
from loadgen.errors import TokenizerError
from loadgen.plan.prompts import ApproximateTokenizer, LocalTokenizer, Tokenizer, message_text

SHAPES = ("vllm", "llamacpp", "tgi")
PROBE_TIMEOUT_S = 5.0
_PROBE_TEXTS = ("kalo mine rusa tevo", "kalo mine rusa tevo zupe diha jifu bevo")


# Tokens a chat template may add per message (role headers, end markers) and once (BOS, a default system
# prompt, the generation prompt), for the plausibility of a message-list count.
TEMPLATE_SLACK_PER_MESSAGE, TEMPLATE_SLACK = 32, 256


def plausible(text: str, n: int | None, slack: int = 16) -> bool:
    # A real tokenizer gives >= 1 token for non-empty text and at most ~1 per byte (byte fallback) plus
    # a few special tokens (slack).
    return n is not None and (n >= 1 if text.strip() else n >= 0) and n <= len(text.encode()) + slack


def tokens_in(shape: str, status: int, data: bytes) -> int | None:
    """The token count in a tokenize answer of `shape`; None when it is not one."""
    if status != 200:
        return None
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    if shape == "tgi":
        return len(obj) if isinstance(obj, list) else None
    if not isinstance(obj, dict):
        return None
    tokens, count = obj.get("tokens"), obj.get("count")
    if shape == "vllm" and isinstance(count, int) and not isinstance(count, bool):
        if isinstance(tokens, list) and len(tokens) != count:
            return None  # self-contradicting answer
        return count
    return len(tokens) if isinstance(tokens, list) else None


class ServerTokenizer(Tokenizer):
    mode, exact = "server", True

    def __init__(self, base_url: str, api: str = "completions", model: str = "",
                 timeout_s: float = PROBE_TIMEOUT_S, progress: TextIO | None = None,
                 headers: dict[str, str] | None = None, tls: ssl.SSLContext | bool = True):
        self._probe = Probe(base_url, timeout_s, headers, tls)  # the run's headers and TLS choice
        self.api, self.model = api, model
        # the workload's tools (plan/structured.py): a chat template renders them into the prompt, so vLLM's
        # /tokenize is sent them too (its `tools` field) and a count is the prompt the server builds
        self.tools: list | None = None
        self.detail = f"{self._probe.base}/tokenize"
        self.shape = ""  # the request shape being tried; the one the server answered once __init__ returns
        # tokens the API's endpoint counts beyond the chat template (event-stream APIs: _endpoint_offset)
        self.endpoint_offset = 0
        self.prompt_exact = True
        if progress is not None:
            progress.write(f"probing {self.detail} for the server's tokenizer (vLLM/SGLang, llama.cpp, TGI "
                           f"request shapes; at most {timeout_s:g} s per request)\n")
            progress.flush()
        tried, found = [], None
        for shape in SHAPES:
            self.shape = shape
            try:
                counts = [self.count(t) for t in _PROBE_TEXTS]
            except TokenizerError as e:
                tried.append(f"{shape}: {e}")
                if isinstance(e.__cause__, ProbeError) and e.__cause__.unreachable:
                    break  # no answer at all: another shape will not fare better
                continue
            if counts[1] > counts[0]:
                found = shape
                break
            tried.append(f"{shape}: implausible counts {counts} for texts of {[len(t) for t in _PROBE_TEXTS]} chars")
        if found is None:
            self._probe.close()
            raise TokenizerError(f"{self.detail} gave no usable token count in any known request shape ("
                                 + "; ".join(tried) + ")")
        self.shape = found
        self.detail += f" ({self.shape} shape)"
        if takes_messages(api):
            self.prompt_exact = self._chat_countable()
            if not self.prompt_exact:
                self.detail += "; chat template tokens NOT counted (the server cannot apply its template here)"
        if api in EVENT_APIS and self.prompt_exact:
            self.endpoint_offset = self._endpoint_offset()

    def _endpoint_offset(self) -> int:
        """What the event-stream API's endpoint counts beyond the chat template's count of the same
        messages, asked once with a 1-token request (its usage's input count): vLLM 0.32's /v1/responses
        adds BOS to a template that already has one (+1). 0, with a note in `detail`, when it cannot say."""
        messages = [{"role": "user", "content": _PROBE_TEXTS[0]}]
        backend = make_backend("openai", self.api, self.model, {})
        try:
            status, _, data = self._probe.request("POST", backend.path, backend.body_messages(messages, 1))
            counted = self.count_messages(messages)
        except (ProbeError, TokenizerError) as e:
            self.detail += f"; {backend.path} not probed for its prompt count ({e})"
            return 0
        row = Row(0, "tokenizer-probe", 0, counted, 1)
        if status == 200:
            backend.interpret(row, [0], [data])
        if row.prompt_tokens is None:
            self.detail += (f"; {backend.path} not probed for its prompt count (HTTP {status}: "
                            f"{clipped(data, 120)!r})")
            return 0
        offset = row.prompt_tokens - counted
        if offset:
            self.detail += f"; {backend.path} counts {offset:+d} token(s) beside the chat template (probed)"
        return offset

    def _chat_countable(self) -> bool:
        if self.shape == "tgi":
            return False  # TGI's tokenize cannot apply the chat template
        try:
            n = self.count_prompt(_PROBE_TEXTS[0])
        except TokenizerError:
            return False
        return n >= self.count(_PROBE_TEXTS[0])

    def _ask(self, path: str, body: dict) -> tuple[int, bytes]:
        try:
            status, _, data = self._probe.request("POST", path, orjson.dumps(body))
        except ProbeError as e:
            raise TokenizerError(str(e)) from e
        return status, data

    def _count(self, body: dict, text: str, slack: int = 16) -> int:
        status, data = self._ask("/tokenize", body)
        n = tokens_in(self.shape, status, data)
        if n is None or not plausible(text, n, slack):
            raise TokenizerError(f"{self.detail}: HTTP {status}, not a plausible tokenize answer for "
                                 f"{len(text)} chars: {clipped(data, 120)!r}")
        return n

    def _body(self, text: str, special: bool) -> dict:
        if self.shape == "vllm":
            return {**({"model": self.model} if self.model else {}), "prompt": text, "add_special_tokens": special}
        if self.shape == "llamacpp":
            return {"content": text, "add_special": special}
        return {"inputs": text}

    def count(self, text: str) -> int:
        return self._count(self._body(text, False), text)

    def count_prompt(self, text: str) -> int:
        if not takes_messages(self.api):
            return self._count(self._body(text, True), text)
        if not self.prompt_exact:
            return self.count(text)
        return self.count_messages([{"role": "user", "content": text}])

    def count_messages(self, messages: list[dict[str, str]]) -> int:
        text = "\n".join(map(message_text, messages))  # backends.base.joined: a completions prompt
        if not takes_messages(self.api):
            return self._count(self._body(text, True), text)
        if not self.prompt_exact:
            return self.count(text)  # TGI: the template's tokens cannot be counted (the verdict says so)
        return self._count_template(messages, text) + self.endpoint_offset

    def _count_template(self, messages: list[dict[str, str]], text: str) -> int:
        slack = TEMPLATE_SLACK + TEMPLATE_SLACK_PER_MESSAGE * len(messages)
        if self.shape == "vllm":
            body = {**({"model": self.model} if self.model else {}), "messages": messages,
                    "add_generation_prompt": True, **({"tools": self.tools} if self.tools else {})}
            return self._count(body, text, slack)
        status, data = self._ask("/apply-template", {"messages": messages})
        try:
            templated = orjson.loads(data).get("prompt") if status == 200 else None
        except (orjson.JSONDecodeError, AttributeError):
            templated = None
        if not isinstance(templated, str):
            raise TokenizerError(f"{self._probe.base}/apply-template: HTTP {status}, no templated prompt: "
                                 f"{clipped(data, 120)!r}")
        return self._count({"content": templated, "add_special": True, "parse_special": True}, templated, slack)

    def describe(self) -> dict:
        return {**super().describe(), "shape": self.shape, "prompt_exact": self.prompt_exact,
                "endpoint_offset": self.endpoint_offset}

def resolve(mode: str, url: str | None, tokenizer_file: str | None, api: str = "completions", model: str = "",
            progress=None, headers: dict[str, str] | None = None,
            tls: ssl.SSLContext | bool = True) -> tuple[Tokenizer, str | None]:
    """The tokenizer for a run, and a warning to show (stderr and manifest) when auto fell back."""
    if mode == "approximate":
        return ApproximateTokenizer(), None
    if mode == "local":
        return LocalTokenizer(tokenizer_file or "", api), None
    if url is None:
        if mode == "server":
            raise TokenizerError("prompt.tokenizer = \"server\" needs a target (--url)")
        return ApproximateTokenizer(), None
    try:
        return ServerTokenizer(url, api, model, progress=progress, headers=headers, tls=tls), None
    except TokenizerError as e:
        if mode == "server":
            raise
        return ApproximateTokenizer(), (f"the target has no usable /tokenize ({e}); prompt lengths are "
                                        f"APPROXIMATE (a token = a whitespace-separated word): compare "
                                        f"planned_prompt_tokens with prompt_tokens in requests.parquet")
