"""The simulator's deterministic tokenizer (the workload team builds exact-length prompts on it).

Rule: a token is a maximal run of non-whitespace characters, `re.findall(r"\\S+", text)`.
So "Hello,  world!\\n" is 2 tokens; whitespace never counts. For chat requests the prompt's tokens
are the sum over messages of the tokens of `content` (a string, or a list of parts whose `text`
fields are counted; null counts 0) and of an assistant message's `tool_calls` (each call's function name
and arguments); roles (`tool` included) and the chat template add nothing, unless the simulator runs with
`--chat-template sim`: then a chat prompt is the rendered text of TEMPLATES["sim"], which brackets every
message in a role marker and an end marker and ends with the assistant marker (the generation prompt):
    <|begin|> <|system|> {content} <|end|> <|user|> {content} <|end|> <|assistant|>
so a list of m messages costs 1 + 2m + 1 tokens on top of its contents, as a real template adds tokens
per message; /tokenize with `messages`, llama.cpp's /apply-template and every chat endpoint use it.

Token ids: the first 8 bytes of BLAKE2b(word as UTF-8, digest_size=8), read little-endian,
modulo VOCAB_SIZE (128256, Llama 3's vocabulary). Distinct words may share an id; /detokenize
maps ids back through the words this process has seen (unknown ids print as `<id>`).

Generated text: output token i (0-based) is the word OUTPUT_WORD followed by one space, i.e. the
text of n output tokens is "tok " * n, which this tokenizer counts as exactly n tokens.
"""
from __future__ import annotations

import functools
import hashlib
import re
from typing import Any

VOCAB_SIZE = 128256
OUTPUT_WORD = "tok"
OUTPUT_TOKEN_TEXT = OUTPUT_WORD + " "
_WORD = re.compile(r"\S+")
_seen: dict[int, str] = {}


def words(text: str) -> list[str]:
    return _WORD.findall(text)


def count_tokens(text: str) -> int:
    return sum(1 for _ in _WORD.finditer(text))


@functools.lru_cache(maxsize=1 << 16)
def token_id(word: str) -> int:
    h = int.from_bytes(hashlib.blake2b(word.encode("utf-8"), digest_size=8).digest(), "little")
    return h % VOCAB_SIZE


def encode(text: str) -> list[int]:
    ids = []
    for w in _WORD.findall(text):
        i = token_id(w)
        if len(_seen) < 1_000_000:
            _seen.setdefault(i, w)
        ids.append(i)
    return ids


def decode(ids: list[int]) -> str:
    return " ".join(_seen.get(i, f"<{i}>") for i in ids)


def message_text(content: Any) -> str:
    # OpenAI content: a string, or a list of parts like {"type": "text", "text": "..."}.
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    raise ValueError("message content must be a string or a list of parts")


def call_words(calls: Any) -> list[str]:
    """An assistant message's tool calls as prompt text: each call's function name and arguments (the
    client's approximate count reads them so too: plan/prompts.py message_text)."""
    if calls is None:
        return []
    if not isinstance(calls, list) or not all(isinstance(c, dict) and isinstance(c.get("function"), dict)
                                              for c in calls):
        raise ValueError("'tool_calls' must be a list of objects with a 'function'")
    out = []
    for c in calls:
        fn = c["function"]
        for key in ("name", "arguments"):
            if not isinstance(fn.get(key, ""), str):
                raise ValueError(f"tool_calls function.{key} must be a string")
            out.append(fn.get(key) or "")
    return out


def tool_call_ids(messages: list) -> str | None:
    """The tool_call_id of each `role: tool` message at the end of the list (the results this request
    carries), joined by ","; None when it ends with none (truth column tool_call_ids)."""
    ids: list[str] = []
    for m in reversed(messages):
        if not isinstance(m, dict) or m.get("role") != "tool":
            break
        ids.append(str(m.get("tool_call_id", "")))
    return ",".join(reversed(ids)) if ids else None


TEMPLATES = ("none", "sim")


def chat_prompt_text(messages: Any, template: str = "none", add_generation_prompt: bool = True) -> str:
    """The prompt text of a chat request's messages under `template` (TEMPLATES; see the module docstring)."""
    if not isinstance(messages, list) or not messages:
        raise ValueError("'messages' must be a non-empty list")
    parts: list[str] = []
    for m in messages:
        if not isinstance(m, dict):
            raise ValueError("each message must be an object")
        text = " ".join((message_text(m.get("content")), *call_words(m.get("tool_calls"))))
        if template == "sim":
            parts.extend((f"<|{m.get('role')}|>", text, "<|end|>"))
        else:
            parts.append(text)
    if template == "sim":
        parts.insert(0, "<|begin|>")
        if add_generation_prompt:
            parts.append("<|assistant|>")
    return " ".join(parts)  # joined with a space so words never merge across messages
