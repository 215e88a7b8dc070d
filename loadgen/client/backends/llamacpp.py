"""llama.cpp server's native `/completion` with `stream: true` (SSE, through backends/sse.py).

Stream contract (tools/server/README.md of llama.cpp):
- each event is a JSON object; a token-bearing chunk has non-empty `content`; `{"error": ...}` is a
  stream error; the last object has `stop: true` and `timings` {prompt_n, prompt_ms, predicted_n,
  predicted_ms}; `tokens_predicted` (or timings.predicted_n) is the output token count.
Server timings written to the row (ms): server_prefill_ms = timings.prompt_ms,
server_decode_ms = timings.predicted_ms; llama.cpp reports no queue time (server_queue_ms stays null,
analysis/decompose.py derives it). Tokens per chunk follow the rule of backends/stream.py.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson

from loadgen.client.backends.base import Messages, joined
from loadgen.client.backends.stream import Stream, as_float, as_int, sse_events
from loadgen.client.recorder import Row


class LlamaCppBackend:
    path = "/completion"
    event_end, preamble_events = b"\n\n", 0

    def __init__(self, api: str, model: str, extra_body: dict[str, Any]):
        # One native endpoint: `api` (completions|chat) is accepted and the prompt is sent as is.
        self.api, self.model, self.extra_body = api, model, extra_body

    def body(self, prompt: str, max_tokens: int, *, model: str | None = None, priority: int | None = None) -> bytes:
        if model is not None or priority is not None:
            raise ValueError("llama.cpp's /completion has no model or priority field")
        payload = {"prompt": prompt, "n_predict": max_tokens, "stream": True, **self.extra_body}
        return orjson.dumps(payload)

    def body_messages(self, messages: Messages, max_tokens: int, *, model: str | None = None,
                      priority: int | None = None) -> bytes:
        return self.body(joined(messages), max_tokens, model=model, priority=priority)  # one prompt text

    def reply_text(self, reads: list[bytes]) -> str:
        return "".join(self._parse([0] * len(reads), reads)[0].texts)

    def _parse(self, read_t_ns: Sequence[int], reads: list[bytes]) -> tuple[Stream, dict[str, Any]]:
        stream = Stream()
        final: dict[str, Any] = {}
        for t, data in sse_events(read_t_ns, reads, stream):
            final = self._event(data, t, stream) or final
        return stream, final

    def interpret(self, row: Row, read_t_ns: Sequence[int], reads: list[bytes]) -> None:
        stream, final = self._parse(read_t_ns, reads)
        timings = final.get("timings")
        if not isinstance(timings, dict):
            timings = {}
        count = as_int(final.get("tokens_predicted", timings.get("predicted_n")))
        prompt_n = as_int(final.get("tokens_evaluated", timings.get("prompt_n")))
        stream.fill(row, count, prompt_n, bool(final.get("stop")), "the stop: true event")
        llamacpp_timings(row, timings)

    @staticmethod
    def _event(data: bytes, t: int, stream: Stream) -> dict[str, Any] | None:
        """The final (stop: true) object, else None."""
        if data == b"[DONE]":
            return None
        obj = stream.decode(data)
        if obj is None:
            return None
        stream.token(t, obj.get("content"))
        return obj if obj.get("stop") else None


def llamacpp_timings(row: Row, timings: dict[str, Any]) -> None:
    # prompt_ms: the prompt's processing (prefill, cached tokens excluded); predicted_ms: the decode.
    row.server_prefill_ms = as_float(timings.get("prompt_ms"))
    row.server_decode_ms = as_float(timings.get("predicted_ms"))
    cache_n = timings.get("cache_n")  # prompt tokens reused from the slot's cache (newer llama-server)
    if isinstance(cache_n, int) and not isinstance(cache_n, bool) and cache_n >= 0:
        row.cached_tokens = cache_n
