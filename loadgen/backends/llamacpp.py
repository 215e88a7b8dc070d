"""llama.cpp server's native `/completion` with `stream: true` (SSE, through backends/sse.py).

Stream contract (tools/server/README.md of llama.cpp):
- each event is a JSON object; a token-bearing chunk has non-empty `content`; `{"error": ...}` is a
  stream error; the last object has `stop: true` and `timings` {prompt_n, prompt_ms, predicted_n,
  predicted_ms}; `tokens_predicted` (or timings.predicted_n) is the output token count.
Server timings written to the row (ms): server_prefill_ms = timings.prompt_ms,
server_decode_ms = timings.predicted_ms; llama.cpp reports no queue time (server_queue_ms stays null,
analysis/decompose.py derives it). Tokens per chunk follow the rule of backends/openai.py.
"""
from __future__ import annotations

import orjson

from loadgen.backends.openai import _num, spread_tokens
from loadgen.backends.sse import SSEParser
from loadgen.recorder import OK, STREAM_ERROR, Row


class LlamaCppBackend:
    path = "/completion"

    def __init__(self, api: str, model: str, extra_body: dict):
        # One native endpoint: `api` (completions|chat) is accepted and the prompt is sent as is.
        self.api, self.model, self.extra_body = api, model, extra_body

    def body(self, prompt: str, max_tokens: int) -> bytes:
        payload = {"prompt": prompt, "n_predict": max_tokens, "stream": True, **self.extra_body}
        return orjson.dumps(payload)

    def interpret(self, row: Row, read_t_ns, reads: list[bytes]) -> None:
        parser = SSEParser()
        chunk_t: list[int] = []
        lengths: list[int] = []
        state = {"final": None, "error": None, "malformed": None}
        for t, data in zip(read_t_ns, reads):
            for ev in parser.feed(data):
                self._event(ev.data, t, chunk_t, lengths, state)
        if read_t_ns:
            for ev in parser.close():
                self._event(ev.data, read_t_ns[-1], chunk_t, lengths, state)
        final = state["final"] or {}
        timings = final.get("timings") if isinstance(final.get("timings"), dict) else {}
        count = final.get("tokens_predicted", timings.get("predicted_n"))
        count = int(count) if isinstance(count, int) and not isinstance(count, bool) else None
        prompt_n = final.get("tokens_evaluated", timings.get("prompt_n"))
        row.prompt_tokens = prompt_n if isinstance(prompt_n, int) else None
        row.chunk_t_ns.extend(chunk_t)
        row.chunk_tokens.extend(spread_tokens(lengths, count))
        row.n_chunks = len(chunk_t)
        row.output_tokens = count if count is not None else len(chunk_t)
        if chunk_t:
            row.first_token_ns, row.last_token_ns = chunk_t[0], chunk_t[-1]
        row.server_prefill_ms = _num(timings.get("prompt_ms"))
        row.server_decode_ms = _num(timings.get("predicted_ms"))
        if state["error"] is not None:
            row.fail(STREAM_ERROR, "error_event", state["error"])
        elif state["malformed"] is not None:
            row.fail(STREAM_ERROR, "malformed_chunk", state["malformed"])
        elif not final.get("stop"):
            row.fail(STREAM_ERROR, "incomplete_stream", "stream closed before the stop: true event")
        elif row.outcome is None:
            row.outcome = OK

    @staticmethod
    def _event(data: bytes, t: int, chunk_t: list, lengths: list, state: dict) -> None:
        if data == b"[DONE]":
            return
        try:
            obj = orjson.loads(data)
        except orjson.JSONDecodeError:
            state["malformed"] = state["malformed"] or f"chunk is not JSON: {data[:120]!r}"
            return
        if not isinstance(obj, dict):
            state["malformed"] = state["malformed"] or f"chunk is not a JSON object: {data[:120]!r}"
            return
        if "error" in obj:
            err = obj["error"]
            state["error"] = (err.get("message") if isinstance(err, dict) else None) or str(err)
            return
        text = obj.get("content")
        if text:
            chunk_t.append(t)
            lengths.append(len(text))
        if obj.get("stop"):
            state["final"] = obj
