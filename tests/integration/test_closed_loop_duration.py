"""A closed loop bounded by a duration (--concurrency N --duration D, k6's constant-vus) end to end against
the built-in simulator: no request starts after t0 + D, one row per request the users reached, the run
complete (not lost) by its own manifest, and a pool used up before the deadline said out loud.
Judged on the run's own stamps (ns from t0), never on how long the test took."""
import orjson
import polars as pl
import pytest

from loadgen.results.folder import read_run
from tests.integration.conftest import loadgen, report_json, workload

FAST = "--mode fixed --ttft 20ms --itl 2ms"   # ~35 ms a request of 8 tokens
SECOND = 1_000_000_000


def run_for(tmp_path, *flags: str, duration_s: int = 3, timeout: float = 200):
    out = tmp_path / "run"
    p = loadgen("run", workload(tmp_path, max_tokens=8), "--duration", f"{duration_s}s", *flags,
                "--out", str(out), "--no-calibrate", "--sim-args", FAST, timeout=timeout)
    return p, out


def check_bounded(out, duration_s: int, users: int) -> pl.DataFrame:
    """What every duration-bounded run holds to; returns its rows."""
    run = read_run(out)
    m, req = run.manifest, run.requests
    # one row per scheduled request: the manifest's planned count is the rows', so the run is complete
    assert m["status"] == "complete" and m["schedule"]["requests"] == req.height == m["schedule"]["pool"]["scheduled"]
    assert req["idx"].n_unique() == req.height and req["request_id"].n_unique() == req.height
    assert m["schedule"]["pool"]["unused"] == m["schedule"]["pool"]["requests"] - req.height
    assert m["load"] == {**m["load"], "loop": "closed", "bound": "duration", "duration_s": float(duration_s),
                         "concurrency": users}
    # no dispatch after t0 + duration (the start is judged by the dispatch stamp itself)
    deadline_ns = duration_s * SECOND
    assert req["dispatched_ns"].null_count() == 0 and req["dispatched_ns"].max() <= deadline_ns
    assert (req["intended_ns"] <= req["dispatched_ns"]).all()
    text = loadgen("report", str(out)).stdout
    assert f"for {duration_s} s" in text and "(complete)" in text, text
    assert report_json(str(out))["valid"]
    return req


def test_a_duration_bounded_closed_loop_runs_until_its_deadline(tmp_path):
    users, duration_s = 4, 3
    p, out = run_for(tmp_path, "--concurrency", str(users), "--max-user-rate", "200/s", duration_s=duration_s)
    assert p.returncode == 0, p.stderr
    assert "WARNING" not in p.stderr, p.stderr
    req = check_bounded(out, duration_s, users)
    m = read_run(out).manifest
    assert m["schedule"]["pool"] == {**m["schedule"]["pool"], "requests": users * 600, "per_user": 600,
                                     "exhausted": False, "exhausted_at_s": None}
    assert (req["outcome"] == "ok").all()
    # The users kept sending until the deadline: a user stops only when its request ends (done, then its
    # loop callback) after the deadline, so the last dispatch is at most one request (the longest,
    # dispatch to done) plus the client's own loop lateness before it.
    service_ns = (req["done_ns"] - req["dispatched_ns"]).max()
    late_ns = int(m["generator"]["loop_lateness_ms"]["max"] * 1e6)
    assert duration_s * SECOND - req["dispatched_ns"].max() <= 2 * service_ns + late_ns
    # never more than the users in flight
    starts, ends = req.sort("dispatched_ns")["dispatched_ns"].to_numpy(), req["done_ns"].to_numpy()
    assert max((starts[: i + 1] <= t).sum() - (ends <= t).sum() for i, t in enumerate(starts)) <= users


def test_a_pool_used_up_before_the_deadline_warns_and_is_recorded(tmp_path):
    # 2 users, 10 s at 1/s each: a pool of 20 requests, used up by ~35 ms requests long before the deadline
    p, out = run_for(tmp_path, "--concurrency", "2", "--max-user-rate", "1/s", duration_s=10)
    assert p.returncode == 0, p.stderr
    assert "WARNING: the closed loop's pool of 20 requests (10 per user" in p.stderr, p.stderr
    assert "raise --max-user-rate" in p.stderr
    m = read_run(out).manifest
    pool = m["schedule"]["pool"]
    assert pool["exhausted"] is True and pool["requests"] == pool["scheduled"] == 20 and pool["unused"] == 0
    req = check_bounded(out, 10, 2)
    # it ended early, and says when: after the last dispatch, before the deadline
    assert req["dispatched_ns"].max() / SECOND <= pool["exhausted_at_s"] < 10
    assert m["load"]["pool_exhausted_at_s"] == pool["exhausted_at_s"]
    assert "WARNING: the users used up the pool" in loadgen("report", str(out)).stdout


def test_workers_share_the_users_and_stop_at_the_same_deadline(tmp_path):
    users, duration_s = 4, 3
    p, out = run_for(tmp_path, "--concurrency", str(users), "--think-time", "20ms", "--workers", "2",
                     "--max-user-rate", "100/s", duration_s=duration_s)
    assert p.returncode == 0, p.stderr
    req = check_bounded(out, duration_s, users)
    m = read_run(out).manifest
    # each worker ran its 2 users: both sent, each its own rows, which add up to the run's
    counts = dict(req.group_by("worker").len().rows())
    assert sorted(counts) == [0, 1] and all(n > 2 for n in counts.values())
    assert {w["worker"]: w["requests"] for w in m["workers"]} == counts
    # one t0 for both; each worker's users kept to the shared deadline (check_bounded) and used no more
    # than its half of the pool
    assert all(n <= m["schedule"]["pool"]["requests"] // 2 for n in counts.values())
    assert orjson.loads((out / "manifest.json").read_bytes())["schedule"]["pool"]["exhausted"] is False


@pytest.mark.parametrize("flags, message", [
    # every request of rate inf is due at t0: a duration cannot bound it
    (["--rate", "inf"], 'rate = "inf" puts every request at t0, so it needs run.requests'),
])
def test_rate_inf_with_a_duration_exits_2_naming_the_flag(tmp_path, flags, message):
    p = loadgen("run", workload(tmp_path), "--duration", "5s", *flags, "--url", "http://127.0.0.1:9", "--quiet")
    assert p.returncode == 2 and message in p.stderr and "--rate" in p.stderr, p.stderr
    assert "Traceback" not in p.stderr
