"""OpenAI-compatible `/v1/completions` and `/v1/chat/completions` with `stream: true` (vLLM, SGLang,
llama.cpp's server, TGI's Messages API, Ollama's /v1).

Token counting rule, per request (documented here, used by every report):
- a chunk is an SSE event whose choice carries non-empty text (`text`, or `delta.content`, or
  `delta.reasoning_content`); chat's role-only first chunk is not a token;
- when the final usage chunk gives `completion_tokens` = N and there are C chunks: N == C gives one
  token per chunk; otherwise each chunk gets one token and the remaining N - C are spread over the
  chunks in proportion to their text length (largest remainder, so the sum is exactly N); when N < C
  the N tokens are spread by length alone and some chunks carry 0;
- without usage, each chunk counts as one token, and output_tokens = C.
A stream is ok when it ends with `data: [DONE]` or a choice with a `finish_reason`; an `{"error": ...}`
event inside a 200 stream or a chunk that is not JSON makes it a stream_error (tokens seen are kept).
vLLM's per-request `metrics` object (with --enable-per-request-metrics) fills server_*_ms.

Fast path (same result, no per-chunk JSON parsing): when the stream is LF-framed one-line `data: {...}`
events, ends with a usage chunk and `[DONE]`, and usage.completion_tokens equals the number of content
events (one token each), only the usage chunk and the first and last content events are parsed; every
other event is checked by its framing (`data: {` ... `}`, no `"error"`). Anything else, or any doubt,
takes the full parse above. Chunk times are the stamp of the read that completed each event.
"""
from __future__ import annotations

import numpy as np
import orjson

from loadgen.backends.sse import SSEParser
from loadgen.recorder import OK, STREAM_ERROR, Row

PATHS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}


class OpenAIBackend:
    def __init__(self, api: str, model: str, extra_body: dict):
        self.api, self.model, self.extra_body = api, model, extra_body
        self.path = PATHS[api]

    def body(self, prompt: str, max_tokens: int) -> bytes:
        if self.api == "chat":
            payload = {"model": self.model, "messages": [{"role": "user", "content": prompt}]}
        else:
            payload = {"model": self.model, "prompt": prompt}
        payload.update(max_tokens=max_tokens, stream=True, stream_options={"include_usage": True})
        payload.update(self.extra_body)
        return orjson.dumps(payload)

    def interpret(self, row: Row, read_t_ns, reads: list[bytes]) -> None:
        if not self._interpret_fast(row, read_t_ns, reads):
            self._interpret_full(row, read_t_ns, reads)

    def _interpret_fast(self, row: Row, read_t_ns, reads: list[bytes]) -> bool:
        if not reads:
            return False
        body = b"".join(reads)
        ends = [d.count(b"\n\n") for d in reads]
        if b"\r" in body or sum(ends) != body.count(b"\n\n") or not body.endswith(b"\n\n"):
            return False  # CR framing, or a blank line split across two reads: the full parser handles it
        events = body.split(b"\n\n")
        events.pop()
        if len(events) < 3 or events[-1] != b"data: [DONE]":
            return False
        content = events[:-2]
        for e in content:
            if not (e.startswith(b"data: {") and e.endswith(b"}")) or b"\n" in e or b'"error"' in e:
                return False
        try:
            tail = orjson.loads(events[-2][6:])
            first = orjson.loads(content[0][6:])
        except (orjson.JSONDecodeError, IndexError):
            return False
        if not isinstance(tail, dict) or not isinstance(first, dict):
            return False
        state = {"usage": None, "metrics": None, "ended": False, "error": None, "malformed": None}
        skip = 0
        probe: list = []
        self._choices(first, 0, probe, [], state)
        if not probe:  # chat's role-only first chunk: not a token
            skip, content = 1, content[1:]
            if not content:
                return False
        usage = tail.get("usage")
        if not isinstance(usage, dict) or tail.get("choices") or usage.get("completion_tokens") != len(content):
            return False
        for e in (content[0], content[-1]):
            try:
                obj = orjson.loads(e[6:])
            except orjson.JSONDecodeError:
                return False
            probe = []
            self._choices(obj, 0, probe, [], state)
            if len(probe) != 1:
                return False
        if not state["ended"]:
            return False
        t = np.repeat(np.asarray(read_t_ns, dtype=np.int64), ends)[skip:skip + len(content)]
        row.prompt_tokens = usage.get("prompt_tokens")
        row.chunk_t_ns.frombytes(t.tobytes())
        row.chunk_tokens.extend([1] * len(content))
        row.n_chunks = row.output_tokens = len(content)
        row.first_token_ns, row.last_token_ns = int(t[0]), int(t[-1])
        m = tail.get("metrics")
        if isinstance(m, dict):
            row.server_queue_ms = _num(m.get("queue_time_ms"))
            row.server_prefill_ms = _num(m.get("time_to_first_token_ms"))
            row.server_decode_ms = _num(m.get("generation_time_ms"))
        if row.outcome is None:
            row.outcome = OK
        return True

    def _interpret_full(self, row: Row, read_t_ns, reads: list[bytes]) -> None:
        parser = SSEParser()
        chunk_t: list[int] = []
        lengths: list[int] = []
        state = {"usage": None, "metrics": None, "ended": False, "error": None, "malformed": None}
        for t, data in zip(read_t_ns, reads):
            for ev in parser.feed(data):
                self._event(ev.data, t, chunk_t, lengths, state)
        if read_t_ns:
            for ev in parser.close():
                self._event(ev.data, read_t_ns[-1], chunk_t, lengths, state)
        usage = state["usage"] or {}
        completion = usage.get("completion_tokens")
        row.prompt_tokens = usage.get("prompt_tokens")
        row.chunk_t_ns.extend(chunk_t)
        row.chunk_tokens.extend(spread_tokens(lengths, completion))
        row.n_chunks = len(chunk_t)
        row.output_tokens = completion if completion is not None else len(chunk_t)
        if chunk_t:
            row.first_token_ns, row.last_token_ns = chunk_t[0], chunk_t[-1]
        m = state["metrics"]
        if isinstance(m, dict):
            row.server_queue_ms = _num(m.get("queue_time_ms"))
            row.server_prefill_ms = _num(m.get("time_to_first_token_ms"))
            row.server_decode_ms = _num(m.get("generation_time_ms"))
        if state["error"] is not None:
            row.fail(STREAM_ERROR, "error_event", state["error"])
        elif state["malformed"] is not None:
            row.fail(STREAM_ERROR, "malformed_chunk", state["malformed"])
        elif not state["ended"]:
            row.fail(STREAM_ERROR, "incomplete_stream", "stream closed before [DONE] or a finish_reason")
        elif row.outcome is None:
            row.outcome = OK

    def _event(self, data: bytes, t: int, chunk_t: list, lengths: list, state: dict) -> None:
        if data == b"[DONE]":
            state["ended"] = True
            return
        try:
            obj = orjson.loads(data)
        except orjson.JSONDecodeError:
            if state["malformed"] is None:
                state["malformed"] = f"chunk is not JSON: {data[:120]!r}"
            return
        if not isinstance(obj, dict):
            state["malformed"] = state["malformed"] or f"chunk is not a JSON object: {data[:120]!r}"
            return
        if "error" in obj:
            err = obj["error"]
            state["error"] = (err.get("message") if isinstance(err, dict) else None) or str(err)
            return
        if obj.get("usage"):
            state["usage"] = obj["usage"]
        if obj.get("metrics") is not None:
            state["metrics"] = obj["metrics"]
        self._choices(obj, t, chunk_t, lengths, state)

    @staticmethod
    def _choices(obj: dict, t: int, chunk_t: list, lengths: list, state: dict) -> None:
        for choice in obj.get("choices") or ():
            text = choice.get("text")
            if text is None:
                delta = choice.get("delta") or {}
                text = delta.get("content") or delta.get("reasoning_content") or delta.get("reasoning")
            if text:
                chunk_t.append(t)
                lengths.append(len(text))
            if choice.get("finish_reason"):
                state["ended"] = True


def spread_tokens(lengths: list[int], total: int | None) -> list[int]:
    """Tokens per chunk under the rule in the module comment."""
    c = len(lengths)
    if total is None or total == c or c == 0:
        return [1] * c
    base = np.ones(c, dtype=np.int64) if total > c else np.zeros(c, dtype=np.int64)
    rest = total - int(base.sum())
    weights = np.asarray(lengths, dtype=np.float64)
    if weights.sum() <= 0:
        weights = np.ones(c)
    share = weights / weights.sum() * rest
    add = np.floor(share).astype(np.int64)
    left = rest - int(add.sum())
    if left:
        add[np.argsort(-(share - add), kind="stable")[:left]] += 1
    return (base + add).tolist()


def _num(v) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None
