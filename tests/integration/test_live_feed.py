"""The live feed (loadgen/run/live.py): the Snapshots a one-process run publishes every second agree with
what the run wrote afterwards (its rows and its histograms, as summary.json reads them), and the server
gauges come from the scraped /metrics. Through run_workload, the library entry point of `loadgen run`,
against the built-in simulator."""
import textwrap
import threading

import numpy as np
import polars as pl

from loadgen.analysis.summary import histograms
from loadgen.config.workload import load
from loadgen.run.launch import run_workload
from loadgen.run.live import BUCKETS_S, Feed

SIM = ("--mode", "fixed", "--ttft", "30ms", "--itl", "5ms")


def watched_run(tmp_path, extra: dict | None = None):
    w = tmp_path / "w.toml"
    w.write_text(textwrap.dedent("""
        model = "sim"
        seed = 3
        [arrivals]
        process = "poisson"
        rate = "20/s"
        [run]
        requests = 70
        warmup_requests = 3
        # what is checked is the feed, not whether a busy host let the client keep the schedule
        max_send_lag_p99 = "10s"
        max_lag_share = 1
        max_rate_deviation = 10
        max_cv_deviation = 100
        [prompt]
        tokens = 16
        tokenizer = "approximate"
        [output]
        tokens = 8
        """))
    cfg = load(w, {"--no-calibrate": True, "--out": str(tmp_path / "run"), **(extra or {})}, sim_args=SIM)
    feed, seen = Feed(), []

    def watch():  # a watcher in its own thread, as the terminal view and --metrics-port are
        last = None
        while True:
            snap = feed.wait(last, timeout_s=30)
            if snap is not None and (last is None or snap.t_s > last):
                seen.append(snap)
                last = snap.t_s
            if feed.closed:
                return

    t = threading.Thread(target=watch)
    t.start()
    try:
        outcome = run_workload(cfg, progress=None, feed=feed)
    finally:
        feed.close()
        t.join(10)
    return outcome, seen


def test_the_snapshots_agree_with_the_rows_and_the_summary(tmp_path):
    outcome, seen = watched_run(tmp_path)
    assert outcome.exit_code == 0 and len(seen) >= 3
    run = outcome.path
    req = pl.read_parquet(run / "requests.parquet")
    hist = histograms(run)  # what summary.json's `histograms` holds
    last = seen[-1]
    # every row is counted once, by outcome; the counters only grow
    assert last.planned == req.height == last.sent and last.outcomes == {"ok": req.height} and last.in_flight == 0
    assert last.due == req.height
    assert all(a.finished <= b.finished and a.t_s < b.t_s for a, b in zip(seen, seen[1:]))
    measured = req.filter(~pl.col("warmup"))
    assert last.output_tokens == measured["output_tokens"].sum()
    # the run's windows are the summary's histograms (one owner: intervals.py), bucket counts the rows'
    ttft_ms = ((measured["first_token_ns"] - measured["intended_ns"]) / 1e6).to_numpy()
    assert last.run["ttft"].count == len(ttft_ms) == hist["ttft"]["count"]
    assert last.run["ttft"].p99_ms == hist["ttft"]["p99"]
    b = last.buckets["ttft"]
    assert b.upper_s == BUCKETS_S["ttft"] and b.count == len(ttft_ms)
    assert list(b.cumulative) == [int((np.sort(ttft_ms) / 1e3 <= u).sum()) for u in b.upper_s]
    assert abs(b.sum_s - ttft_ms.sum() / 1e3) < 1e-6 * max(1, len(ttft_ms))
    # an interval's window holds the rows that finished in it: the windows add up to the run
    assert sum(s.last["e2e"].count for s in seen) == last.run["e2e"].count == measured.height
    # every whole second has loop-lateness samples (one per 50-ms probe period); the run's last interval is
    # shorter and may end before a probe did: then it says None, not a number it did not measure
    assert all(s.loop_lateness_p99_ms is not None for s in seen if s.interval_s >= 0.5), seen
    assert last.server == {}


def test_the_snapshots_carry_the_scraped_server_gauges(tmp_path):
    outcome, seen = watched_run(tmp_path, {"--scrape-metrics": True, "--scrape-interval": "200ms"})
    assert outcome.exit_code == 0
    gauges = [s.server for s in seen if s.server]
    assert gauges and all({"running", "waiting"} <= g.keys() for g in gauges)
    # the simulator's own gauges, as scraped into server_metrics.parquet
    scraped = pl.read_parquet(outcome.path / "server_metrics.parquet")
    running = set(scraped.filter(pl.col("name") == "vllm:num_requests_running")["value"].to_list())
    assert {g["running"] for g in gauges} <= running
