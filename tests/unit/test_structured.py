"""Tools, tool_choice and response_format: the workload keys (every bad value named by file and field), the
body fields and bytes sent (golden), and the judge of a reply (backends/replies.py) on streams parsed by the
openai backend, beside the simulator's own instance of a schema (sim/structured.py)."""
import textwrap

import jsonschema
import orjson
import pytest

from loadgen.client.backends.openai import OpenAIBackend
from loadgen.client.backends.replies import ReplyCheck
from loadgen.client.recorder import OK, Row
from loadgen.config import workload as config
from loadgen.errors import ConfigError
from loadgen.plan.structured import body_fields, generated_schema, _rng
from loadgen.sim import structured as sim_structured
from tests.scripted import sse

TOOL = {"type": "function", "function": {"name": "get_weather", "description": "d",
                                         "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                        "required": ["city"]}}}
SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "maximum": 5}},
          "required": ["ok", "n"], "additionalProperties": False}


def load(tmp_path, request: str, api: str = "chat", backend: str = "openai"):
    (tmp_path / "tools.json").write_text(orjson.dumps([TOOL]).decode())
    (tmp_path / "schema.json").write_text(orjson.dumps(SCHEMA).decode())
    p = tmp_path / "w.toml"
    p.write_text(textwrap.dedent(f"""
        model = "m"
        api = "{api}"
        backend = "{backend}"
        seed = 5
        [arrivals]
        rate = "1/s"
        [run]
        requests = 3
        [prompt]
        tokens = 8
        [output]
        tokens = 8
        [request]
        """) + textwrap.dedent(request))
    return config.load(p)


@pytest.mark.parametrize("request_keys, expected", [
    ('tools = "tools.json"\ntool_choice = "get_weather"',
     {"tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}),
    ('tools = "tools.json"\ntool_choice = "required"', {"tools": [TOOL], "tool_choice": "required"}),
    ('tools = "tools.json"', {"tools": [TOOL]}),
    ('response_format = "schema.json"',
     {"response_format": {"type": "json_schema", "json_schema": {"name": "schema", "schema": SCHEMA, "strict": True}}}),
])
def test_file_keys_become_the_body_fields(tmp_path, request_keys, expected):
    c = load(tmp_path, request_keys)
    assert body_fields(c.structured, c.seed) == expected


def test_golden_body_of_generated_tools_and_schema(tmp_path):
    c = load(tmp_path, "tools = { generate = 2, parameters = 3 }\ntool_choice = \"auto\"\n"
                       "response_format = { properties = 2 }\n")
    fields = body_fields(c.structured, c.seed)
    assert fields == body_fields(c.structured, c.seed)  # a pure function of the seed
    b = OpenAIBackend("chat", "m", {"ignore_eos": True})
    b.structure(fields)
    body = orjson.loads(b.body("hi", 8))
    assert list(body) == ["model", "messages", "max_tokens", "stream", "stream_options", "tools", "tool_choice",
                          "response_format", "ignore_eos"]
    assert [t["function"]["name"] for t in body["tools"]] == ["tool_0", "tool_1"]
    assert body["tool_choice"] == "auto"
    assert body["response_format"]["type"] == "json_schema"
    assert body["response_format"]["json_schema"]["schema"] == generated_schema(2, _rng(5, 1, 0))
    # golden: seed 5's first tool
    assert body["tools"][0] == {"type": "function", "function": {
        "name": "tool_0", "description": "Generated tool 0 with 3 parameters.",
        "parameters": {"type": "object", "properties": {
            "field_0": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9}, "maxItems": 3},
            "field_1": {"type": "integer", "minimum": 0, "maximum": 1000},
            "field_2": {"type": "boolean"}},
            "required": ["field_0", "field_1", "field_2"], "additionalProperties": False}}}
    for tool in body["tools"]:
        jsonschema.Draft202012Validator.check_schema(tool["function"]["parameters"])
    other = load(tmp_path, "tools = { generate = 2, parameters = 3 }").structured
    assert body_fields(other, 6) != body_fields(other, 5)  # another seed, other types


@pytest.mark.parametrize("request_keys, problem", [
    ('tool_choice = "auto"', "request.tool_choice: needs request.tools"),
    ('tools = "tools.json"\ntool_choice = "nope"', "request.tool_choice: must be auto, required, none or a declared "
                                                   "function's name (get_weather), got 'nope'"),
    ('tools = "missing.json"', "request.tools: no such file"),
    ('tools = { generate = 0 }', "request.tools.generate: must be >= 1, got 0"),
    ('tools = { parameters = 2 }', "request.tools.generate: missing"),
    ('tools = { generate = 2, size = 3 }', "request.tools.size: unknown key"),
    ('response_format = { properties = "x" }', "request.response_format.properties: must be an integer"),
    ('response_format = 3', "request.response_format: must be a JSON schema file"),
    ('response_format = "bad.json"', "bad.json: not valid JSON"),
    ('response_format = "badschema.json"', "badschema.json.properties.n.type: not a valid JSON schema"),
    ('tools = "badtools.json"', "badtools.json: [0].function.name: must be 1-64 letters"),
    ('tools = "duptools.json"', "duptools.json: [1].function.name: 'get_weather' is declared twice"),
    ('tools = "tools.json"\nextra_body = { tools = [] }', "request.extra_body.tools: given twice"),
])
def test_bad_keys_are_named(tmp_path, request_keys, problem):
    (tmp_path / "bad.json").write_text("{nope")
    (tmp_path / "badschema.json").write_text(orjson.dumps({"properties": {"n": {"type": "integr"}}}).decode())
    (tmp_path / "badtools.json").write_text(orjson.dumps([{"type": "function", "function": {"name": "a b"}}]).decode())
    (tmp_path / "duptools.json").write_text(orjson.dumps([TOOL, TOOL]).decode())
    with pytest.raises(ConfigError) as e:
        load(tmp_path, request_keys)
    assert any(problem in p for p in e.value.problems), e.value.problems
    assert all("w.toml" in p for p in e.value.problems), e.value.problems


@pytest.mark.parametrize("api, backend, request_keys, problem", [
    ("completions", "openai", 'tools = "tools.json"', "tools are sent to the chat API only"),
    ("chat", "ollama", 'response_format = "schema.json"', "only the openai backend sends response_format"),
])
def test_apis_that_cannot_carry_them(tmp_path, api, backend, request_keys, problem):
    with pytest.raises(ConfigError) as e:
        load(tmp_path, request_keys, api=api, backend=backend)
    assert any(problem in p for p in e.value.problems), e.value.problems


def _chat(*deltas: dict) -> list[bytes]:
    events = [orjson.dumps({"choices": [{"index": 0, "delta": d, "finish_reason": None}]}) for d in deltas]
    events.append(orjson.dumps({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": len(deltas)}}))
    return [sse(e) for e in events] + [sse("[DONE]")]


def _call(index: int, name: str | None, args: str) -> dict:
    fn = {"arguments": args} if name is None else {"name": name, "arguments": args}
    return {"tool_calls": [{"index": index, "function": fn}]}


def judged(fields: dict, reads: list[bytes]) -> Row:
    b = OpenAIBackend("chat", "m", {})
    b.structure(fields)
    row = Row(0, "r", 0, 3, 8)
    b.interpret(row, list(range(1, len(reads) + 1)), reads)
    return row


TOOLS = {"tools": [TOOL], "tool_choice": "required"}
RF = {"response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": SCHEMA}}}


@pytest.mark.parametrize("fields, deltas, valid, calls, kind", [
    (TOOLS, [_call(0, "get_weather", '{"ci'), _call(0, None, 'ty": "Paris"}')], True, 1, None),
    # vLLM 0.32's shape under required: the name alone (id, type, content null), then argument pieces
    (TOOLS, [{"content": None, "tool_calls": [{"id": "c1", "type": "function", "index": 0,
                                               "function": {"name": "get_weather"}}]},
             _call(0, None, '{"city"'), _call(0, None, ': "x"}')], True, 1, None),
    (TOOLS, [{"content": None, "tool_calls": [{"id": "c1", "type": "function", "index": 0,
                                               "function": {"name": "get_weather"}}]},
             _call(0, None, '"+decode'), _call(0, None, ' Observ')], False, 1, "arguments_not_json"),
    (TOOLS, [_call(0, "get_weather", '{"city": "a"}'), _call(1, "get_weather", '{"city": "b"}')], True, 2, None),
    (TOOLS, [_call(0, "get_weather", '{"city": "a"}'), _call(1, "nope", "{}")], False, 2, "undeclared"),
    (TOOLS, [_call(0, "get_weather", '{"city": ')], False, 1, "arguments_not_json"),
    (TOOLS, [_call(0, "get_weather", '{"town": "x"}')], False, 1, "arguments_schema"),
    (TOOLS, [_call(0, "get_weather", '["x"]')], False, 1, "arguments_not_json"),
    (TOOLS, [{"content": "hello"}], False, 0, "no_call"),
    ({"tools": [TOOL], "tool_choice": "auto"}, [{"content": "hello"}], None, 0, None),
    ({"tools": [TOOL], "tool_choice": "none"}, [_call(0, "get_weather", '{"city": "a"}')], False, 1,
     "unexpected_call"),
    ({"tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "other"}}},
     [_call(0, "get_weather", '{"city": "a"}')], False, 1, "undeclared"),
    (RF, [{"content": '{"ok": true, '}, {"content": '"n": 3}  '}], True, None, None),
    (RF, [{"content": '{"ok": true, '}, {"content": '"n": 9}'}], False, None, "schema"),
    (RF, [{"content": '{"ok": true, '}], False, None, "not_json"),
    ({**RF, "tools": [TOOL]}, [{"content": '{"ok": false, "n": 0}'}], True, 0, None),
    (RF, [{"reasoning_content": "hmm"}, {"content": '{"ok": true, "n": 1}'}], True, None, None),
])
def test_the_judge_of_a_reply(fields, deltas, valid, calls, kind):
    row = judged(fields, _chat(*deltas))
    assert row.outcome == OK
    assert (row.reply_valid, row.tool_calls) == (valid, calls)
    assert (row.reply_problem or "").split(":")[0] == (kind or ""), row.reply_problem
    assert row.first_answer_ns is not None and row.n_chunks == len(deltas)


def test_a_cut_off_reply_is_not_judged():
    reads = _chat(_call(0, "get_weather", '{"city": '))[:-2]  # no usage, no [DONE]
    row = judged(TOOLS, reads)
    assert row.outcome != OK and row.reply_valid is None and row.tool_calls is None


def test_without_structure_the_fast_path_is_kept():
    b = OpenAIBackend("chat", "m", {})
    assert b.check is None and b.fields == {}
    row = Row(0, "r", 0, 3, 8)
    reads = [sse(orjson.dumps({"choices": [{"index": 0, "delta": {"content": "a"}, "finish_reason": None}]})),
             sse(orjson.dumps({"choices": [{"index": 0, "delta": {"content": "b"}, "finish_reason": "length"}]})),
             sse(orjson.dumps({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}})), sse("[DONE]")]
    assert b._interpret_fast(row, [1, 2, 3, 4], reads)
    assert row.reply_valid is None and row.tool_calls is None


@pytest.mark.parametrize("n", [1, 6, 40])
def test_the_simulators_instance_of_a_generated_schema_is_valid(n):
    schema = generated_schema(n, _rng(9, 1, 0))
    check = ReplyCheck({"response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}})
    reply = sim_structured.plan({"response_format": {"type": "json_schema", "json_schema": {"schema": schema}}},
                                "req-1", 0.0)
    text = reply.text(0, len(reply.words) + 3)   # every word, then three padding tokens
    assert check.judge(text, []) == (True, None, None)
    assert check.judge(reply.text(0, len(reply.words) - 1), [])[0] is False   # cut short: not JSON
    assert reply.valid(len(reply.words), True) and not reply.valid(len(reply.words) - 1, True)
