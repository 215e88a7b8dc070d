"""API backends: each turns a planned request into an HTTP body and interprets the stamped stream
(the protocol they implement: base.py)."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from loadgen.client.backends.base import Backend, Messages, joined, messages_payload, user
from loadgen.client.backends.llamacpp import LlamaCppBackend
from loadgen.client.backends.ollama import OllamaBackend
from loadgen.client.backends.openai import OpenAIBackend
from loadgen.config.workload import BACKENDS

__all__ = ["BACKENDS", "Backend", "Messages", "joined", "make_backend", "messages_payload", "user"]
# name -> the backend class, called as cls(api, model, extra_body)
_BY_NAME: dict[str, Callable[[str, str, dict[str, Any]], Backend]] = {
    "openai": OpenAIBackend, "ollama": OllamaBackend, "llamacpp": LlamaCppBackend}


def make_backend(name: str, api: str, model: str, extra_body: dict[str, Any]) -> Backend:
    if name not in _BY_NAME:
        raise ValueError(f"unknown backend {name!r} (one of: {', '.join(BACKENDS)})")
    return _BY_NAME[name](api, model, extra_body)
