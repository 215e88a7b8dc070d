"""Property tests: any workload TOML built from the documented keys, with good and bad values,
loads into a RunConfig or fails with ConfigError naming what is wrong, and a loaded one plans; any rows
in the four trace formats read into a sorted trace or fail with TraceError naming lines, and with
skip_bad_rows every row is either kept or counted. Never another exception."""
from __future__ import annotations

import copy
import json
import math

import numpy as np
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from loadgen.config import sections
from loadgen.config import workload as config
from loadgen.config.options import OPTIONS
from loadgen.plan import traces
from loadgen.plan.limits import check_config, check_schedule
from loadgen.config.workload import ConfigError
from loadgen.plan.schedule import build
from loadgen.plan.traces import TraceError

SETTINGS = settings(max_examples=150, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])

ODD = st.sampled_from(["", "x", "-1", "1e400", "nan", "8/s", "0/s", "-3/s", "2.5s", "60s", "0s", "1..4", "5..2"])
SCALAR = st.one_of(st.integers(-5, 200), st.floats(-10, 1e4, allow_nan=False), st.booleans(), ODD)
def _maybe_bad(good, bad=SCALAR):
    # one value in ten is bad, so that whole workloads are often good and reach the planner
    return st.integers(0, 9).flatmap(lambda i: bad if i == 0 else good)


GOOD_LENGTH = st.one_of(
    st.integers(1, 3000),
    st.integers(1, 500).flatmap(lambda lo: st.fixed_dictionaries(
        {"dist": st.just("uniform"), "min": st.just(lo), "max": st.integers(lo, lo + 500)})),
    st.fixed_dictionaries({"dist": st.just("lognormal"), "median": st.integers(2, 800),
                           "sigma": st.floats(0.1, 1.5), "min": st.just(1), "max": st.just(4000)}))
LENGTH = _maybe_bad(GOOD_LENGTH, st.one_of(
    st.integers(-3, 3000), ODD,
    st.fixed_dictionaries({"dist": st.sampled_from(["uniform", "normal", "lognormal", "fixed", "bogus"])},
                          optional={"min": st.integers(-2, 500), "max": st.integers(-2, 4000),
                                    "mean": st.integers(-5, 800), "sd": st.integers(-1, 200),
                                    "median": st.integers(-5, 800), "sigma": st.floats(-1, 2),
                                    "value": st.integers(-1, 100)})))


def _toml(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    return "{ " + ", ".join(f"{k} = {_toml(x)}" for k, x in v.items()) + " }"


WORKLOADS = st.fixed_dictionaries(
    {"model": _maybe_bad(st.just("m")),
     "arrivals": st.fixed_dictionaries(
         {"rate": _maybe_bad(st.sampled_from(["5/s", "50/s", "0.5/s"]))},
         optional={"process": st.sampled_from(["poisson", "constant", "gamma", "ramp", "bogus"]),
                   "burstiness": _maybe_bad(st.floats(0.2, 4)), "rate_from": st.sampled_from(["1/s", "1/s", "x"]),
                   "ramp": st.sampled_from(["2s", "2s", "-1s"])}),
     "run": st.one_of(
         st.fixed_dictionaries({"requests": _maybe_bad(st.integers(1, 60))}),
         st.fixed_dictionaries({"duration": st.sampled_from(["2s", "2s", "0s", "x"])}),
         st.fixed_dictionaries({}, optional={"requests": st.integers(1, 9), "duration": st.just("1s")}),
     ).flatmap(lambda r: st.fixed_dictionaries({**{k: st.just(v) for k, v in r.items()}}, optional={
         "warmup_requests": st.integers(-1, 3), "max_concurrency": _maybe_bad(st.integers(0, 9)),
         "request_timeout": _maybe_bad(st.just("10s"))})),
     "prompt": st.fixed_dictionaries({"tokens": LENGTH}),
     "output": st.fixed_dictionaries({"tokens": LENGTH})},
    optional={"api": st.sampled_from(["chat", "completions", "chat", "completions", "bogus"]),
              "seed": _maybe_bad(st.integers(0, 99)),
              "prefix": st.fixed_dictionaries({"tokens": st.integers(-1, 400)},
                                              optional={"groups": st.integers(-1, 5),
                                                        "fraction": st.floats(-0.5, 1.5)}),
              "session": st.fixed_dictionaries({"turns": LENGTH}, optional={"think_ms": LENGTH})})


def _text(w: dict) -> str:
    top = [f"{k} = {_toml(v)}" for k, v in w.items() if not isinstance(v, dict)]
    tables = [f"[{k}]\n" + "\n".join(f"{kk} = {_toml(vv)}" for kk, vv in v.items())
              for k, v in w.items() if isinstance(v, dict)]
    return "\n".join(top + tables) + "\n"


@SETTINGS
@given(w=WORKLOADS)
def test_any_workload_loads_or_names_its_problems(tmp_path, w):
    p = tmp_path / "w.toml"
    p.write_text(_text(w))
    try:
        cfg = config.load(p)
    except ConfigError as e:
        assert e.problems and all(isinstance(x, str) and x for x in e.problems)
        event("workload refused")
        return
    try:
        s = build(cfg)
    except ConfigError as e:  # limits and plan-time checks are input errors too
        assert e.problems
        event("plan refused")
        return
    event("workload planned")
    assert np.all(s.prompt_tokens >= 1) and np.all(s.max_tokens >= 1)
    timed = s.intended_ns[s.intended_ns >= 0]
    assert np.all(np.diff(timed) >= 0)
    if cfg.session is None and cfg.requests is not None:
        assert len(s) == cfg.requests


GOOD = st.integers(0, 10**6)
NUM = st.one_of(GOOD, GOOD, GOOD, GOOD, GOOD, GOOD, st.integers(-5, 10**6), st.integers(2**63 - 3, 2**64 + 5),
                st.floats(allow_nan=True, allow_infinity=True),
                st.sampled_from(["", "x", "nan", "inf", "-1", "1e30"]))
ROW = st.one_of(st.tuples(GOOD, GOOD, GOOD), st.tuples(NUM, NUM, NUM))


def _write(tmp_path, fmt: str, rows: list, ragged: list[bool]) -> tuple:
    if fmt == "azure":
        lines = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
        for (t, a, b), rg in zip(rows, ragged):
            minute = int(abs(t)) % 60 if isinstance(t, int) else 0
            ts = t if isinstance(t, str) else f"2024-01-01 00:{minute:02d}:00"
            lines.append(f"{ts},{str(a)},{str(b)}" + (",9" if rg else ""))
        name = "t.csv"
    elif fmt == "burstgpt":
        lines = ["Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type"]
        lines += [f"{str(t)},m,{str(a)},{str(b)},0,x" + (",9" if rg else "")
                  for (t, a, b), rg in zip(rows, ragged)]
        name = "t.csv"
    else:
        keys = (("timestamp", "input_length", "output_length") if fmt == "mooncake"
                else ("intended_ns", "prompt_tokens", "max_tokens"))
        lines = []
        for (t, a, b), rg in zip(rows, ragged):
            obj = dict(zip(keys, (t, a, b)))
            text = json.dumps(obj, allow_nan=True)
            lines.append(text[:-3] if rg else text)  # a cut line: not JSON
        name = "t.jsonl"
    p = tmp_path / name
    p.write_text("\n".join(lines) + "\n")
    return p, len(rows)


@SETTINGS
@given(fmt=st.sampled_from(traces.FORMATS), rows=st.lists(ROW, max_size=25), data=st.data())
def test_any_trace_reads_or_names_its_lines(tmp_path, fmt, rows, data):
    ragged = data.draw(st.lists(st.booleans(), min_size=len(rows), max_size=len(rows)))
    p, n = _write(tmp_path, fmt, rows, ragged)
    for skip in (False, True):
        try:
            t = traces.read(p, fmt, skip_bad_rows=skip)
        except TraceError as e:
            assert e.problems and all(str(p) in x for x in e.problems)
            event(f"trace refused (skip={skip})")
            continue
        event(f"trace read (skip={skip})")
        assert len(t) >= 1 and t.timestamps_ns.dtype == np.int64 and np.all(np.diff(t.timestamps_ns) >= 0)
        assert np.all(t.prompt_tokens >= 0) and np.all(t.output_tokens >= 0)
        assert len(t) + sum(t.skipped.values()) == n
        if not skip:
            assert not t.skipped.get("bad_rows")


# Issue 25 item 5: every flag of the option table and every workload key, drawn with hostile values (huge,
# negative, NaN, inf, the wrong type, empty): loading names the problem (ConfigError) or gives a config that
# plans (or whose plan is refused by name). Never another exception. In process, no subprocess: cheap.
HUGE = st.sampled_from([2**63 - 1, 2**63, 2**64 + 1, -(2**63) - 1, 10**30, -1, 0])
HOSTILE_VALUE = st.one_of(
    HUGE, st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([math.nan, math.inf, -math.inf, 1e308]),
    st.booleans(), st.sampled_from(["", " ", "x", "nan", "inf", "-inf", "1e400s", "0s", "-5s", "nan/s", "²", "1..0"]),
    st.text(max_size=6), st.just([]), st.lists(st.one_of(HUGE, st.floats(), st.text(max_size=3)), max_size=3),
    st.just({}), st.fixed_dictionaries({"dist": st.sampled_from(["normal", "lognormal", "uniform", "mixture"])},
                                       optional={"mean": st.floats(), "sd": st.floats(), "median": st.floats(),
                                                 "sigma": st.floats(), "min": HUGE, "max": HUGE,
                                                 "components": st.just([{"weight": math.inf, "value": 3}])}))
HOSTILE_TEXT = st.one_of(
    HUGE.map(str), st.floats(allow_nan=True, allow_infinity=True).map(repr), st.text(max_size=8),
    st.sampled_from(["", " ", "-1", "0", "nan", "inf", "-inf", "1e400", "0s", "1e400s", "-5s", "nan/s", "inf/s",
                     "1%", "150%", "²", "1..0", "4..18446744073709551617", "http://[::1", "http://h:0", "K: V",
                     "ttft=nan", "ttft=0ms", "auto", "x" * 300]))
GOOD_WORKLOAD = {"arrivals": {"rate": "50/s"}, "run": {"requests": 5}, "prompt": {"tokens": 8},
                 "output": {"tokens": 4}}
WORKLOAD_KEYS = sorted((t, k) for t, keys in sections.KEYS.items() for k in keys)
FLAG_OPTIONS = [o for o in OPTIONS if o.flag]
DRAWN: dict[str, int] = {"workload values": 0, "flag values": 0}


def _toml_value(v) -> str:
    if isinstance(v, float):
        return "nan" if math.isnan(v) else ("inf" if v == math.inf else "-inf" if v == -math.inf else repr(v))
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{json.dumps(k)} = {_toml_value(x)}" for k, x in v.items()) + " }"
    return _toml(v)


def _document(w: dict) -> str:
    top = [f"{k} = {_toml_value(v)}" for k, v in w.items() if not isinstance(v, dict)]
    tables = [f"[{k}]\n" + "\n".join(f"{json.dumps(kk)} = {_toml_value(vv)}" for kk, vv in v.items())
              for k, v in w.items() if isinstance(v, dict)]
    return "\n".join(top + tables) + "\n"


def _plans_or_names_its_problem(load) -> str:
    """load() -> RunConfig: it loads and plans, or a ConfigError names each problem; what happened."""
    try:
        cfg = load()
        check_config(cfg)
        if (cfg.requests or 0) > 2_000 or cfg.duration_ns is not None or cfg.session is not None:
            return "loaded (too big to plan cheaply)"
        s = build(cfg)
        check_schedule(s.prompt_tokens, s.max_tokens)
    except ConfigError as e:
        assert e.problems and all(isinstance(x, str) and x.strip() for x in e.problems)
        return "refused by name"
    assert np.all(s.prompt_tokens >= 1) and np.all(s.max_tokens >= 1)
    return "planned"


@SETTINGS
@given(picks=st.lists(st.tuples(st.sampled_from(WORKLOAD_KEYS), HOSTILE_VALUE), min_size=1, max_size=3))
def test_every_workload_key_with_hostile_values(tmp_path, picks):
    w = {t: dict(v) for t, v in GOOD_WORKLOAD.items()}
    for (table, key), value in picks:
        # a copy: st.just({}) draws one shared dict, which this loop would otherwise fill, across examples
        # and even with itself (a cycle that recursed in _toml_value)
        (w.setdefault(table, {}) if table and isinstance(w.get(table, {}), dict) else w)[key] = copy.deepcopy(value)
        DRAWN["workload values"] += 1
    p = tmp_path / "w.toml"
    p.write_text(_document(w))
    event(_plans_or_names_its_problem(lambda: config.load(p)))


@SETTINGS
@given(picks=st.lists(st.tuples(st.sampled_from(FLAG_OPTIONS), HOSTILE_TEXT), min_size=1, max_size=3),
       with_file=st.booleans())
def test_every_flag_with_hostile_values(tmp_path, picks, with_file):
    # values as argparse gives them: text, True for a switch, a list for a repeated flag
    given = {o.flag: (True if o.switch else [text] if o.repeat else text) for o, text in picks}
    DRAWN["flag values"] += len(given)
    w = None
    if with_file:
        w = tmp_path / "w.toml"
        w.write_text(_document(GOOD_WORKLOAD))
    else:
        given = {"--rate": "50/s", "--prompt-tokens": "8", "--max-tokens": "4", "--requests": "5", **given}
    event(_plans_or_names_its_problem(lambda: config.load_run(w, given)[0]))


FIELD_OPTIONS = [o for o in OPTIONS if o.field and not o.client and "." not in o.field]


@SETTINGS
@given(picks=st.lists(st.tuples(st.sampled_from(FIELD_OPTIONS), HOSTILE_VALUE), min_size=1, max_size=2))
def test_with_overrides_checks_every_field_it_is_given(picks):
    # a field set after loading (the sweep's rate, the worker count) gets its row's check: NaN, inf, a
    # value beyond int64 and the wrong type are refused by name, never planned
    base = config.load_run(None, {"--rate": "50/s", "--prompt-tokens": "8", "--max-tokens": "4",
                                  "--requests": "5"})[0]
    changes = {o.field: v for o, v in picks}
    DRAWN["flag values"] += len(changes)
    event(_plans_or_names_its_problem(lambda: config.with_overrides(base, "test", **changes)))


def test_zz_the_hostile_draws_were_made():
    # after the three properties above (file order): how many hostile values they drew, for the record
    print(f"\nhostile values drawn: {DRAWN}")
    assert DRAWN["workload values"] >= SETTINGS.max_examples and DRAWN["flag values"] >= SETTINGS.max_examples
