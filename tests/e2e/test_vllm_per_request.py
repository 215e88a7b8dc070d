"""End to end against vLLM with `--enable-per-request-metrics` (vLLM 0.32 has it) and `--max-num-seqs 2`.

A server of its own for the module (after test_vllm.py's has stopped: one vLLM at a time). Each
response's final usage chunk carries vLLM's `metrics` object; loadgen's decomposition then takes queue,
prefill and decode from it (method `server_timings`). With two seats, a burst of 8 requests really queues
in the engine: loadgen's queue is vLLM's, request by request, and the report's split agrees with vLLM's
histograms, the front-end time being in `other` (analysis/server_split.py).
"""
from __future__ import annotations

import os

import polars as pl
import pytest

from tests.e2e.conftest import FIGURES
from tests.e2e.test_vllm import Running, check_rows, counter_delta, report, run, workload
from tests.e2e.vllm_server import VllmServer

SEATS = 2


@pytest.fixture(scope="module")
def vllm_timed(tmp_path_factory):
    if os.environ.get("VLLM_TIMED_URL"):   # a running server started with the flags below
        yield Running(os.environ["VLLM_TIMED_URL"].rstrip("/"))
        return
    srv = VllmServer(tmp_path_factory.mktemp("vllm-timed") / "vllm.log",
                     extra=("--enable-per-request-metrics", "--max-num-seqs", str(SEATS)))
    srv.start()
    FIGURES["vllm --enable-per-request-metrics --max-num-seqs 2: start to healthy, s"] = round(srv.ready_s or 0, 1)
    yield srv
    srv.stop()


def test_per_request_timings_and_real_queueing(vllm_timed, tmp_path):
    wl = workload(tmp_path, "burst", "completions", """
        [arrivals]
        process = "constant"
        rate = "50/s"
        [prompt]
        tokens = 128
        [output]
        tokens = 32
        """)
    out = tmp_path / "burst"
    r, _ = run(vllm_timed, wl, out, "--requests", "8", "--no-calibrate", "--scrape-metrics",
               "--scrape-interval", "100ms")
    df = check_rows(r, 8, 32).sort("dispatched_ns")
    for col in ("server_queue_ms", "server_prefill_ms", "server_decode_ms"):
        assert df[col].null_count() == 0, df[["request_id", col]]          # vLLM's metrics object, parsed
    # 8 at once on 2 seats: the last ones waited in vLLM's own queue longer than a whole request of the
    # first ones took on the engine
    served_ms = (df["server_prefill_ms"] + df["server_decode_ms"]).to_list()[:SEATS]
    waits = sorted(df["server_queue_ms"].to_list())
    assert min(waits[-3:]) > max(served_ms), (waits, served_ms)
    sm = pl.read_parquet(out / "server_metrics.parquet")
    assert sm.filter(pl.col("name") == "vllm:num_requests_waiting")["value"].max() > 0
    s = report(out)
    dm, hist, q = s["decomposition_ms"], s["server_histograms_ms"], s["queue_split_ms"]
    assert dm["method"] == "server_timings" and hist["n"] == 8
    # the per-request numbers and the histograms are vLLM's same stamps: their means agree to rounding
    for comp, col in (("queue", "server_queue_ms"), ("prefill", "server_prefill_ms"), ("decode", "server_decode_ms")):
        assert float(df[col].mean()) == pytest.approx(hist[comp], rel=1e-3, abs=1e-3), comp
    assert q["agree"] and q["disagreements"] == [] and q["front_end_ms"] == pytest.approx(0, abs=1e-3)
    assert q["front_end_note"] and "other" in q["front_end_note"]
    assert dm["mean"]["other"] > 0                                          # where the front-end time is
    assert counter_delta(sm, "vllm:prefix_cache_hits_total") == 0
    FIGURES["vllm burst 8 on 2 seats: vLLM queue ms (max of first 2 / max)"] = (
        round(max(df["server_queue_ms"].to_list()[:SEATS]), 1), round(max(waits), 1))
    FIGURES["vllm burst: decomposition other (front-end) mean ms"] = round(dm["mean"]["other"], 2)
