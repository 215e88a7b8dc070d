"""Ollama's native `/api/generate` and `/api/chat`: NDJSON, one JSON object per line.

Stream contract (https://github.com/ollama/ollama/blob/main/docs/api.md):
- every line is an object; a token-bearing chunk has non-empty `response` (generate) or
  `message.content` (chat); `{"error": "..."}` is a stream error;
- the last object has `done: true` and the durations, all in ns: `total_duration` (request received
  -> response finished), `load_duration` (model load), `prompt_eval_duration` (prefill of
  `prompt_eval_count` tokens), `eval_duration` (decode of `eval_count` tokens).
Server timings written to the row (ms):
  server_prefill_ms = prompt_eval_duration, server_decode_ms = eval_duration,
  server_queue_ms   = total_duration - prompt_eval_duration - eval_duration (waiting for the runner,
                      model load included; clipped at 0).
Tokens per chunk follow the rule of backends/stream.py with N = `eval_count`. A stream is
ok only when its `done: true` object arrived.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson

from loadgen.client.backends.base import Messages, messages_payload, user
from loadgen.client.backends.sse import MAX_LINE_BYTES
from loadgen.client.backends.stream import Stream, as_int
from loadgen.client.recorder import Row

PATHS = {"completions": "/api/generate", "chat": "/api/chat"}


class OllamaBackend:
    event_end, preamble_events = b"\n", 0   # NDJSON: one object per line, the first already with output
    def __init__(self, api: str, model: str, extra_body: dict[str, Any]):
        self.api, self.model, self.extra_body = api, model, extra_body
        self.path = PATHS[api]

    def body(self, prompt: str, max_tokens: int, *, model: str | None = None, priority: int | None = None) -> bytes:
        return self.body_messages(user(prompt), max_tokens, model=model, priority=priority)

    def body_messages(self, messages: Messages, max_tokens: int, *, model: str | None = None,
                      priority: int | None = None) -> bytes:
        if priority is not None:
            raise ValueError("Ollama's API has no priority field")
        payload = messages_payload(self.api, model or self.model, messages)
        options = {"num_predict": max_tokens, **self.extra_body.get("options", {})}
        payload.update(stream=True, **{k: v for k, v in self.extra_body.items() if k != "options"})
        payload["options"] = options
        return orjson.dumps(payload)

    def reply_text(self, reads: list[bytes]) -> str:
        return "".join(self._parse([0] * len(reads), reads)[0].texts)

    def _parse(self, read_t_ns: Sequence[int], reads: list[bytes]) -> tuple[Stream, dict[str, Any]]:
        stream = Stream()
        final: dict[str, Any] = {}
        pending: list[bytes] = []  # reads of the line still open: joined once (a huge line stays linear)
        size = dropped = 0
        skipping = False  # inside a dropped line, until its end
        for t, data in zip(read_t_ns, reads):
            if skipping:
                if b"\n" not in data:
                    continue
                skipping, data = False, data[data.index(b"\n") + 1:]
            if b"\n" not in data:
                pending.append(data)
                size += len(data)
                if size > MAX_LINE_BYTES:
                    pending, size, dropped, skipping = [], 0, dropped + 1, True
                continue
            *lines, rest = (b"".join(pending) + data).split(b"\n")
            for line in lines:
                final = self._line(line, t, stream) or final
            pending, size = [rest], len(rest)
        buf = b"".join(pending)
        if buf.strip() and read_t_ns:
            final = self._line(buf, read_t_ns[-1], stream) or final
        stream.lines_dropped(dropped)
        return stream, final

    def interpret(self, row: Row, read_t_ns: Sequence[int], reads: list[bytes]) -> None:
        stream, final = self._parse(read_t_ns, reads)
        stream.fill(row, as_int(final.get("eval_count")), as_int(final.get("prompt_eval_count")),
                    bool(final.get("done")), "the done: true object")
        total, prompt, gen = (as_int(final.get(k)) for k in ("total_duration", "prompt_eval_duration",
                                                               "eval_duration"))
        row.server_prefill_ms = None if prompt is None else prompt / 1e6
        row.server_decode_ms = None if gen is None else gen / 1e6
        if total is not None and prompt is not None and gen is not None:
            row.server_queue_ms = max(0, total - prompt - gen) / 1e6

    @staticmethod
    def _line(line: bytes, t: int, stream: Stream) -> dict[str, Any] | None:
        """The final (done: true) object, else None."""
        line = line.strip()
        if not line:
            return None
        obj = stream.decode(line)
        if obj is None:
            return None
        text = obj.get("response")
        if text is None:
            text = (obj.get("message") or {}).get("content")
        stream.token(t, text)
        return obj if obj.get("done") else None
