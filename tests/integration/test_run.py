"""`loadgen run` and `loadgen report` end to end against `loadgen sim --mode fixed`."""
import os
import signal
import statistics
import subprocess
import sys
import time

import orjson
import polars as pl
import pytest

from loadgen.analysis.summary import itl_ms
from loadgen.results.folder import read_run
from loadgen.sim.truth import read_truth
from tests.integration.conftest import loadgen, report_json, workload


@pytest.mark.parametrize("api", ["completions", "chat"])
def test_run_against_fixed_sim(fixed_sim, tmp_path, api):
    out = tmp_path / "run"
    p = loadgen("run", workload(tmp_path, api=api), "--url", fixed_sim.url, "--out", str(out), "--quiet")
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip().splitlines()[-1] == str(out)  # the folder path comes last on stdout

    s = report_json(str(out))
    assert s["requests"] == {"scheduled": 60, "ok": 60, "failed": 0, "dropped": 0, "abandoned": 0}
    assert s["valid"] is True
    # the rate kept is the self-check's business (test_selfcheck.py, make bench); here: the plan's rate
    assert abs(s["rate"]["offered_per_s"] / 20 - 1) < 0.3
    lat = s["latency_ms"]
    assert lat["ttft"]["p50"] >= 50 and lat["itl"]["p50"] > 0, lat   # the server's TTFT is 50 ms from arrival

    run = read_run(out)
    # Against the simulator's truth (same monotonic clock): every chunk was stamped after the server wrote
    # its token (a stamp taken too early, e.g. at send time, fails here), and the median delivery delay
    # (server write -> client stamp) stays within 2 ms of what the host itself imposed: the run's own
    # event-loop lateness p99 (manifest generator.loop_lateness_ms; < 1 ms on a quiet host, higher when
    # other processes hold the cores). A stamp taken late, e.g. after parsing the stream, fails here.
    truth = {r["request_id"]: r for r in read_truth(fixed_sim.args[fixed_sim.args.index("--truth") + 1])}
    t0 = run.manifest["t0"]["monotonic_ns"]
    delays = []
    for rid, toks in run.tokens.sort("request_id", "idx").group_by("request_id", maintain_order=True):
        server = truth[rid[0]]["token_ns"]
        client = (toks["t_ns"] + t0).to_list()
        assert len(client) == len(server) == 32
        assert all(c >= w for c, w in zip(client, server)), rid
        delays += [c - w for c, w in zip(client, server)]
    host_ms = run.manifest["generator"]["loop_lateness_ms"]["p99"]
    assert statistics.median(delays) / 1e6 < 2 + host_ms, (statistics.median(delays), host_ms)
    req = run.requests
    assert req.height == 60 and req["request_id"].n_unique() == 60
    ordered = req.filter(
        (pl.col("intended_ns") <= pl.col("dispatched_ns")) & (pl.col("dispatched_ns") <= pl.col("first_token_ns"))
        & (pl.col("first_token_ns") <= pl.col("last_token_ns")) & (pl.col("last_token_ns") <= pl.col("done_ns")))
    assert ordered.height == 60
    assert (req["output_tokens"] == 32).all() and (req["n_chunks"] == 32).all()
    assert req["connected_ns"].null_count() == 0 and req["sent_ns"].null_count() == 0
    # The ITL samples of each request add up to its decode time.
    for r in req.head(10).iter_rows(named=True):
        total_ms = itl_ms(run.tokens, pl.Series([r["request_id"]])).sum()
        assert total_ms == pytest.approx((r["last_token_ns"] - r["first_token_ns"]) / 1e6, abs=1e-6)
    manifest = orjson.loads((out / "manifest.json").read_bytes())
    assert manifest["status"] == "complete" and manifest["t0"]["monotonic_ns"] > 0


def test_report_text_shows_percentiles(fixed_sim, tmp_path):
    out = tmp_path / "run"
    assert loadgen("run", workload(tmp_path, requests=10), "--url", fixed_sim.url, "--out", str(out),
                   "--quiet").returncode == 0
    p = loadgen("report", str(out))
    assert p.returncode == 0
    for word in ("ttft", "itl", "tpot", "e2e", "p99", "offered"):
        assert word in p.stdout


def test_sigint_leaves_a_complete_interrupted_folder(fixed_sim, tmp_path):
    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "loadgen", "run", workload(tmp_path, requests=200),
                             "--url", fixed_sim.url, "--out", str(out), "--quiet",
                             "--no-calibrate"],  # so the run starts at once: _parts marks its start
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not (out / "_parts").exists() and time.monotonic() < deadline:  # the run has started
        time.sleep(0.05)
    time.sleep(2.5)
    os.kill(proc.pid, signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    run = read_run(out)
    assert run.manifest["status"] == "interrupted"
    assert run.requests.height == 200 and run.requests["outcome"].null_count() == 0
    outcomes = set(run.requests["outcome"])
    assert "ok" in outcomes and "cancelled" in outcomes
    assert report_json(str(out))["valid"] is False


def test_unreachable_server_gives_rows_not_a_crash(tmp_path):
    out = tmp_path / "run"
    p = loadgen("run", workload(tmp_path, requests=5), "--url", "http://127.0.0.1:9", "--out", str(out), "--quiet")
    # a run that reached no server is invalid, not a success (and no tokenize answered either)
    assert p.returncode == 3 and "prompt lengths are NOT exact" in p.stderr, p.stderr
    req = read_run(out).requests
    assert req.height == 5 and set(req["outcome"]) == {"connection_error"}
    assert set(req["error_kind"]) == {"connect_failed"}
