"""Anthropic's Messages API, `POST /v1/messages` with `stream: true` (vLLM's Anthropic endpoint, Anthropic,
llama.cpp's and Ollama's compatible servers).

Request: {"model", "system": the system prefix (the conversation's system messages' contents, joined by
newlines; absent when there is none), "messages": the user and assistant turns, "max_tokens",
"stream": true} plus the workload's extra_body. Anthropic's own API also wants `anthropic-version` and
`x-api-key` headers: the run's --header gives them (docs/real-engines.md).

Stream contract (Anthropic's "Streaming messages"; vLLM 0.32's anthropic/serving.py, recorded in
tests/data/vllm/messages_stream.json): SSE events `event: <type>` / `data: {"type": <type>, ...}`:
`message_start` (message.usage: input_tokens, cache_read_input_tokens, cache_creation_input_tokens), then
per content block `content_block_start` / `content_block_delta`... / `content_block_stop`, then
`message_delta` (usage.output_tokens: the cumulative output count; vLLM and newer Anthropic also give
input_tokens there), then `message_stop`; `ping` events may come anywhere. Answer chunks: a
`content_block_delta` whose delta is `text_delta` (delta.text) or `input_json_delta` (a tool call's
arguments, delta.partial_json), and a `tool_use` block's start (its `name`, as chat counts a tool call's
name). Reasoning chunks: `thinking_delta` (delta.thinking); `signature_delta` carries no token.
Counts: output_tokens = the last usage's output_tokens (N of the rule in backends/stream.py);
prompt_tokens = input_tokens + cache_read_input_tokens + cache_creation_input_tokens (Anthropic's
input_tokens leaves out the prompt tokens its cache served or wrote); cached_tokens =
cache_read_input_tokens; reasoning tokens are counted from the thinking chunks (the usage does not split
them). Outcome: an `error` event ({"type": "error", "error": {"type", "message"}}) is an error event
inside a 200 stream (stream_error, tokens seen kept); a stream without `message_stop` is incomplete.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any


from loadgen.client.backends.base import Messages, WithoutPriority
from loadgen.client.backends.stream import Stream, as_int, sse_events
from loadgen.client.recorder import Row

END_MARKER = "message_stop"
_CACHE_KEYS = ("cache_read_input_tokens", "cache_creation_input_tokens")


class MessagesBackend(WithoutPriority):
    path = "/v1/messages"
    # [abandon] after_tokens: message_start and content_block_start come before the first delta
    event_end, preamble_events = b"\n\n", 2

    def payload(self, messages: Messages, max_tokens: int, model: str) -> dict[str, Any]:
        system = "\n".join(m["content"] for m in messages if m["role"] == "system")
        turns = [m for m in messages if m["role"] != "system"]
        return {"model": model, **({"system": system} if system else {}), "messages": turns,
                "max_tokens": max_tokens, "stream": True, **self.extra_body}

    def reply_text(self, reads: list[bytes]) -> str:
        return "".join(self._parse([0] * len(reads), reads)[0].texts)

    def interpret(self, row: Row, read_t_ns: Sequence[int], reads: list[bytes]) -> None:
        stream, usage, ended = self._parse(read_t_ns, reads)
        inputs = [as_int(usage.get(k)) for k in ("input_tokens", *_CACHE_KEYS)]
        prompt = None if inputs[0] is None else sum(n or 0 for n in inputs)
        stream.fill(row, as_int(usage.get("output_tokens")), prompt, ended, END_MARKER)
        row.cached_tokens = inputs[1]

    @staticmethod
    def _parse(read_t_ns: Sequence[int], reads: list[bytes]) -> tuple[Stream, dict[str, Any], bool]:
        """The stream's chunks, its usage (message_start's, updated by each message_delta's) and whether
        message_stop arrived."""
        stream = Stream()
        usage: dict[str, Any] = {}
        ended = False
        for t, data in sse_events(read_t_ns, reads, stream):
            obj = stream.decode(data)  # an `error` event: recorded by decode (its "error" object)
            if obj is None:
                continue
            kind = obj.get("type")
            if kind == "content_block_delta":
                _delta(obj.get("delta"), t, stream)
            elif kind == "content_block_start":
                block = obj.get("content_block")
                if isinstance(block, dict) and block.get("type") == "tool_use":
                    stream.token(t, block.get("name"))
            elif kind == "message_start":
                message = obj.get("message")
                _update(usage, message.get("usage") if isinstance(message, dict) else None)
            elif kind == "message_delta":
                _update(usage, obj.get("usage"))
            elif kind == "message_stop":
                ended = True
        return stream, usage, ended


def _delta(delta: object, t: int, stream: Stream) -> None:
    if not isinstance(delta, dict):
        return
    kind = delta.get("type")
    if kind == "text_delta":
        stream.token(t, delta.get("text"))
    elif kind == "input_json_delta":
        stream.token(t, delta.get("partial_json"))
    elif kind == "thinking_delta":
        stream.reasoning(t, delta.get("thinking"))


def _update(usage: dict[str, Any], new: object) -> None:
    # Later usage objects repeat or advance the counts (output_tokens is cumulative): the last one wins.
    if isinstance(new, dict):
        usage.update((k, v) for k, v in new.items() if v is not None)
