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
Tokens per chunk follow the rule of backends/openai.py with `eval_count` as the usage total. A stream is
ok only when its `done: true` object arrived.
"""
from __future__ import annotations

import orjson

from loadgen.backends.openai import spread_tokens
from loadgen.recorder import OK, STREAM_ERROR, Row

PATHS = {"completions": "/api/generate", "chat": "/api/chat"}


class OllamaBackend:
    def __init__(self, api: str, model: str, extra_body: dict):
        self.api, self.model, self.extra_body = api, model, extra_body
        self.path = PATHS[api]

    def body(self, prompt: str, max_tokens: int) -> bytes:
        if self.api == "chat":
            payload = {"model": self.model, "messages": [{"role": "user", "content": prompt}]}
        else:
            payload = {"model": self.model, "prompt": prompt}
        options = {"num_predict": max_tokens, **self.extra_body.get("options", {})}
        payload.update(stream=True, **{k: v for k, v in self.extra_body.items() if k != "options"})
        payload["options"] = options
        return orjson.dumps(payload)

    def interpret(self, row: Row, read_t_ns, reads: list[bytes]) -> None:
        chunk_t: list[int] = []
        lengths: list[int] = []
        final: dict | None = None
        error = malformed = None
        buf = b""
        for t, data in zip(read_t_ns, reads):
            buf += data
            *lines, buf = buf.split(b"\n")
            for line in lines:
                final, error, malformed = self._line(line, t, chunk_t, lengths, final, error, malformed)
        if buf.strip() and read_t_ns:
            final, error, malformed = self._line(buf, read_t_ns[-1], chunk_t, lengths, final, error, malformed)
        final = final or {}
        count = _int(final.get("eval_count"))
        row.prompt_tokens = _int(final.get("prompt_eval_count"))
        row.chunk_t_ns.extend(chunk_t)
        row.chunk_tokens.extend(spread_tokens(lengths, count))
        row.n_chunks = len(chunk_t)
        row.output_tokens = count if count is not None else len(chunk_t)
        if chunk_t:
            row.first_token_ns, row.last_token_ns = chunk_t[0], chunk_t[-1]
        total, prompt, gen = (_int(final.get(k)) for k in ("total_duration", "prompt_eval_duration",
                                                             "eval_duration"))
        row.server_prefill_ms = None if prompt is None else prompt / 1e6
        row.server_decode_ms = None if gen is None else gen / 1e6
        if None not in (total, prompt, gen):
            row.server_queue_ms = max(0, total - prompt - gen) / 1e6
        if error is not None:
            row.fail(STREAM_ERROR, "error_event", error)
        elif malformed is not None:
            row.fail(STREAM_ERROR, "malformed_chunk", malformed)
        elif not final.get("done"):
            row.fail(STREAM_ERROR, "incomplete_stream", "stream closed before the done: true object")
        elif row.outcome is None:
            row.outcome = OK

    @staticmethod
    def _line(line: bytes, t: int, chunk_t: list, lengths: list, final, error, malformed):
        line = line.strip()
        if not line:
            return final, error, malformed
        try:
            obj = orjson.loads(line)
        except orjson.JSONDecodeError:
            return final, error, malformed or f"line is not JSON: {line[:120]!r}"
        if not isinstance(obj, dict):
            return final, error, malformed or f"line is not a JSON object: {line[:120]!r}"
        if "error" in obj:
            return final, error or str(obj["error"]), malformed
        text = obj.get("response")
        if text is None:
            text = (obj.get("message") or {}).get("content")
        if text:
            chunk_t.append(t)
            lengths.append(len(text))
        if obj.get("done"):
            final = obj
        return final, error, malformed


def _int(v) -> int | None:
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None
