"""Replies to requests that send `tools` or `response_format` (OpenAI surfaces): what the simulator answers,
and whether that answer is valid (the truth's `reply_valid`), so a client's count of valid replies can be
checked against it.

- `tools` (and `tool_choice` not "none"; under "auto" or none sent, only with probability
  `--tool-call-share` P, seeded by the request id, else the answer is plain text as without tools): the
  answer is one tool call, of the function tool_choice names,
  else of declared tool number crc32(request id) % len(tools); its arguments are an instance of that
  function's `parameters` schema (instance() below);
- else `response_format` `{"type": "json_schema", "json_schema": {"schema": S}}`: the content is an
  instance of S (`{"type": "json_object"}`: `{"reply": "tok"}`);
- else: no structure (the plain "tok " stream).

The JSON text is json.dumps of the instance (", " and ": " separators), split at its spaces: output token
i carries word i (and the space after it), so joining the tokens' texts gives the text back; the tokens
after the last word carry a single space each (whitespace after JSON is still JSON), so a reply is always
exactly max_tokens tokens. A reply with fewer tokens than words is cut (invalid JSON, as a real server's at
its max_tokens).

`--invalid-json-share P`: a request is drawn invalid with probability P (seeded by its request id, so the
truth is reproducible): its text gets a stray `}` appended (never valid JSON); a drawn tool call instead
names the undeclared function UNDECLARED when crc32(request id) is odd.

reply_valid (truth) = structure asked, not drawn invalid, every word sent, and the request ended ok.

instance() covers the subset plan/structured.py generates and most hand-written schemas: type (the first
non-null of a list), enum, const, object (every property), array (minItems, else one item within
maxItems), string (minLength/maxLength), integer/number (minimum/maximum and the exclusive forms),
boolean, null, anyOf/oneOf (the first branch), allOf (merged). Not $ref, pattern or format: a schema that
needs them gets a reply the client may rightly find invalid.
"""
from __future__ import annotations

import json
import random
import zlib
from dataclasses import dataclass
from typing import Any

UNDECLARED = "undeclared_tool"


@dataclass
class Reply:
    kind: str            # "content" | "call"
    words: list[str]     # the JSON text split at its spaces
    name: str = ""       # call: the function named
    drawn_invalid: bool = False

    def piece(self, i: int) -> str:
        """Output token i's text (0 = the reply's first answer token)."""
        if i < len(self.words):
            return self.words[i] + (" " if i < len(self.words) - 1 else "")
        return " "

    def text(self, start: int, end: int) -> str:
        return "".join(self.piece(i) for i in range(start, end))

    def valid(self, answer_tokens_sent: int, ok: bool) -> bool:
        return ok and not self.drawn_invalid and answer_tokens_sent >= len(self.words)


def plan(body: dict, request_id: str, invalid_share: float, call_share: float = 1.0) -> Reply | None:
    """The reply to this request, or None when it asks for no structure (or, under tool_choice auto, was
    drawn to answer without a call: probability 1 - call_share)."""
    tools = body.get("tools")
    choice = body.get("tool_choice")
    fmt = body.get("response_format")
    h = zlib.crc32(request_id.encode())
    drawn = invalid_share > 0 and random.Random(f"invalid:{request_id}").random() < invalid_share
    free = choice in (None, "auto")  # the model may answer without a call
    calls = not free or call_share >= 1 or random.Random(f"call:{request_id}").random() < call_share
    if isinstance(tools, list) and tools and choice != "none" and calls:
        fns: list[dict] = [t["function"] for t in tools if isinstance(t, dict) and isinstance(t.get("function"), dict)]
        named = (choice.get("function") or {}).get("name") if isinstance(choice, dict) else None
        fn = next((f for f in fns if f.get("name") == named), None) if named else (fns[h % len(fns)] if fns else None)
        if fn is None:
            return None
        name, args = str(fn.get("name", "")), json.dumps(instance(fn.get("parameters") or {"type": "object"}))
        if drawn and h % 2:
            name = UNDECLARED
        elif drawn:
            args += "}"
        return Reply("call", args.split(" "), name, drawn)
    if isinstance(fmt, dict) and fmt.get("type") in ("json_schema", "json_object"):
        schema = (fmt.get("json_schema") or {}).get("schema") if fmt["type"] == "json_schema" else None
        text = json.dumps(instance(schema) if isinstance(schema, dict) else {"reply": "tok"})
        return Reply("content", (text + "}" if drawn else text).split(" "), drawn_invalid=drawn)
    return None


def instance(schema: Any) -> Any:
    """A value the schema accepts (the subset in the module comment)."""
    if not isinstance(schema, dict):
        return None
    if "const" in schema:
        return schema["const"]
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return schema["enum"][0]
    for key in ("anyOf", "oneOf"):
        if isinstance(schema.get(key), list) and schema[key]:
            return instance(schema[key][0])
    if isinstance(schema.get("allOf"), list):
        merged: dict[str, Any] = {}
        for part in schema["allOf"]:
            if isinstance(part, dict):
                merged.update(part)
        return instance({**merged, **{k: v for k, v in schema.items() if k != "allOf"}})
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind is None:
        kind = "object" if "properties" in schema else "string"
    return _typed(kind, schema)


def _typed(kind: str, schema: dict) -> Any:
    if kind == "object":
        props = schema.get("properties") or {}
        return {k: instance(v) for k, v in props.items()}
    if kind == "array":
        lo, hi = schema.get("minItems", 0), schema.get("maxItems")
        n = max(int(lo), 1 if hi is None or hi >= 1 else 0)
        return [instance(schema.get("items") or {}) for _ in range(n)]
    if kind == "string":
        lo, hi = int(schema.get("minLength", 0)), schema.get("maxLength")
        text = "tok" + "k" * max(0, lo - 3)
        return text[:int(hi)] if hi is not None else text
    if kind in ("integer", "number"):
        lo = schema.get("minimum", schema.get("exclusiveMinimum"))
        hi = schema.get("maximum", schema.get("exclusiveMaximum"))
        v = 1 if lo is None else (lo + 1 if "exclusiveMinimum" in schema and "minimum" not in schema else lo)
        if hi is not None and v > hi:
            v = hi - 1 if "exclusiveMaximum" in schema and "maximum" not in schema else hi
        return int(v) if kind == "integer" else float(v)
    if kind == "boolean":
        return True
    return None
