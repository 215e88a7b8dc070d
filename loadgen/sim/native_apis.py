"""Ollama and llama.cpp surfaces (filled in with the engine)."""


def routes():
    return []
