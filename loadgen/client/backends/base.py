"""What every API backend is (the Backend protocol) and the message helpers they share. Each backend
turns a planned request into an HTTP body and interprets the stamped stream.

The runner owns the socket and stamps every read; backends never see the clock. After the stream ends,
`interpret(row, read_t_ns, reads)` fills the row's token fields from the raw reads and their stamps.
Every backend implements the whole Backend protocol below.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import orjson

from loadgen.client.recorder import Row

Messages = list[dict[str, str]]   # [{"role": "system" | "user" | "assistant", "content": text}]


class Backend(Protocol):
    api: str                # completions | chat | responses | messages | embeddings | rerank (options.APIS)
    model: str
    path: str               # the endpoint every request is posted to
    # How the stream's events end (SSE b"\n\n", NDJSON b"\n") and how many come before the first that
    # carries output (chat's role-only first event): what `[abandon] after_tokens` counts (runner.py).
    event_end: bytes
    preamble_events: int

    def body(self, prompt: str, max_tokens: int, *, model: str | None = None, priority: int | None = None) -> bytes:
        """One prompt text (chat: one user message)."""

    def body_messages(self, messages: Messages, max_tokens: int, *, model: str | None = None,
                      priority: int | None = None) -> bytes:
        """A conversation (system prefix, history, the new user turn); completions-style endpoints get
        the contents joined by newlines. model: this request's model (a [[mix]] class's; None: the
        backend's); priority: sent as the body's `priority` (None: not sent). A backend whose API has no
        such field raises ValueError (config/parts.py refuses such a workload before it runs)."""

    def reply_text(self, reads: list[bytes]) -> str:
        """The generated text of a finished response (a session's next turn sends it back)."""

    def interpret(self, row: Row, read_t_ns: Sequence[int], reads: list[bytes]) -> None:
        """Fill the row's token fields, server timings and outcome from the stamped reads (read_t_ns[i]:
        the monotonic ns at which reads[i] landed)."""


def user(prompt: str) -> Messages:
    return [{"role": "user", "content": prompt}]


def joined(messages: Messages) -> str:
    # A conversation as one prompt text, for endpoints that take no messages.
    return "\n".join(m["content"] for m in messages)


def messages_payload(api: str, model: str, messages: Messages) -> dict[str, Any]:
    # The request's text, as OpenAI and Ollama both shape it: messages for chat, else one `prompt`.
    if api == "chat":
        return {"model": model, "messages": messages}
    return {"model": model, "prompt": joined(messages)}


class WithoutPriority:
    """The body side shared by the backends whose API has no priority field (Responses, Messages, the pooling
    APIs; config/parts.py and config/pooling.py refuse a class priority for them): every body is
    payload(messages, max_tokens, model) as JSON, model being the request's [[mix]] class's or the backend's."""

    def __init__(self, api: str, model: str, extra_body: dict[str, Any]):
        self.api, self.model, self.extra_body = api, model, extra_body

    def body(self, prompt: str, max_tokens: int, *, model: str | None = None, priority: int | None = None) -> bytes:
        return self.body_messages(user(prompt), max_tokens, model=model, priority=priority)

    def body_messages(self, messages: Messages, max_tokens: int, *, model: str | None = None,
                      priority: int | None = None) -> bytes:
        if priority is not None:
            raise ValueError("this API sends no priority field")
        return orjson.dumps(self.payload(messages, max_tokens, model or self.model))

    def payload(self, messages: Messages, max_tokens: int, model: str) -> dict[str, Any]:
        raise NotImplementedError
