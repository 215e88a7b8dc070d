"""ShareGPT-format conversations as a prompt source.

File: a JSON list of {"id": ..., "conversations": [{"from": "human"|"user", "value": str},
{"from": "gpt"|"assistant"|"chatgpt", "value": str}, ...]} (the format of ShareGPT_V3 and its
derivatives; "system" turns are ignored). Only the human turns are used: turn t of a session sends
human message t (cycling when the conversation has fewer), with the server's own replies as the
history. Conversations without a human turn are skipped and counted.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import orjson
from loadgen.errors import DatasetError  # noqa: F401  (raised here; importable from here too)

HUMAN = {"human", "user"}


@dataclass(frozen=True)
class Conversations:
    source: str
    human_turns: tuple[tuple[str, ...], ...]   # per conversation, its human messages in order
    skipped: int

    def __len__(self) -> int:
        return len(self.human_turns)


def load_sharegpt(path: str | Path) -> Conversations:
    p = Path(path)
    try:
        data = orjson.loads(p.read_bytes())
    except FileNotFoundError:
        raise DatasetError([f"{p}: no such dataset file"]) from None
    except orjson.JSONDecodeError as e:
        raise DatasetError([f"{p}: not valid JSON: {e}"]) from None
    if not isinstance(data, list):
        raise DatasetError([f"{p}: expected a JSON list of conversations (ShareGPT format)"])
    out, skipped, problems = [], 0, []
    for i, item in enumerate(data):
        conv = item.get("conversations") if isinstance(item, dict) else None
        if not isinstance(conv, list):
            problems.append(f"{p}: entry {i}: missing a \"conversations\" list")
            continue
        turns = tuple(m["value"] for m in conv if isinstance(m, dict) and m.get("from") in HUMAN
                      and isinstance(m.get("value"), str) and m["value"].strip())
        if turns:
            out.append(turns)
        else:
            skipped += 1
    if problems:
        raise DatasetError(problems[:10] + ([f"{p}: ... and {len(problems) - 10} more"] if len(problems) > 10 else []))
    if not out:
        raise DatasetError([f"{p}: no conversation has a human turn"])
    return Conversations(str(p), tuple(out), skipped)
