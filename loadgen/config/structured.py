"""[request] tools, tool_choice and response_format: what a workload asks the server to answer in (OpenAI
function calling and structured output), read and checked here; plan/structured.py builds the body
fields from it (a generated set deterministic from the seed), client/backends/replies.py judges each reply.

    [request]
    tools = "tools.json"                      # a JSON file: a list of OpenAI tool definitions, or {"tools": [...]}
    tools = { generate = 4, parameters = 6 }  # or 4 generated tools (tool_0 .. tool_3), 6 parameters each
    tool_choice = "required"                  # auto | required | none | a declared function's name
    response_format = "schema.json"           # a JSON schema file (or a whole OpenAI response_format object)
    response_format = { properties = 8 }      # or a generated JSON schema with 8 properties

A path is relative to the workload file. Every problem names the file and key (and the file's field:
`tools.json: [2].function.name`). A schema (the response format's, each tool's `parameters`) must be a
valid JSON schema (jsonschema's check_schema for its declared draft, 2020-12 when it declares none).
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import orjson

from loadgen.config.kinds import is_file
from loadgen.config.runconfig import StructuredSpec
from loadgen.config.sections import Reader

TOOL_CHOICES = ("auto", "required", "none")
MAX_TOOLS = 1000          # generated tools, and tools in a file
MAX_PROPERTIES = 1000     # a generated schema's properties (a tool's parameters)
FUNCTION_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")   # OpenAI's rule for a function's name


def spec(r: Reader) -> StructuredSpec | None:
    """The [request] tools / tool_choice / response_format keys (None when none is given)."""
    tools, choice, fmt = r.get("request.tools"), r.get("request.tool_choice"), r.get("request.response_format")
    if tools is None and choice is None and fmt is None:
        return None
    out: dict[str, Any] = {}
    if tools is not None:
        out.update(_tools(r, tools))
    if choice is not None:
        out["tool_choice"] = _choice(r, choice, out)
    if fmt is not None:
        out.update(_response_format(r, fmt))
    return StructuredSpec(**out)


def _tools(r: Reader, v: Any) -> dict[str, Any]:
    key = "request.tools"
    if isinstance(v, dict):
        for extra in sorted(set(v) - {"generate", "parameters"}):
            r.bad(f"{key}.{extra}", "unknown key (expected generate, parameters)")
        n = r.integer(f"{key}.generate", None, 1, v.get("generate"), MAX_TOOLS)
        if "generate" not in v:
            r.bad(f"{key}.generate", "missing: how many tools to generate, e.g. "
                                     "tools = { generate = 4, parameters = 6 }")
        p = r.integer(f"{key}.parameters", 4, 0, v.get("parameters", 4), MAX_PROPERTIES)
        return {"generate_tools": n or 0, "tool_parameters": p or 0}
    path = _path(r, key, v, "a JSON file of OpenAI tool definitions, or { generate = N, parameters = M }")
    if path is None:
        return {}
    doc = _json(r, key, path)
    if isinstance(doc, dict) and "tools" in doc:
        doc, at = doc["tools"], "tools"
    else:
        at = ""
    if not isinstance(doc, list) or not doc:
        r.bad(key, f"{path}: {at or 'the file'} must be a non-empty list of tool definitions "
                   f"([{{\"type\": \"function\", \"function\": {{\"name\": ...}}}}])")
        return {"tools_file": str(path)}
    if len(doc) > MAX_TOOLS:
        r.bad(key, f"{path}: {len(doc)} tools, at most {MAX_TOOLS}")
    names: set[str] = set()
    for i, tool in enumerate(doc):
        _tool(r, key, f"{path}: {at}[{i}]", tool, names)
    return {"tools_file": str(path), "tools": tuple(doc)}


def _tool(r: Reader, key: str, where: str, tool: Any, names: set[str]) -> None:
    if not isinstance(tool, dict):
        r.bad(key, f"{where}: must be an object {{\"type\": \"function\", \"function\": {{...}}}}, got {tool!r:.60}")
        return
    if tool.get("type", "function") != "function":
        r.bad(key, f"{where}.type: must be \"function\", got {tool.get('type')!r}")
    fn = tool.get("function")
    if not isinstance(fn, dict):
        r.bad(key, f"{where}.function: must be an object with a name (and parameters), got {fn!r:.60}")
        return
    name = fn.get("name")
    if not isinstance(name, str) or not FUNCTION_NAME.match(name):
        r.bad(key, f"{where}.function.name: must be 1-64 letters, digits, '_' or '-', got {name!r:.60}")
    elif name in names:
        r.bad(key, f"{where}.function.name: {name!r} is declared twice")
    else:
        names.add(name)
    if "parameters" in fn:
        _schema_ok(r, key, f"{where}.function.parameters", fn["parameters"])


def _choice(r: Reader, v: Any, tools: dict[str, Any]) -> str | None:
    key = "request.tool_choice"
    if not tools and not r.given("request.tools"):
        r.bad(key, "needs request.tools (the tools the server may call)")
        return None
    if not isinstance(v, str) or not v:
        r.bad(key, f"must be auto, required, none or a declared function's name, got {v!r}")
        return None
    declared = [t["function"]["name"] for t in tools.get("tools", ()) if isinstance(t, dict)
                and isinstance(t.get("function"), dict) and isinstance(t["function"].get("name"), str)]
    if tools.get("generate_tools"):
        declared = [f"tool_{i}" for i in range(tools["generate_tools"])]
    if v not in TOOL_CHOICES and declared and v not in declared:
        shown = ", ".join(declared[:8]) + (", ..." if len(declared) > 8 else "")
        r.bad(key, f"must be auto, required, none or a declared function's name ({shown}), got {v!r}")
    return v


def _response_format(r: Reader, v: Any) -> dict[str, Any]:
    key = "request.response_format"
    if isinstance(v, dict):
        for extra in sorted(set(v) - {"properties"}):
            r.bad(f"{key}.{extra}", "unknown key (expected properties: a generated schema's size)")
        n = r.integer(f"{key}.properties", None, 1, v.get("properties"), MAX_PROPERTIES)
        if "properties" not in v:
            r.bad(f"{key}.properties", "missing: the generated schema's size, "
                                       "e.g. response_format = { properties = 8 }")
        return {"schema_properties": n or 0}
    path = _path(r, key, v, "a JSON schema file, or { properties = N }")
    if path is None:
        return {}
    doc = _json(r, key, path)
    name = path.stem
    if isinstance(doc, dict) and doc.get("type") == "json_schema" and "json_schema" in doc:
        wrapped = doc["json_schema"]  # a whole OpenAI response_format object
        if not isinstance(wrapped, dict) or not isinstance(wrapped.get("schema"), dict):
            r.bad(key, f"{path}: json_schema.schema: must be a JSON schema object")
            return {"schema_file": str(path)}
        name, doc = str(wrapped.get("name") or name), wrapped["schema"]
    if not isinstance(doc, dict):
        r.bad(key, f"{path}: must hold a JSON schema (an object), got {type(doc).__name__}")
        return {"schema_file": str(path)}
    _schema_ok(r, key, f"{path}", doc)
    return {"schema_file": str(path), "schema": doc, "schema_name": re.sub(r"[^A-Za-z0-9_-]", "_", name)[:64]}


def _path(r: Reader, key: str, v: Any, what: str) -> Path | None:
    if not isinstance(v, str) or not v:
        r.bad(key, f"must be {what}, got {v!r}")
        return None
    p = Path(v) if Path(v).is_absolute() else r.base_dir / v
    if not is_file(p):
        r.bad(key, f"no such file {str(p)!r} ({what})")
        return None
    return p


def _json(r: Reader, key: str, path: Path) -> Any:
    try:
        return orjson.loads(path.read_bytes())
    except orjson.JSONDecodeError as e:
        r.bad(key, f"{path}: not valid JSON: {e}")
    except OSError as e:
        r.bad(key, f"{path}: cannot read: {e.strerror or e}")
    return None


def _schema_ok(r: Reader, key: str, where: str, schema: Any) -> None:
    """schema is a valid JSON schema (for the draft it declares)."""
    if not isinstance(schema, dict):
        r.bad(key, f"{where}: must be a JSON schema (an object), got {schema!r:.60}")
        return
    import jsonschema  # only a workload that names a schema pays for the import

    try:
        jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator).check_schema(schema)
    except jsonschema.SchemaError as e:
        at = "".join(f"[{p!r}]" if isinstance(p, int) else f".{p}" for p in e.path)
        r.bad(key, f"{where}{at}: not a valid JSON schema: {e.message}")


def across(r: Reader, config: Any) -> None:
    """What the API must carry: only the openai backend sends tools and response_format, tools only to chat."""
    s = config.structured
    if s is None:
        return
    asked = [k for k, on in (("tools", s.has_tools or s.tool_choice), ("response_format", s.has_schema)) if on]
    if config.backend != "openai":
        for k in asked:
            r.bad(f"request.{k}", f"only the openai backend sends {k} (the {config.backend} backend's API is "
                  f"not OpenAI's): use backend = \"openai\" (the server's /v1 endpoints)")
    elif config.api in ("responses", "messages"):
        for k in asked:
            r.bad(f"request.{k}", f"api = \"{config.api}\" sends no {k} here (completions and chat do)")
    elif s.has_tools and config.api != "chat":
        r.bad("request.tools", "tools are sent to the chat API only (/v1/chat/completions): set api = \"chat\"")
