"""Workload keys and flags of the closed loop: run.concurrency, run.think_time, rate = "inf",
and the plans they make (loadgen/config/workload.py, loadgen/plan/schedule.py)."""
import math
import textwrap

import pytest

from loadgen.client.closedloop import load_model
from loadgen.config.workload import ConfigError, load
from loadgen.plan.schedule import build


def write(tmp_path, run: str, rate: str = '"8/s"') -> str:
    p = tmp_path / "w.toml"
    p.write_text(textwrap.dedent(f"""
        model = "m"
        [arrivals]
        rate = {rate}
        [run]
        {run}
        [prompt]
        tokens = 16
        [output]
        tokens = 4
        """))
    return str(p)


@pytest.mark.parametrize("run, rate, loop, extra", [
    # a closed loop from the file: 4 users, 250 ms of think time; the rate is ignored
    ("requests = 10\nconcurrency = 4\nthink_time = \"250ms\"", '"8/s"', "closed",
     {"concurrency": 4, "think_ms": 250.0}),
    # rate = "inf" with a cap: all due at t0, paced by the cap
    ("requests = 10\nmax_concurrency = 2", '"inf"', "closed", {"rate": "inf", "max_concurrency": 2}),
    # an ordinary open loop with a cap stays open
    ("requests = 10\nmax_concurrency = 2", '"8/s"', "open", {"max_concurrency": 2}),
])
def test_load_models(tmp_path, run, rate, loop, extra):
    cfg = load(write(tmp_path, run, rate))
    model = load_model(cfg)
    assert model["loop"] == loop and {k: model[k] for k in extra} == extra
    s = build(cfg)
    if loop == "closed":
        assert (s.intended_ns == 0).all() and len(s) == 10  # the runner times them, not the plan
    else:
        assert s.intended_ns[-1] > 0


def test_rate_inf_is_infinite_in_the_config(tmp_path):
    assert math.isinf(load(write(tmp_path, "requests = 5", '"inf"')).arrivals.rate_per_s)


@pytest.mark.parametrize("run, rate, message", [
    # a closed loop's length is a count of requests
    ("duration = \"10s\"\nconcurrency = 2", '"8/s"', "needs run.requests"),
    # so is rate = inf's
    ("duration = \"10s\"", '"inf"', "needs run.requests"),
    # two load models at once
    ("requests = 5\nconcurrency = 2\nmax_concurrency = 3", '"8/s"', "not both"),
    # think time belongs to a closed loop
    ("requests = 5\nthink_time = \"1s\"", '"8/s"', "only applies to a closed loop"),
    # a bad think time names its key
    ("requests = 5\nconcurrency = 2\nthink_time = \"soon\"", '"8/s"', "run.think_time"),
])
def test_bad_closed_loop_keys(tmp_path, run, rate, message):
    with pytest.raises(ConfigError, match=message):
        load(write(tmp_path, run, rate))
