"""Is a reply what the request asked for? The judge of a workload's tools / response_format
(plan/structured.py builds the fields, config/structured.py reads them), run once per ok row after its
stream was interpreted (never per chunk), from the reply's whole content and its calls.

A row's verdict is three columns (docs/results.md):
  reply_valid    True / False; None when nothing was judged (no structure asked, or a reply that is
                 neither: tools with tool_choice auto/none answered in plain text and no response_format)
  tool_calls     the calls in the reply (None when the request sent no tools)
  reply_problem  why reply_valid is False: `<kind>: <detail>`, kind one of PROBLEMS (None when valid)

Rules, in order:
- a reply with calls, when tools were sent, is judged as calls: each call names a declared function
  (the named one under tool_choice {"function": NAME}), its arguments parse as a JSON object that the
  function's `parameters` schema accepts; with tool_choice "none" any call is a problem;
- tool_choice "required" or a function's name, and no call: `no_call`;
- else, with a response_format: the content parses as JSON (surrounding whitespace allowed) that the
  schema accepts;
- else: not judged.
Schemas are checked by jsonschema (the draft each declares, 2020-12 by default); a validator is built
once per schema.
"""
from __future__ import annotations

from typing import Any

import orjson

from loadgen.config.credentials import redact_text

PROBLEMS = ("not_json", "schema", "no_call", "undeclared", "arguments_not_json", "arguments_schema",
            "unexpected_call")
MAX_PROBLEM_CHARS = 200

Verdict = tuple[bool | None, int | None, str | None]   # reply_valid, tool_calls, reply_problem


class ReplyCheck:
    def __init__(self, fields: dict[str, Any]) -> None:
        """fields: the body fields sent (plan/structured.body_fields)."""
        import jsonschema  # only a run that asks for structure pays for the import

        def validator(schema: Any) -> Any:
            schema = schema if isinstance(schema, dict) else {}
            cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
            return cls(schema)

        self._best = jsonschema.exceptions.best_match
        self.has_tools = "tools" in fields
        self.functions: dict[str, Any] = {}
        for tool in fields.get("tools") or ():
            fn = tool.get("function") or {}
            self.functions[fn.get("name", "")] = validator(fn.get("parameters", {}))
        choice = fields.get("tool_choice")
        self.choice = choice if isinstance(choice, str) or choice is None else "named"
        self.named: str | None = choice["function"]["name"] if self.choice == "named" else None  # type: ignore[index]
        fmt = fields.get("response_format")
        self.schema = validator(fmt["json_schema"]["schema"]) if fmt else None

    def judge(self, content: str, calls: list[list[str]]) -> Verdict:
        """content: the reply's answer text (joined); calls: [name, arguments] of each call, by index."""
        n_calls = len(calls) if self.has_tools else None
        if calls and self.has_tools:
            return self._calls(calls), n_calls, self._problem
        if self.choice in ("required", "named"):
            return False, n_calls, self._say("no_call", f"tool_choice {self.named or self.choice}: the reply "
                                                        f"made no tool call")
        if self.schema is None:
            return None, n_calls, None
        ok = self._json(content, self.schema, "not_json", "schema", "content")
        return ok, n_calls, self._problem

    def _calls(self, calls: list[list[str]]) -> bool:
        self._problem: str | None = None
        for i, (name, arguments) in enumerate(calls):
            if self.choice == "none":
                return self._fail("unexpected_call", f"call {i} ({name!r}) under tool_choice none")
            if self.named is not None and name != self.named:
                return self._fail("undeclared", f"call {i} names {name!r}, tool_choice names {self.named!r}")
            v = self.functions.get(name)
            if v is None:
                return self._fail("undeclared", f"call {i} names {name!r}, not a declared function")
            if not self._json(arguments, v, "arguments_not_json", "arguments_schema", f"call {i} ({name}) arguments",
                              need_object=True):
                return False
        return True

    def _json(self, text: str, validator: Any, not_json: str, mismatch: str, what: str,
              need_object: bool = False) -> bool:
        self._problem = None
        try:
            value = orjson.loads(text.strip())
        except orjson.JSONDecodeError as e:
            return self._fail(not_json, f"{what}: {e}")
        if need_object and not isinstance(value, dict):
            return self._fail(not_json, f"{what}: not a JSON object but {type(value).__name__}")
        err = self._best(validator.iter_errors(value))
        if err is not None:
            return self._fail(mismatch, f"{what} at {err.json_path}: {err.message}")
        return True

    def _fail(self, kind: str, detail: str) -> bool:
        self._problem = self._say(kind, detail)
        return False

    @staticmethod
    def _say(kind: str, detail: str) -> str:
        # the detail may quote the server's text: cut, and scrubbed of credentials as every error text is
        return f"{kind}: {redact_text(detail)}"[:MAX_PROBLEM_CHARS]
