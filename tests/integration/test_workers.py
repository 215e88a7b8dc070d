"""`loadgen run --workers N` (loadgen/run/workers.py) against the simulator on port 0: one plan, N processes."""
import os
import signal
import subprocess
import sys
import time

import numpy as np
import orjson
import polars as pl
import pytest

from loadgen.results.folder import read_run
from loadgen.sim.truth import read_truth
from tests.integration.conftest import loadgen, report_json, skip_if_host_stalled, workload

FIXED = "--mode fixed --ttft 20ms --itl 5ms"
SESSIONS = """
[session]
turns = { dist = "uniform", min = 2, max = 3 }
think_ms = { dist = "uniform", min = 50, max = 100 }
"""


def plan_of(run_dir):
    # the plan's side of every row, without the run id (each run draws its own)
    req = read_run(run_dir).requests
    return req.select("idx", pl.col("request_id").str.split("-").list.last().alias("n"), "planned_prompt_tokens",
                      "max_tokens", "warmup", "session", "turn",
                      pl.when(pl.col("turn").fill_null(0) == 0).then(pl.col("intended_ns")).alias("planned_ns"))


def test_one_two_and_four_workers_run_the_same_plan(tmp_path):
    w = workload(tmp_path, rate="20/s", requests=40, max_tokens=8, extra=SESSIONS)
    plans, runs = {}, {}
    for n in (1, 2, 4):
        out = tmp_path / f"w{n}"
        p = loadgen("run", w, "--workers", str(n), "--out", str(out), "--quiet", "--no-calibrate",
                    "--sim-args", FIXED, timeout=180)
        assert p.returncode == 0, p.stderr
        runs[n], plans[n] = read_run(out), plan_of(out)
        s = report_json(str(out))
        total = runs[1].requests.height  # 40 conversations of 2-3 turns
        assert s["requests"] == {"scheduled": total, "ok": total, "failed": 0, "dropped": 0, "abandoned": 0}
        assert total > 80
        assert runs[n].requests["worker"].n_unique() == n
        # what the server saw: every request once
        truth = {r["request_id"] for r in read_truth(out / "sim_truth.parquet")}
        assert truth == set(runs[n].requests["request_id"])
    # session turns: the times of later turns depend on the previous reply, so they are compared as plan
    # (turn 0 times are the plan's offsets from t0, identical to the ns)
    assert plans[1].equals(plans[2]) and plans[1].equals(plans[4])
    assert plans[1]["session"].null_count() == 0  # the workload has sessions: the check above covers them
    for n in (2, 4):
        per_session = runs[n].requests.group_by("session").agg(pl.col("worker").n_unique())
        assert (per_session["worker"] == 1).all()  # every conversation stayed in one worker
        m = orjson.loads((runs[n].path / "manifest.json").read_bytes())
        assert [e["worker"] for e in m["workers"]] == list(range(n))
        assert sum(e["requests"] for e in m["workers"]) == total and m["generator"]["workers"] == n
        for e in m["workers"]:
            assert e["status"] == "complete" and e["generator"]["dispatched"] == e["requests"]
    # the HDR logs of the workers merge exactly: same counts as the single process
    s1, s4 = report_json(str(tmp_path / "w1")), report_json(str(tmp_path / "w4"))
    assert s4["histograms"]["e2e"]["count"] == s1["histograms"]["e2e"]["count"] == total


def _dispersion(t_ns: np.ndarray, window_ns: int) -> float:
    counts = np.bincount(((t_ns - t_ns.min()) // window_ns).astype(np.int64))[:-1]  # last window partial
    return float(counts.var() / counts.mean())


def test_two_workers_keep_the_arrival_process_poisson_at_the_server(tmp_path):
    out = tmp_path / "run"
    w = workload(tmp_path, rate="60/s", requests=600, max_tokens=4)
    # the default self-check: on a host too busy to keep the schedule the run must say so (exit 3, the
    # generator's reasons), and a run it calls valid must have offered a Poisson process at the server
    p = loadgen("run", w, "--workers", "2", "--out", str(out), "--quiet", "--no-calibrate", "--sim-args", FIXED,
                "--max-send-lag-p99", "5ms", "--max-rate-deviation", "0.02", "--max-cv-deviation", "0.1",
                timeout=240)
    assert p.returncode in (0, 3), p.stderr
    run = read_run(out)
    if p.returncode == 3:
        reasons = " ".join(run.manifest["invalid_reasons"])
        assert "send_lag p99" in reasons or "achieved rate" in reasons or "arrival shape" in reasons, reasons
        return
    # a valid run kept the client's schedule; the simulator stamps arrivals in its handler, so a park of it
    # bunches them (a 150 ms one moves the dispersion by ~0.15, a 50 ms one by ~0.02): judge the shape where
    # no park of 50 ms or more happened
    skip_if_host_stalled(out, 50, stat="max")
    t0 = run.manifest["t0"]["monotonic_ns"]
    plan = np.sort(run.requests["intended_ns"].to_numpy())
    arrivals = np.sort(np.array([r["arrival_ns"] for r in read_truth(out / "sim_truth.parquet")])) - t0
    assert arrivals.size == 600 and set(run.requests["worker"]) == {0, 1}
    # Poisson: index of dispersion of counts per 200 ms window ~ 1, and as the plan's own (a worker that
    # sent late or in bursts would raise it, a second copy of the plan would double the rate)
    window = 200_000_000
    d_plan, d_srv = _dispersion(plan, window), _dispersion(arrivals, window)
    assert 0.6 < d_plan < 1.5
    assert abs(d_srv - d_plan) < 0.15, (d_srv, d_plan)
    gaps = np.diff(arrivals)
    assert abs(gaps.std() / gaps.mean() - 1) < 0.15
    assert abs((arrivals.size - 1) * 1e9 / (arrivals[-1] - arrivals[0]) / 60 - 1) < 0.15


def test_a_worker_that_dies_is_reported_and_its_requests_recorded_as_dropped(tmp_path):
    out = tmp_path / "run"
    w = workload(tmp_path, rate="20/s", requests=200, max_tokens=4)
    proc = subprocess.Popen([sys.executable, "-m", "loadgen", "run", w, "--workers", "2", "--out", str(out),
                             "--quiet", "--no-calibrate", "--sim-args", FIXED],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        manifest = out / "manifest.json"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # the driver writes the manifest, with the workers' pids, at t0
            if manifest.is_file():
                break
            time.sleep(0.1)
        time.sleep(3)  # a few seconds into the 10 s run
        running = orjson.loads(manifest.read_bytes())
        assert running["status"] == "running" and running["host"]["pid"] == proc.pid
        os.kill(running["workers"][1]["pid"], signal.SIGKILL)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 3, err  # invalid: one of its processes died
    m = orjson.loads((out / "manifest.json").read_bytes())
    assert m["status"] == "invalid" and m["workers"][1]["status"] == "died"
    assert any("worker 1" in r and "died" in r for r in m["invalid_reasons"])
    # the shares, the dead one's too, merged into the files of a single process
    assert (out / "requests.parquet").is_file() and (out / "e2e.hlog").is_file() and not (out / "_parts").exists()
    req = read_run(out).requests
    assert req.height == 200 and req["idx"].n_unique() == 200  # still exactly one row per request
    lost = req.filter(pl.col("error_kind") == "worker_died")
    assert lost.height == m["workers"][1]["dropped"] > 0
    assert set(lost["worker"]) == {1} and set(lost["outcome"]) == {"dropped"}
    assert req.filter(pl.col("worker") == 0)["outcome"].to_list() == ["ok"] * 100
    s = report_json(str(out))
    assert s["requests"]["dropped"] == lost.height and s["valid"] is False
    assert any("worker 1" in r for r in s["invalid_reasons"])


@pytest.mark.parametrize("value", ["0", "-2", "many"])
def test_a_bad_worker_count_is_refused(tmp_path, value):
    p = loadgen("run", workload(tmp_path), "--workers", value, "--out", str(tmp_path / "r"))
    assert p.returncode == 2 and "--workers" in p.stderr and "Traceback" not in p.stderr
