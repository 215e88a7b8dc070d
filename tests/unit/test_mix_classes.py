"""[[mix]] classes with their own model and priority: the keys' validation (file and key named), the plan's
class column, the bodies that carry them, per-class SLO specs and goodput, and the simulator engine's
priority scheduling (virtual time)."""
import textwrap

import orjson
import polars as pl
import pytest

from loadgen.analysis.breakdown import breakdown
from loadgen.analysis.goodput import goodput, meets
from loadgen.client.backends import make_backend
from loadgen.config import workload as config
from loadgen.config.slo import bounds_for, from_keys, parse_slo, slo_keys
from loadgen.config.workload import ConfigError
from loadgen.plan.bodies import Bodies
from loadgen.plan.prompts import ApproximateTokenizer, PromptMaker
from loadgen.plan.schedule import NONE, build, plan_records
from tests.unit.sim_virtual import Req, engine, prompt, simulate

BASE = """
model = "m"
api = "chat"
seed = 5
{head}
[arrivals]
process = "poisson"
rate = "4/s"
[run]
requests = 200
{extra}
[[mix]]
name = "interactive"
weight = 0.5
prompt = 50
output = 10
{first}
[[mix]]
weight = 0.5
prompt = 80
output = 12
{second}
"""


def load(tmp_path, first="", second="", head="", extra="", overrides=None):
    p = tmp_path / "w.toml"
    p.write_text(textwrap.dedent(BASE.format(head=head, extra=extra, first=first, second=second)))
    return config.load(p, overrides)


def test_a_class_carries_its_model_and_priority(tmp_path):
    c = load(tmp_path, 'priority = 0\nmodel = "lora-a"', "priority = -3")
    a, b = c.mix
    assert (a.name, a.model, a.priority) == ("interactive", "lora-a", 0)
    assert (b.name, b.model, b.priority) == ("mix1", None, -3)   # unnamed: by its place; no model: the run's
    assert load(tmp_path).mix[0].priority is None                 # unset: no priority sent


@pytest.mark.parametrize("first, second, head, extra, message", [
    # a priority that is not an integer: a word, a float, a bool
    ('priority = "high"', "", "", "", "mix[0].priority: must be an integer (vLLM: lower is served first), got 'high'"),
    ("priority = 1.5", "", "", "", "mix[0].priority: must be an integer"),
    ("priority = true", "", "", "", "mix[0].priority: must be an integer"),
    # beyond the int64 the rows hold (and vLLM accepts)
    ("", "priority = 9223372036854775807", "", "", None),
    ("", "priority = -9223372036854775808", "", "", None),
    # a model that is not a name
    ('model = ""', "", "", "", "mix[0].model: must be a non-empty string"),
    ("model = 7", "", "", "", "mix[0].model: must be a non-empty string"),
    # names: unique, usable in --slo METRIC=BOUND@CLASS
    ("", 'name = "interactive"', "", "", "mix[1].name: 'interactive' names another [[mix]] class too"),
    ("", 'name = "a@b"', "", "", "mix[1].name: must be a non-empty string without spaces, '@'"),
    ("", 'name = "chat.v1"', "", "", "mix[1].name: must be a non-empty string without spaces, '@', ',', '=' or '.'"),
    ("", "name = 3", "", "", "mix[1].name: must be a non-empty string"),
    # a typo is named with the keys there are
    ("prio = 1", "", "", "", "mix[0].prio: unknown key (expected weight, prompt, output, name, model, priority)"),
    # APIs without the field: refused, naming the key
    ("priority = 1", "", 'backend = "ollama"', "", "mix[0].priority: the ollama backend's API has no priority field"),
    ("priority = 1", "", 'backend = "llamacpp"', "", "mix[0].priority: the llamacpp backend's API has no priority"),
    ('model = "x"', "", 'backend = "llamacpp"', "", "mix[0].model: llama.cpp's /completion serves the one model"),
    # the same field twice: a class's and extra_body's
    ("priority = 1", "", "", "[request]\nextra_body = { priority = 2 }",
     "request.extra_body.priority: [[mix]] classes set the priority"),
])
def test_bad_class_keys_name_the_file_and_key(tmp_path, first, second, head, extra, message):
    if message is None:  # the bounds themselves are accepted
        assert load(tmp_path, first, second, head, extra).mix[1].priority is not None
        return
    with pytest.raises(ConfigError) as e:
        load(tmp_path, first, second, head, extra)
    assert any(p.startswith(f"{tmp_path / 'w.toml'}: ") and message in p for p in e.value.problems), e.value.problems


@pytest.mark.parametrize("value", ["9223372036854775808", "-9223372036854775809"])
def test_out_of_range_priority_is_named(tmp_path, value):
    # Python's TOML reader keeps integers beyond int64: the check names them (the rows' column is int64,
    # vLLM's field bounded by the same range)
    with pytest.raises(ConfigError) as e:
        load(tmp_path, "", f"priority = {value}")
    assert e.value.problems == [f"{tmp_path / 'w.toml'}: mix[1].priority: must be an integer in "
                                f"[{-2**63}, {2**63 - 1}], got {value}"]


def test_a_trace_replay_cannot_drop_the_classes_silently(tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n0,m,20,4,24,C\n")
    with pytest.raises(ConfigError, match=r"mix\[0\]: a trace replay takes its lengths from the trace"):
        load(tmp_path, "priority = 1", overrides={"--trace": str(trace)})


@pytest.mark.parametrize("text, expected", [
    ("ttft=1s,ttft=200ms@interactive", {"ttft": 1000.0, "ttft@interactive": 200.0}),
    ("e2e=2s@batch,tpot=50ms", {"e2e@batch": 2000.0, "tpot": 50.0}),
])
def test_per_class_slo_specs(text, expected):
    assert parse_slo(text) == expected
    assert from_keys(slo_keys(expected)) == expected   # recorded as ttft_ms@interactive, read back


@pytest.mark.parametrize("text, message", [
    ("ttft=200ms@", "a class name must follow '@'"),
    ("ttft=200ms@a,ttft=300ms@a", "ttft for class a given twice"),
    ("speed=2s@a", "unknown metric 'speed'"),
])
def test_bad_per_class_slo_specs(text, message):
    with pytest.raises(ValueError, match=message):
        parse_slo(text)


def test_a_slo_for_a_class_the_workload_lacks_is_named(tmp_path):
    with pytest.raises(ConfigError, match=r"--slo: ttft@nope: no \[\[mix\]\] class named 'nope' \(the workload's "
                                          r"classes: interactive, mix1\)"):
        load(tmp_path, overrides={"--slo": "ttft=1s@nope"})
    assert load(tmp_path, overrides={"--slo": "ttft=1s@mix1"}).slo == (("ttft@mix1", 1000.0),)


def test_the_plan_and_the_bodies_carry_each_class(tmp_path):
    c = load(tmp_path, 'priority = 0\nmodel = "lora-a"', "priority = 7")
    s = build(c)
    cls = s.mix_class
    assert set(cls.tolist()) == {0, 1}
    # the class is the one the lengths were drawn from
    assert (s.prompt_tokens[cls == 0] == 50).all() and (s.prompt_tokens[cls == 1] == 80).all()
    assert [r["mix_class"] for r in plan_records(s)] == cls.tolist()
    bodies = Bodies(s, make_backend("openai", "chat", "m", {}), PromptMaker(ApproximateTokenizer()), 5,
                    mix=c.mix).build_all()
    for j, b in zip(cls.tolist(), bodies):
        body = orjson.loads(b)
        assert (body["model"], body["priority"]) == (("lora-a", 0) if j == 0 else ("m", 7))
    # no mix: no class, no priority key in the body
    p = tmp_path / "plain.toml"
    p.write_text('model = "m"\napi = "chat"\n[arrivals]\nrate = "4/s"\n[run]\nrequests = 5\n'
                 '[prompt]\ntokens = 20\n[output]\ntokens = 4\n')
    plain = build(config.load(p))
    assert (plain.mix_class == NONE).all()
    b = orjson.loads(Bodies(plain, make_backend("openai", "chat", "m", {}), PromptMaker(ApproximateTokenizer()),
                            1).build_all()[0])
    assert "priority" not in b and b["model"] == "m"


@pytest.mark.parametrize("backend", ["ollama", "llamacpp"])
def test_backends_without_the_field_refuse_a_priority(backend):
    with pytest.raises(ValueError, match="no .*priority"):
        make_backend(backend, "completions", "m", {}).body("hi", 4, priority=1)


MS = 1_000_000


def _rows(spec):
    # (class, ttft_ms, outcome) -> measured rows with the columns goodput reads
    rows = []
    for i, (cls, ttft_ms, outcome) in enumerate(spec):
        rows.append({"request_id": f"r{i}", "class": cls, "model": "m", "priority": None, "warmup": False,
                     "outcome": outcome, "intended_ns": i * MS, "dispatched_ns": i * MS, "sent_ns": i * MS,
                     "first_token_ns": i * MS + ttft_ms * MS, "first_answer_ns": i * MS + ttft_ms * MS,
                     "last_token_ns": i * MS + (ttft_ms + 10) * MS, "done_ns": i * MS + (ttft_ms + 10) * MS,
                     "output_tokens": 2, "slot_wait_ns": 0, "connected_ns": i * MS})
    return pl.DataFrame(rows)


def test_per_class_bounds_judge_each_class():
    from loadgen import metrics
    rows = _rows([("chat", 150, "ok"), ("chat", 250, "ok"), ("batch", 250, "ok"), ("batch", 900, "ok"),
                  ("batch", 1500, "ok"), ("chat", 100, "http_error")])
    slo = parse_slo("ttft=1s,ttft=200ms@chat")
    m = meets(metrics.latency_columns(rows), pl.DataFrame(schema={"request_id": pl.String, "idx": pl.Int32,
                                                                  "t_ns": pl.Int64, "n_tokens": pl.Int32}), slo)
    # chat is held to 200 ms, batch to the plain 1 s; a failed request meets nothing
    assert m["met"].to_list() == [True, False, True, True, False, False]
    assert bounds_for(slo, "chat") == {"ttft": 200.0} and bounds_for(slo, "batch") == {"ttft": 1000.0}
    # a metric bounded only for a class does not bound the others
    m2 = meets(metrics.latency_columns(rows), m.clear(), parse_slo("ttft=200ms@chat"))
    assert m2["met"].to_list() == [True, False, True, True, True, False]
    tokens = pl.DataFrame(schema={"request_id": pl.String, "idx": pl.Int32, "t_ns": pl.Int64, "n_tokens": pl.Int32})
    g = goodput(metrics.latency_columns(rows), tokens, slo)
    assert (g["met"], g["requests"], g["attainment_by_slo"]) == (3, 6, {"ttft": 0.5})
    b = breakdown(rows, tokens, slo)
    assert b["by_model"] is None   # one model: no per-model section
    assert {c: (x["requests"], x["ok"], x["goodput"]["met"]) for c, x in b["by_class"].items()} == {
        "batch": (3, 3, 2), "chat": (3, 2, 1)}
    assert b["by_class"]["batch"]["latency_ms"]["ttft"]["p99"] == 1500.0


def test_the_engine_serves_lower_priority_values_first():
    # one seat: requests that all wait are admitted by (priority, arrival); fcfs by arrival alone
    def order(policy):
        reqs = [Req(f"r{i}", i, prompt(32, i), 4) for i in range(6)]
        for r, p in zip(reqs, (5, 5, 0, 9, 0, 5)):
            r.priority = p
        simulate(engine(max_num_seqs=1, policy=policy), reqs)
        return [r.request_id for r in sorted(reqs, key=lambda r: r.scheduled_ns)]
    assert order("fcfs") == ["r0", "r1", "r2", "r3", "r4", "r5"]
    # r0 is alone when it arrives; then the waiting ones by (priority, arrival)
    assert order("priority") == ["r0", "r2", "r4", "r1", "r5", "r3"]


def test_priority_preempts_the_largest_priority_value():
    # a KV pool too small for both: the high-priority value (9) is the one preempted, whoever came last
    low, high = Req("low", 0, prompt(200, 1), 200), Req("high", 1, prompt(200, 2), 200)
    low.priority, high.priority = 9, 0
    simulate(engine(max_num_seqs=2, kv_capacity_tokens=640, policy="priority"), [low, high])
    assert low.preemptions >= 1 and high.preemptions == 0
