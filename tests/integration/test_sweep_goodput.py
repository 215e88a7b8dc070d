"""Issue 10 end to end against the built-in simulator: the sweep's knee against the engine's own
capacity from its truth file, max goodput confirmed by separate runs, interrupt and --resume."""
import math
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import orjson

from loadgen.sim.truth import read_truth
from tests.integration.conftest import loadgen, report_json, skip_if_host_stalled

# An engine with a hard capacity: 4 sequences at most, so requests past it queue (h100-sxm profile).
ENGINE = "--profile h100-sxm --max-num-seqs 4 --per-request-metrics --speed 2"  # 2x faster than the profile


def engine_workload(tmp_path, requests=60, seed=5) -> str:
    p = tmp_path / "engine.toml"
    p.write_text(textwrap.dedent(f"""
        model = "sim"
        api = "completions"
        seed = {seed}
        [arrivals]
        process = "poisson"
        rate = "1/s"
        [run]
        requests = {requests}
        drain_timeout = "30s"
        # a shared 2-core machine: the self-check's rules are unit-tested; the knee is the server's
        max_send_lag_p99 = "10s"
        max_lag_share = 1
        max_rate_deviation = 10
        max_cv_deviation = 100
        [prompt]
        tokens = {{ dist = "uniform", min = 128, max = 384 }}
        tokenizer = "approximate"
        [output]
        tokens = 32
        [request]
        extra_body = {{ ignore_eos = true }}
        """))
    return str(p)


def truth_capacity_per_s(truth_file) -> float:
    """The engine's capacity from its own truth: at an overloaded point the running set is full all the
    time, so by Little's law capacity = (sequences in service at once) / (mean time in service), where
    time in service = finish - scheduled and the number in service is the time-weighted median of the
    count of those intervals open at once (the engine's batch limit as it behaved; the median, because a
    request scheduled in the step that sends another's last token overlaps it for a moment)."""
    rows = [r for r in read_truth(truth_file) if r["outcome"] == "ok"]
    start = np.array([r["scheduled_ns"] for r in rows])
    end = np.array([r["finish_ns"] for r in rows])
    events = sorted([(t, 1) for t in start] + [(t, -1) for t in end], key=lambda e: (e[0], e[1]))
    times = np.array([t for t, _ in events], dtype=np.float64)
    running = np.cumsum([d for _, d in events])[:-1]
    held = np.diff(times)  # how long each count lasted
    order = np.argsort(running, kind="stable")
    median_running = running[order][np.searchsorted(np.cumsum(held[order]), held.sum() / 2)]
    return float(median_running) / float(np.mean(end - start) / 1e9)


def test_sweep_finds_the_knee_within_15_percent_of_the_engines_capacity(tmp_path):
    out = tmp_path / "sweep"
    p = loadgen("sweep", engine_workload(tmp_path), "--start", "16/s", "--factor", "2", "--refine", "3",
                "--out", str(out), "--no-calibrate", "--quiet", "--sim-args", ENGINE, timeout=400)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip().splitlines()[-1] == str(out)
    s = orjson.loads((out / "sweep_summary.json").read_bytes())
    k = s["knee"]
    assert k["saturated"] and k["rate_per_s"] is not None, s["knee"]
    for q in s["points"]:  # each point's rate against the engine's capacity: the engine kept its profile
        skip_if_host_stalled(out / q["dir"])
    # The most overloaded point: the engine was full throughout; its truth gives the capacity.
    top = max(s["points"], key=lambda q: q["rate_per_s"])
    capacity = truth_capacity_per_s(out / top["dir"] / "sim_truth.parquet")
    assert abs(k["offered_per_s"] / capacity - 1) <= 0.15, (k, capacity)
    # past the knee the completion rate stays at about the capacity, whatever is offered
    assert abs(top["completed_per_s"] / capacity - 1) < 0.15
    # the summary states the search and shows queueing taking over past the knee
    assert s["search"]["points"] == len(s["points"]) >= 5 and s["search"]["resolution_rel"] < 0.15
    low = min(s["points"], key=lambda q: q["rate_per_s"])
    assert top["decomposition_mean_ms"]["queue"] > 3 * low["decomposition_mean_ms"]["queue"]
    assert (out / "sweep_summary.txt").read_text().count("knee") >= 1
    manifest = orjson.loads((out / "sweep.json").read_bytes())
    assert manifest["status"] == "complete" and len(manifest["points"]) == len(s["points"])


def test_max_goodput_is_met_by_a_confirmation_run_and_missed_at_1_2x(tmp_path):
    w = engine_workload(tmp_path)
    # At the profile's own speed (not --speed 2): the rates that decide, near the SLO's cliff, then ask
    # half the simulator's CPU, so a busy 2-core host still lets it keep its timings there.
    engine = ENGINE.replace("--speed 2", "--speed 1")
    slo = "ttft=1000ms,tpot=20ms"
    out = tmp_path / "mg"
    p = loadgen("sweep", w, "--start", "8/s", "--refine", "3", "--max-goodput", "--attainment", "0.9",
                "--slo", slo, "--out", str(out), "--no-calibrate", "--quiet", "--sim-args", engine, timeout=400)
    assert p.returncode == 0, p.stderr
    s = orjson.loads((out / "sweep_summary.json").read_bytes())
    best = s["max_goodput"]["rate_per_s"]
    assert best is not None and s["search"]["hi"] is not None, s["search"]
    assert s["search"]["resolution_rel"] < 0.2  # stated, and finer than the 1.2x check below
    # a rate past the knee meets the SLOs only because a short run ends before its queue grows: said
    past_knee = s["knee"]["rate_per_s"] is not None and best > s["knee"]["rate_per_s"]
    assert s["max_goodput"]["keeps_up"] is (not past_knee)
    assert ("WARNING: past the knee" in (out / "sweep_summary.txt").read_text()) is past_knee
    # attainment near a 1000 ms TTFT cliff and a 20 ms TPOT: a run the host parked for 100-500 ms (a sweep
    # point, which moves `best`, or a confirmation run) cannot judge it
    for q in s["points"]:
        skip_if_host_stalled(out / q["dir"])
    # `best` is by construction the highest rate whose run reached 0.9, so a rerun there lands near 0.9 on
    # either side: it must meet the target up to a finite run's sampling error (two binomial standard
    # errors: 0.077 at 60 requests); 1.2x past it, a run misses outright.
    for rate, meets in ((best, True), (round(best * 1.2, 3), False)):
        run = tmp_path / f"confirm-{rate}"
        p = loadgen("run", w, "--rate", f"{rate}/s", "--slo", slo, "--out", str(run), "--no-calibrate",
                    "--quiet", "--sim-args", engine, timeout=200)
        assert p.returncode == 0, p.stderr
        skip_if_host_stalled(run)
        g = report_json(str(run))["goodput"]  # the SLO was recorded by `run --slo`
        if meets:
            assert g["attainment"] >= 0.9 - 2 * math.sqrt(0.9 * 0.1 / g["requests"]), (rate, g)
        else:
            assert g["attainment"] < 0.9, (rate, g)


def test_an_interrupted_sweep_keeps_its_points_and_resume_finishes_it(tmp_path):
    w = tmp_path / "fixed.toml"
    w.write_text(textwrap.dedent("""
        model = "sim"
        seed = 1
        [arrivals]
        process = "poisson"
        rate = "1/s"
        [run]
        requests = 60   # 3 s at 20/s: the interrupt 0.5 s into it lands inside it on a busy host too
        max_send_lag_p99 = "10s"
        max_lag_share = 1
        max_rate_deviation = 10
        max_cv_deviation = 100
        [prompt]
        tokens = 32
        tokenizer = "approximate"
        [output]
        tokens = 8
        """))
    out = tmp_path / "sw"
    args = [sys.executable, "-m", "loadgen", "sweep", str(w), "--rates", "10,20,40/s", "--out", str(out),
            "--no-calibrate", "--quiet", "--sim-args", "--mode fixed --ttft 20ms --itl 5ms"]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # wait for the second point to start
        if (out / "rate-20" / "manifest.json").exists():
            break
        time.sleep(0.05)
    time.sleep(0.5)
    os.kill(proc.pid, signal.SIGINT)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr
    m = orjson.loads((out / "sweep.json").read_bytes())
    assert m["status"] == "interrupted"
    assert [(q["dir"], q["status"]) for q in m["points"]] == [("rate-10", "complete"), ("rate-20", "interrupted")]
    kept_id = orjson.loads((out / "rate-10" / "manifest.json").read_bytes())["run_id"]
    assert orjson.loads((out / "sweep_summary.json").read_bytes())["points"][0]["rate_per_s"] == 10
    # a plain rerun into the same folder is refused; --resume continues
    assert loadgen(*args[3:]).returncode == 2
    p = loadgen(*args[3:], "--resume", timeout=200)
    assert p.returncode == 0, p.stderr
    s = orjson.loads((out / "sweep_summary.json").read_bytes())
    assert [q["rate_per_s"] for q in s["points"]] == [10, 20, 40] and s["sweep"]["status"] == "complete"
    assert orjson.loads((out / "rate-10" / "manifest.json").read_bytes())["run_id"] == kept_id  # not rerun
    # --resume with other flags is refused, naming what differs
    p = loadgen(*args[3:-2], "--sim-args", "--mode fixed --ttft 20ms --itl 5ms", "--max-tokens", "16", "--resume")
    assert p.returncode == 2 and "output_tokens" in p.stderr
