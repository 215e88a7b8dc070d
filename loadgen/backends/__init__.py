"""API backends: each turns a planned request into an HTTP body and interprets the stamped stream.

The runner owns the socket and stamps every read; backends never see the clock. After the stream ends,
`interpret(row, read_t_ns, reads)` fills the row's token fields from the raw reads and their stamps.
Every backend has `path`, `body(prompt, max_tokens) -> bytes` and `interpret(...)`.
"""
from __future__ import annotations

BACKENDS = ("openai", "ollama", "llamacpp")


def prompt_payload(api: str, model: str, prompt: str) -> dict:
    # The request's text, as OpenAI and Ollama both shape it: one user message for chat, else `prompt`.
    if api == "chat":
        return {"model": model, "messages": [{"role": "user", "content": prompt}]}
    return {"model": model, "prompt": prompt}


def make_backend(name: str, api: str, model: str, extra_body: dict):
    if name == "ollama":
        from loadgen.backends.ollama import OllamaBackend

        return OllamaBackend(api, model, extra_body)
    if name == "llamacpp":
        from loadgen.backends.llamacpp import LlamaCppBackend

        return LlamaCppBackend(api, model, extra_body)
    if name == "openai":
        from loadgen.backends.openai import OpenAIBackend

        return OpenAIBackend(api, model, extra_body)
    raise ValueError(f"unknown backend {name!r} (one of: {', '.join(BACKENDS)})")
