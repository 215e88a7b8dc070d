"""The body fields of a workload's tools, tool_choice and response_format (config/structured.py), the same in
every request of the run and in every process: merged into each body by the openai backend
(client/backends/openai.py), which judges every reply against them (client/backends/replies.py).

Sent as OpenAI writes them:
    "tools": [{"type": "function", "function": {"name", "description", "parameters"}}, ...]
    "tool_choice": "auto" | "required" | "none" | {"type": "function", "function": {"name": NAME}}
    "response_format": {"type": "json_schema", "json_schema": {"name", "schema", "strict": true}}

Generated ones are a pure function of the seed (not of the prompt salt: two runs of one workload ask
for the same structure, so their replies compare): tool i is named `tool_<i>`, and a generated schema of
N properties is an object `field_0 .. field_<N-1>`, all required, no others allowed, each of a type
drawn from GENERATED_TYPES. Every value is bounded (strings by maxLength, numbers by a range, arrays by
maxItems), so a server that decodes by the schema ends its reply well inside a few dozen tokens per
property.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from loadgen.config.runconfig import StructuredSpec

GENERATED_TYPES = ("string", "integer", "number", "boolean", "enum", "array")
_ENUM = ("alpha", "beta", "gamma", "delta")


def body_fields(spec: StructuredSpec | None, seed: int) -> dict[str, Any]:
    """{"tools", "tool_choice", "response_format"} as sent (only those the workload asks for)."""
    if spec is None:
        return {}
    out: dict[str, Any] = {}
    if spec.tools:
        out["tools"] = list(spec.tools)
    elif spec.generate_tools:
        out["tools"] = generated_tools(spec.generate_tools, spec.tool_parameters, seed)
    if spec.tool_choice is not None:
        c = spec.tool_choice
        out["tool_choice"] = c if c in ("auto", "required", "none") else {"type": "function", "function": {"name": c}}
    if spec.schema is not None:
        out["response_format"] = response_format(spec.schema_name or "reply", spec.schema)
    elif spec.schema_properties:
        schema = generated_schema(spec.schema_properties, _rng(seed, 1, 0))
        out["response_format"] = response_format("reply", schema)
    return out


def response_format(name: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}


def generated_tools(n: int, parameters: int, seed: int) -> list[dict[str, Any]]:
    return [{"type": "function",
             "function": {"name": f"tool_{i}", "description": f"Generated tool {i} with {parameters} parameters.",
                          "parameters": generated_schema(parameters, _rng(seed, 2, i))}} for i in range(n)]


def generated_schema(n: int, rng: np.random.Generator) -> dict[str, Any]:
    """An object schema of n required properties, each of a type drawn from GENERATED_TYPES."""
    props = {f"field_{i}": _property(GENERATED_TYPES[int(k)])
             for i, k in enumerate(rng.integers(0, len(GENERATED_TYPES), size=n))}
    return {"type": "object", "properties": props, "required": list(props), "additionalProperties": False}


def _property(kind: str) -> dict[str, Any]:
    if kind == "string":
        return {"type": "string", "maxLength": 16}
    if kind == "integer":
        return {"type": "integer", "minimum": 0, "maximum": 1000}
    if kind == "number":
        return {"type": "number", "minimum": 0, "maximum": 1}
    if kind == "boolean":
        return {"type": "boolean"}
    if kind == "enum":
        return {"type": "string", "enum": list(_ENUM)}
    return {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9}, "maxItems": 3}


def _rng(seed: int, *key: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence([seed, 7, *key]))
