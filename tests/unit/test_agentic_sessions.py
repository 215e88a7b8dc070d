"""Agentic sessions ([session] max_tool_rounds): the config and its hostile values, the plan's tool draws,
the body of a tool-result request built from a recorded tool-call reply, the bound on tool rounds, and the
simulator's reading of tool messages."""
import subprocess
import sys
import textwrap

import numpy as np
import orjson
import pytest

from loadgen.client.backends.openai import OpenAIBackend
from loadgen.client.recorder import Row
from loadgen.config import workload as config
from loadgen.errors import ConfigError
from loadgen.plan.bodies import Bodies
from loadgen.plan.prompts import ApproximateTokenizer, PromptMaker, message_text
from loadgen.plan.schedule import NONE, build
from loadgen.plan.structured import body_fields
from loadgen.sim import structured as sim_structured
from loadgen.sim import tokenizer as sim_tokenizer
from tests.scripted import sse

AGENTIC = """
    [request]
    tools = { generate = 2, parameters = 3 }
    tool_choice = "auto"
    [session]
    turns = 5
    think_ms = 700
    max_tool_rounds = 2
    tool_latency_ms = { dist = "uniform", min = 20, max = 90 }
    tool_result_tokens = { dist = "uniform", min = 5, max = 30 }
    """


def write(tmp_path, extra: str, api: str = "chat", backend: str = "openai"):
    p = tmp_path / "w.toml"
    p.write_text(textwrap.dedent(f"""
        model = "m"
        api = "{api}"
        backend = "{backend}"
        seed = 5
        [arrivals]
        rate = "1/s"
        [run]
        requests = 4
        [prompt]
        tokens = {{ dist = "uniform", min = 20, max = 40 }}
        [output]
        tokens = 8
        """) + textwrap.dedent(extra))
    return p


def test_the_plan_draws_a_tool_latency_and_result_length_for_every_later_turn(tmp_path):
    c = config.load(write(tmp_path, AGENTIC))
    assert c.session.agentic and c.session.max_tool_rounds == 2
    s = build(c)
    later = s.after != NONE
    assert len(s) == 4 * 5 and s.max_tool_rounds == 2
    assert (s.tool_latency_ns[~later] == NONE).all() and (s.tool_tokens[~later] == NONE).all()
    lat_ms = s.tool_latency_ns[later] / 1e6
    assert lat_ms.min() >= 20 and lat_ms.max() <= 90 and len(np.unique(lat_ms)) > 5
    assert (lat_ms == np.rint(lat_ms)).all()  # whole ms, as drawn
    tok = s.tool_tokens[later]
    assert tok.min() >= 5 and tok.max() <= 30
    # the draws are their own streams: lengths, times and think times are those of the same plain session
    plain = build(config.load(write(tmp_path, AGENTIC.replace("max_tool_rounds = 2\n", "").replace(
        'tool_latency_ms = { dist = "uniform", min = 20, max = 90 }\n', "").replace(
        'tool_result_tokens = { dist = "uniform", min = 5, max = 30 }\n', ""))))
    assert plain.max_tool_rounds == 0 and (plain.tool_latency_ns == NONE).all()
    for col in ("intended_ns", "new_tokens", "think_ns", "max_tokens"):
        assert (getattr(s, col) == getattr(plain, col)).all(), col
    # a later turn's planned upper bound makes room for the longer of its user message or tool results
    assert (s.prompt_tokens >= plain.prompt_tokens).all()


@pytest.mark.parametrize("session_keys, problem", [
    ("max_tool_rounds = 0", "session.max_tool_rounds: must be >= 1, got 0"),
    ("max_tool_rounds = -3", "session.max_tool_rounds: must be >= 1, got -3"),
    ("max_tool_rounds = 65", "session.max_tool_rounds: must be <= 64, got 65"),
    ("max_tool_rounds = true", "session.max_tool_rounds: must be an integer, got True"),
    ('max_tool_rounds = "two"', "session.max_tool_rounds: must be an integer, got 'two'"),
    ("max_tool_rounds = 1.5", "session.max_tool_rounds: must be an integer, got 1.5"),
    ("tool_latency_ms = 50", "session.max_tool_rounds: missing: tool_latency_ms make an agentic session"),
    ("max_tool_rounds = 1\ntool_latency_ms = -5", "session.tool_latency_ms"),
    ('max_tool_rounds = 1\ntool_latency_ms = { dist = "normal", mean = 5 }', "session.tool_latency_ms"),
    ('max_tool_rounds = 1\ntool_result_tokens = "lots"', "session.tool_result_tokens: must be N or MIN..MAX"),
    ("max_tool_rounds = 1\ntool_rounds = 3", "session.tool_rounds: unknown key"),
    # ns must fit an int64: larger waits wrapped around silently (think_ms too)
    ("max_tool_rounds = 1\ntool_latency_ms = 100000000000000", "session.tool_latency_ms: draws up to"),
    ('max_tool_rounds = 1\ntool_latency_ms = { dist = "uniform", min = 1, max = 86400001 }',
     "session.tool_latency_ms: draws up to 86400001 ms: at most 86400000 ms"),
    ("think_ms = 100000000000000", "session.think_ms: draws up to 100000000000000 ms: at most 86400000 ms"),
])
def test_hostile_session_values_are_named(tmp_path, session_keys, problem):
    extra = f"""
        [request]
        tools = {{ generate = 2, parameters = 3 }}
        [session]
        turns = 3
        {session_keys}
        """
    with pytest.raises(ConfigError) as e:
        config.load(write(tmp_path, extra))
    assert any(problem in p for p in e.value.problems), e.value.problems
    assert all("w.toml" in p for p in e.value.problems), e.value.problems


@pytest.mark.parametrize("api, backend, request_keys, more, problem", [
    ("chat", "openai", "", "", "an agentic session needs tools the model can call"),
    ("chat", "openai", 'response_format = { properties = 2 }', "", "an agentic session needs tools"),
    ("chat", "openai", 'tools = { generate = 1, parameters = 1 }\ntool_choice = "none"', "",
     'tool_choice = "none" forbids every call'),
    ("completions", "openai", 'tools = { generate = 1, parameters = 1 }', "", 'needs backend = "openai" and api'),
    ("chat", "ollama", "", "", 'needs backend = "openai" and api = "chat"'),
    ("chat", "openai", 'tools = { generate = 1, parameters = 1 }', "[image]\nwidth = 8\nheight = 8\n",
     "[image] and [session] max_tool_rounds cannot be combined"),
])
def test_what_an_agentic_session_needs(tmp_path, api, backend, request_keys, more, problem):
    extra = f"[request]\n{request_keys}\n[session]\nturns = 3\nmax_tool_rounds = 2\n{more}"
    with pytest.raises(ConfigError) as e:
        config.load(write(tmp_path, extra, api=api, backend=backend))
    assert any(problem in p for p in e.value.problems), e.value.problems


def test_the_cli_exits_2_naming_the_field(tmp_path):
    w = write(tmp_path, AGENTIC.replace("max_tool_rounds = 2", "max_tool_rounds = 1000"))
    p = subprocess.run([sys.executable, "-m", "loadgen", "schedule", str(w)], capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 2, p.stderr
    assert "session.max_tool_rounds: must be <= 64, got 1000" in p.stderr and "Traceback" not in p.stderr


def call_reply(call_id: str, name: str, args: list[str], content: str = "") -> list[bytes]:
    """A recorded chat stream that calls one tool: the id and name in the first piece, arguments after."""
    head = {"index": 0, "id": call_id, "type": "function", "function": {"name": name, "arguments": args[0]}}
    events = [{"choices": [{"index": 0, "delta": {"role": "assistant", "content": content}}]},
              {"choices": [{"index": 0, "delta": {"tool_calls": [head]}}]}]
    events += [{"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": a}}]}}]}
               for a in args[1:]]
    events.append({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]})
    return [sse(orjson.dumps(e).decode()) for e in events] + [sse("[DONE]")]


def text_reply(text: str) -> list[bytes]:
    return [sse(orjson.dumps({"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": "stop"}]})
                .decode()), sse("[DONE]")]


def agentic_bodies(tmp_path):
    c = config.load(write(tmp_path, AGENTIC))
    s = build(c)
    backend = OpenAIBackend("chat", "m", {})
    backend.structure(body_fields(c.structured, c.seed))  # as run/prepare.py does
    b = Bodies(s, backend, PromptMaker(ApproximateTokenizer()), c.seed)
    first = [orjson.loads(x) if x else None for x in b.build_all()]
    return s, b, first


def prev_row(idx: int, planned: int, output: int) -> Row:
    r = Row(idx, f"r{idx}", 0, planned, 8)
    r.output_tokens = output
    return r


def approx(messages: list[dict]) -> int:
    return ApproximateTokenizer().count_messages(messages)


def test_a_tool_call_reply_is_answered_by_one_tool_message_per_call(tmp_path):
    s, b, first = agentic_bodies(tmp_path)
    args = ['{"field_0": ', '"tok", ', '"field_1": 3}']
    reads = call_reply("call-abc", "tool_1", args)
    assert OpenAIBackend("chat", "m", {}).reply_message(reads) == {
        "role": "assistant", "content": None,
        "tool_calls": [{"id": "call-abc", "type": "function",
                        "function": {"name": "tool_1", "arguments": "".join(args)}}]}
    body, planned, round_ = b.next_turn(1, prev_row(0, int(s.prompt_tokens[0]), 8), reads)
    assert round_ == 1
    msgs = orjson.loads(body)["messages"]
    assert [m["role"] for m in msgs] == ["user", "assistant", "tool"]
    assert msgs[0] == first[0]["messages"][0]
    assert msgs[1]["tool_calls"][0]["id"] == "call-abc" and msgs[1]["content"] is None
    assert msgs[2]["tool_call_id"] == "call-abc" and msgs[2]["content"]
    # the plan: the previous prompt + its output + this request's drawn tool-result tokens, and the whole
    # message list counts exactly that (the result text absorbs what the re-sent call counts differently)
    assert planned == s.prompt_tokens[0] + 8 + s.tool_tokens[1] == approx(msgs)
    tools = orjson.loads(body)["tools"]  # the tools go with every request
    assert tools == first[0]["tools"] and [t["function"]["name"] for t in tools] == ["tool_0", "tool_1"]
    # deterministic: the same reply gives the same body
    _, b2, _ = agentic_bodies(tmp_path)
    assert b2.next_turn(1, prev_row(0, int(s.prompt_tokens[0]), 8), reads)[0] == body


def test_several_calls_get_a_result_each_in_their_order(tmp_path):
    s, b, _ = agentic_bodies(tmp_path)
    events = [{"choices": [{"index": 0, "delta": {"tool_calls": [
        {"index": 0, "id": "c0", "function": {"name": "tool_0", "arguments": "{}"}},
        {"index": 1, "id": "c1", "function": {"name": "tool_1", "arguments": "{\"a\": "}}]}}]},
        {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 1, "function": {"arguments": "1}"}}]},
                      "finish_reason": "tool_calls"}]}]
    reads = [sse(orjson.dumps(e).decode()) for e in events] + [sse("[DONE]")]
    body, planned, round_ = b.next_turn(1, prev_row(0, int(s.prompt_tokens[0]), 5), reads)
    msgs = orjson.loads(body)["messages"]
    assert round_ == 1 and [m["role"] for m in msgs] == ["user", "assistant", "tool", "tool"]
    assert [c["function"]["arguments"] for c in msgs[1]["tool_calls"]] == ["{}", '{"a": 1}']
    assert [m["tool_call_id"] for m in msgs[2:]] == ["c0", "c1"]
    assert len(msgs[2]["content"].split()) == s.tool_tokens[1] // 2
    assert planned == approx(msgs)


def test_rounds_are_bounded_and_a_reply_without_calls_gets_the_next_user_message(tmp_path):
    s, b, _ = agentic_bodies(tmp_path)
    planned = int(s.prompt_tokens[0])
    rounds = []
    for j in range(1, 5):  # every reply calls: rounds 1, 2, then the bound: a user message, then 1 again
        body, nxt, r = b.next_turn(j, prev_row(j - 1, planned, 8), call_reply(f"id{j}", "tool_0", ["{}"]))
        rounds.append(r)
        msgs = orjson.loads(body)["messages"]
        assert nxt == approx(msgs) == planned + 8 + (s.tool_tokens[j] if r else s.new_tokens[j])
        if r == 0:  # past max_tool_rounds: the call goes back as text (no tool_calls without their results)
            assert msgs[-2] == {"role": "assistant", "content": "tool_0{}"} and msgs[-1]["role"] == "user"
        else:
            assert msgs[-1] == {"role": "tool", "tool_call_id": f"id{j}", "content": msgs[-1]["content"]}
        planned = nxt
    assert rounds == [1, 2, 0, 1]
    # a plain answer: the next user message, its think time applies (the runner reads round 0)
    _, b, _ = agentic_bodies(tmp_path)
    body, nxt, r = b.next_turn(1, prev_row(0, int(s.prompt_tokens[0]), 3), text_reply("tok tok tok"))
    msgs = orjson.loads(body)["messages"]
    assert r == 0 and [m["role"] for m in msgs] == ["user", "assistant", "user"]
    assert nxt == s.prompt_tokens[0] + 3 + s.new_tokens[1] == approx(msgs)


def test_the_simulator_counts_tool_messages_as_the_client_does():
    messages = [{"role": "user", "content": "kalo mine"},
                {"role": "assistant", "content": None,
                 "tool_calls": [{"id": "x", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}]},
                {"role": "tool", "tool_call_id": "x", "content": "ru sa te"}]
    text = sim_tokenizer.chat_prompt_text(messages)
    assert sim_tokenizer.count_tokens(text) == 2 + 3 + 3 == approx(messages)
    assert message_text(messages[1]) == ' f {"a": 1}'
    assert sim_tokenizer.tool_call_ids(messages) == "x"
    assert sim_tokenizer.tool_call_ids(messages[:2]) is None
    two = messages + [{"role": "tool", "tool_call_id": "y", "content": "z"}]
    assert sim_tokenizer.tool_call_ids(two) == "x,y"
    templated = sim_tokenizer.chat_prompt_text(messages, "sim")
    assert "<|tool|>" in templated and sim_tokenizer.count_tokens(templated) == 8 + 2 * 3 + 2
    with pytest.raises(ValueError):
        sim_tokenizer.chat_prompt_text([{"role": "assistant", "tool_calls": "f"}])
    with pytest.raises(ValueError):
        sim_tokenizer.chat_prompt_text([{"role": "assistant", "tool_calls": [{"function": {"name": 3}}]}])


def test_the_simulators_tool_call_share_under_auto():
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    for choice in (None, "auto"):
        body = {"tools": tools, **({"tool_choice": choice} if choice else {})}
        calls = [sim_structured.plan(body, f"req-{i}", 0.0, 0.3) is not None for i in range(400)]
        assert 0.2 < sum(calls) / 400 < 0.4, choice
        assert [sim_structured.plan(body, f"req-{i}", 0.0, 0.3) is not None for i in range(400)] == calls
        assert all(sim_structured.plan(body, f"req-{i}", 0.0, 1.0) for i in range(50))
    forced = {"tools": tools, "tool_choice": "required"}
    assert all(sim_structured.plan(forced, f"req-{i}", 0.0, 0.0) for i in range(50))  # required: always a call


def test_compare_names_other_tool_settings_as_other_work(tmp_path):
    import polars as pl

    from loadgen.analysis.compare import same_work, work_of

    req = pl.DataFrame({"planned_prompt_tokens": [10, 20], "max_tokens": [8, 8], "prompt_tokens": [10, 20],
                        "cached_tokens": [None, None], "outcome": ["ok", "ok"], "warmup": [False, False]})

    def work(session):
        manifest = {"config": {"model": "m", "api": "chat", "session": session}, "schedule": {}}
        return work_of(manifest, req)  # type: ignore[arg-type]

    plain = {"turns": {"value": 3}, "think_ms": {"value": 100}, "max_tool_rounds": 0}
    agentic = {**plain, "max_tool_rounds": 2, "tool_latency_ms": {"value": 200}, "tool_result_tokens": {"value": 64}}
    assert same_work(work(plain), work(dict(plain))) == [] and same_work(work(agentic), work(dict(agentic))) == []
    for other in (plain, {**agentic, "max_tool_rounds": 3}, {**agentic, "tool_latency_ms": {"value": 50}}):
        assert [d["field"] for d in same_work(work(agentic), work(other))] == ["agentic"], other
