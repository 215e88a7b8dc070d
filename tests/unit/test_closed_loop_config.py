"""Workload keys and flags of the closed loop: run.concurrency, run.think_time, rate = "inf",
and the plans they make (loadgen/config/workload.py, loadgen/plan/schedule.py)."""
import math
import re
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


@pytest.mark.parametrize("run, users, think_ms, rate_per_s, per_user", [
    # 2 users for 10 s at the default ceiling of 10/s: 100 rows each
    ("duration = \"10s\"\nconcurrency = 2", 2, 0.0, 10.0, 100),
    # the ceiling from the file; a fraction of a request rounds up
    ("duration = \"2.5s\"\nconcurrency = 3\nmax_user_rate = \"3/s\"", 3, 0.0, 3.0, 8),
    # a think time of 1 s bounds a user to floor(10 / 1) + 1 = 11 sends: fewer than 10/s x 10 s
    ("duration = \"10s\"\nconcurrency = 4\nthink_time = \"1s\"", 4, 1000.0, 10.0, 11),
    # per minute, as any rate
    ("duration = \"1m\"\nconcurrency = 1\nmax_user_rate = \"30/m\"", 1, 0.0, 0.5, 30),
])
def test_a_closed_loop_bounded_by_a_duration_plans_a_pool(tmp_path, run, users, think_ms, rate_per_s, per_user):
    cfg = load(write(tmp_path, run))
    model = load_model(cfg)
    assert model["loop"] == "closed" and model["bound"] == "duration" and model["concurrency"] == users
    assert model["think_ms"] == think_ms and cfg.max_user_rate_per_s == rate_per_s
    s = build(cfg)
    # every row of the pool is due at t0: the runner times each one when a user is free
    assert len(s) == users * per_user and (s.intended_ns == 0).all()
    assert s.info["pool"] == {"requests": users * per_user, "per_user": per_user, "max_user_rate_per_s": rate_per_s}


def test_flags_make_a_duration_closed_loop_and_replace_the_files_requests(tmp_path):
    cfg = load(write(tmp_path, "requests = 10"), {"--concurrency": "3", "--duration": "4s", "--max-user-rate": "5/s"})
    assert cfg.requests is None and cfg.duration_ns == 4_000_000_000 and len(build(cfg)) == 3 * 20


@pytest.mark.parametrize("flags, message", [
    # a bad ceiling is named by its flag
    ({"--concurrency": "2", "--duration": "4s", "--max-user-rate": "lots"}, "--max-user-rate: bad rate 'lots'"),
    # and so is one that does not apply
    ({"--max-user-rate": "5/s"}, "--max-user-rate: only applies to a closed loop bounded by a duration"),
    # rate inf and a duration: named by --rate
    ({"--rate": "inf", "--duration": "4s"}, '--rate: rate = "inf" puts every request at t0'),
])
def test_bad_duration_closed_loop_flags_name_the_flag(tmp_path, flags, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        load(write(tmp_path, "requests = 10"), flags)


def test_the_bound_of_a_request_count_closed_loop(tmp_path):
    model = load_model(load(write(tmp_path, "requests = 10\nconcurrency = 2")))
    assert model["bound"] == "requests" and model["requests"] == 10 and "duration_s" not in model


@pytest.mark.parametrize("run, rate, message", [
    # rate = inf puts every request at t0: its length is a count of requests, never a duration
    ("duration = \"10s\"", '"inf"', 'arrivals.rate: rate = "inf" puts every request at t0, so it needs run.requests'),
    # the pool's ceiling belongs to a closed loop bounded by a duration
    ("requests = 5\nconcurrency = 2\nmax_user_rate = \"5/s\"", '"8/s"',
     "run.max_user_rate: only applies to a closed loop bounded by a duration"),
    ("duration = \"5s\"\nmax_user_rate = \"5/s\"", '"8/s"', "run.max_user_rate: only applies"),
    # a bad ceiling names its key
    ("duration = \"5s\"\nconcurrency = 2\nmax_user_rate = \"fast\"", '"8/s"', "run.max_user_rate: bad rate 'fast'"),
    ("duration = \"5s\"\nconcurrency = 2\nmax_user_rate = 0", '"8/s"', "run.max_user_rate: bad rate 0"),
    ("duration = \"5s\"\nconcurrency = 2\nmax_user_rate = \"inf\"", '"8/s"', "run.max_user_rate: bad rate"),
    # both bounds at once is still one too many
    ("duration = \"5s\"\nrequests = 5\nconcurrency = 2", '"8/s"', "give exactly one of requests or duration"),
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


@pytest.mark.parametrize("run", ["duration = \"10s\"\nconcurrency = 4", "requests = 10\nconcurrency = 4"])
def test_workers_auto_takes_one_worker_for_a_closed_loop(tmp_path, run):
    # its plan has no rate to size the workers by (every row due at t0): one, not a NaN traceback
    from loadgen.config.workload import with_overrides
    from loadgen.run.workers import count_for
    cfg = with_overrides(load(write(tmp_path, run)), workers=0)
    assert count_for(cfg, build(cfg)) == 1


def test_a_workers_share_plans_the_whole_pool(tmp_path):
    # every worker builds the same plan (the pool of all the users) and runs its share of it
    from loadgen.run.workers import assign, weights_of, worker_config
    cfg = load(write(tmp_path, "duration = \"2s\"\nconcurrency = 3\nmax_user_rate = \"5/s\""))
    shares = [worker_config(cfg, 2, w) for w in range(2)]
    assert [c.concurrency for c in shares] == [2, 1]
    assert all(len(build(c)) == len(build(cfg)) == 30 for c in shares)
    owner = assign(build(cfg), 2, weights_of(cfg, 2))
    assert [(owner == w).sum() for w in range(2)] == [20, 10]   # 10 per user
