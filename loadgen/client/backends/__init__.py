"""API backends: each turns a planned request into an HTTP body and interprets the stamped stream
(the protocol they implement: base.py)."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from loadgen.client.backends.base import Backend, Messages, joined, messages_payload, user
from loadgen.client.backends.llamacpp import LlamaCppBackend
from loadgen.client.backends.messages import MessagesBackend
from loadgen.client.backends.ollama import OllamaBackend
from loadgen.client.backends.openai import OpenAIBackend
from loadgen.client.backends.pooled import EmbeddingsBackend, RerankBackend
from loadgen.client.backends.responses import ResponsesBackend
from loadgen.config.options import EVENT_APIS, POOLING_APIS
from loadgen.config.workload import BACKENDS

__all__ = ["BACKENDS", "Backend", "Messages", "joined", "make_backend", "messages_payload", "user"]
# name -> the backend class, called as cls(api, model, extra_body)
_BY_NAME: dict[str, Callable[[str, str, dict[str, Any]], Backend]] = {
    "openai": OpenAIBackend, "ollama": OllamaBackend, "llamacpp": LlamaCppBackend}
# api -> its backend, whatever the server family: the OpenAI Responses and Anthropic Messages APIs, and the
# embeddings and rerank APIs, are one wire format each (config/sections.py lets them run with backend "openai" only)
_BY_API: dict[str, Callable[[str, str, dict[str, Any]], Backend]] = {
    "responses": ResponsesBackend, "messages": MessagesBackend,
    "embeddings": EmbeddingsBackend, "rerank": RerankBackend}
assert set(_BY_API) == set(EVENT_APIS) | set(POOLING_APIS)


def make_backend(name: str, api: str, model: str, extra_body: dict[str, Any]) -> Backend:
    if name not in _BY_NAME:
        raise ValueError(f"unknown backend {name!r} (one of: {', '.join(BACKENDS)})")
    return _BY_API.get(api, _BY_NAME[name])(api, model, extra_body)
