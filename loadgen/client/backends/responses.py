"""OpenAI's Responses API, `POST /v1/responses` with `stream: true` (vLLM, OpenAI, SGLang's and Ollama's
OpenAI-compatible servers).

Request: {"model", "input": the conversation as input messages ({"role", "content"}; the system prefix is
a "system" message, as chat sends it), "max_output_tokens", "stream": true, "store": false} plus the
workload's extra_body. `store: false`: a load generator never reads a response back, so the server keeps
none of them.

Stream contract (OpenAI's "Responses streaming events"; vLLM 0.32's serving_responses, recorded in
tests/data/vllm/responses_stream.json): SSE events `event: <type>` / `data: {"type": <type>, ...}`, no
`[DONE]`. `response.created` and `response.in_progress` come first and carry no output. Answer chunks:
`response.output_text.delta`, `response.refusal.delta` and `response.function_call_arguments.delta` (a
tool call's arguments), text in `delta`. Reasoning chunks: `response.reasoning_text.delta` (vLLM's and
open models' reasoning) and `response.reasoning_summary_text.delta` (OpenAI's summaries), text in `delta`.
Every other event (`output_item.added`, `content_part.added`, the `*.done` events that repeat the text
whole) carries no token. The stream ends with `response.completed` or `response.incomplete` (the model
stopped at max_output_tokens: OpenAI sends `response.incomplete`, vLLM `response.completed` with status
"incomplete"): both are a finished response; its `response.usage` gives output_tokens (N of the rule in
backends/stream.py), input_tokens (prompt_tokens), input_tokens_details.cached_tokens and
output_tokens_details.reasoning_tokens; `response.metrics` is vLLM's per-request metrics object
(--enable-per-request-metrics), as on chat. `response.failed` (its response.error.message) and an `error`
event (its message) are error events inside a 200 stream: a stream_error (tokens seen are kept); without
any end event the stream is incomplete.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson

from loadgen.client.backends.base import Messages, WithoutPriority
from loadgen.client.backends.openai import server_timings, usage_count
from loadgen.client.backends.stream import Stream, as_int, sse_events
from loadgen.client.recorder import Row
from loadgen.config.credentials import clipped

ANSWER_EVENTS = frozenset({"response.output_text.delta", "response.refusal.delta",
                           "response.function_call_arguments.delta"})
REASONING_EVENTS = frozenset({"response.reasoning_text.delta", "response.reasoning_summary_text.delta"})
END_EVENTS = frozenset({"response.completed", "response.incomplete"})
END_MARKER = "response.completed or response.incomplete"


class ResponsesBackend(WithoutPriority):
    path = "/v1/responses"
    # [abandon] after_tokens: events before the first delta (response.created, .in_progress,
    # .output_item.added, .content_part.added, as vLLM 0.32 sends them: tests/data/vllm/responses_stream.json)
    event_end, preamble_events = b"\n\n", 4

    def payload(self, messages: Messages, max_tokens: int, model: str) -> dict[str, Any]:
        return {"model": model, "input": messages, "max_output_tokens": max_tokens, "stream": True, "store": False,
                **self.extra_body}

    def reply_text(self, reads: list[bytes]) -> str:
        return "".join(self._parse([0] * len(reads), reads)[0].texts)

    def interpret(self, row: Row, read_t_ns: Sequence[int], reads: list[bytes]) -> None:
        stream, final = self._parse(read_t_ns, reads)
        usage = final.get("usage") if final is not None else None
        usage = usage if isinstance(usage, dict) else {}
        stream.fill(row, as_int(usage.get("output_tokens")), as_int(usage.get("input_tokens")), final is not None,
                    END_MARKER, usage_count(usage, "output_tokens_details", "reasoning_tokens"))
        row.cached_tokens = usage_count(usage, "input_tokens_details", "cached_tokens")
        if final is not None:
            server_timings(row, final.get("metrics"))

    @staticmethod
    def _parse(read_t_ns: Sequence[int], reads: list[bytes]) -> tuple[Stream, dict[str, Any] | None]:
        """The stream's chunks and the finished response object (None: no end event arrived)."""
        stream = Stream()
        final: dict[str, Any] | None = None
        for t, data in sse_events(read_t_ns, reads, stream):
            obj = stream.decode(data)
            if obj is None:
                continue
            kind = obj.get("type")
            if kind in ANSWER_EVENTS:
                stream.token(t, obj.get("delta"))
            elif kind in REASONING_EVENTS:
                stream.reasoning(t, obj.get("delta"))
            elif kind in END_EVENTS:
                response = obj.get("response")
                final = response if isinstance(response, dict) else {}
            elif kind == "response.failed":
                response = obj.get("response")
                err = response.get("error") if isinstance(response, dict) else None
                stream.error = stream.error or error_message(err, "response.failed")
            elif kind == "error":
                stream.error = stream.error or error_message(obj, "error event")
        return stream, final


def error_message(err: object, what: str) -> str:
    """An error object's `message` (what the server said), else the event's name and the object."""
    msg = err.get("message") if isinstance(err, dict) else None
    return msg if isinstance(msg, str) and msg else f"{what}: {clipped(orjson.dumps(err), 120)}"
