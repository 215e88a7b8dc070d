"""End to end against vLLM with `--enable-per-request-metrics` (vLLM 0.32 has it) and `--max-num-seqs` 2, then 16.

Servers of its own for the module (after test_vllm.py's has stopped: one vLLM at a time; `seats(n)` stops
the running one before it starts the next). Each response's final usage chunk carries vLLM's `metrics`
object; loadgen's decomposition then takes queue, prefill and decode from it (method `server_timings`).
With two seats, a burst of 8 requests really queues in the engine: loadgen's queue is vLLM's, request by
request, and the report's split agrees with vLLM's histograms, the front-end time being in `other`
(analysis/server_split.py). Then the same run against 2 and 16 seats: `compare` finds TTFT better with 16
and names queueing as the cause.
"""
from __future__ import annotations

import os

import orjson
import polars as pl
import pytest

from tests.e2e.conftest import FIGURES
from tests.e2e.test_vllm import check_rows, fresh_seed, report, run, workload
from tests.e2e.vllm_server import Running, VllmServer
from tests.integration.conftest import counter_delta, host_starved, loadgen

SEATS = 2
MANY = 16
ATTEMPTS = 3            # runs of one side of the compare when the host held the client back (see there)
MAX_SEND_LAG_MS = 50    # the client kept its schedule: send lag p99 under this (Poisson 14/s: mean gap 71 ms)


class Seats:
    """One vLLM with --enable-per-request-metrics at a time, by its --max-num-seqs: asking for another
    number stops the running server first (VLLM_TIMED_URL: a running 2-seat one, never stopped here)."""
    def __init__(self, tmp_path_factory):
        self.tmp, self.n, self.srv = tmp_path_factory, None, None

    def __call__(self, n: int):
        if n == self.n:
            return self.srv
        self.close()
        if n == SEATS and os.environ.get("VLLM_TIMED_URL"):
            self.n, self.srv = n, Running(os.environ["VLLM_TIMED_URL"].rstrip("/"))
            return self.srv
        srv = VllmServer(self.tmp.mktemp(f"vllm-seats{n}") / "vllm.log",
                         extra=("--enable-per-request-metrics", "--max-num-seqs", str(n)))
        srv.start()
        FIGURES[f"vllm --enable-per-request-metrics --max-num-seqs {n}: start to healthy, s"] = round(
            srv.ready_s or 0, 1)
        self.n, self.srv = n, srv
        return srv

    def close(self):
        if isinstance(self.srv, VllmServer):
            self.srv.stop()
        self.n, self.srv = None, None


@pytest.fixture(scope="module")
def seats(tmp_path_factory):
    s = Seats(tmp_path_factory)
    yield s
    s.close()


def test_per_request_timings_and_real_queueing(seats, tmp_path):
    vllm_timed = seats(SEATS)
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
    # The premise, from vLLM's own queue times: the burst reached its engine together, so only the first SEATS
    # found a free seat. Beside two CPU burners its front end handed them over so slowly that 4 of 8 found one
    # (queue 0.02-0.04 ms, then 284-583 ms): the later ones then waited less than a whole request, and that
    # run says nothing of queueing. loadgen's own part is judged still: it sent the burst on time, or its
    # self-check names the host as the cause (there: send lag max 296 ms, the loop waiting for a CPU).
    free = sum(w < 1.0 for w in waits)
    if free > SEATS:
        lag_ms = float(((df["dispatched_ns"] - df["intended_ns"]) / 1e6).max())
        assert lag_ms < 20 or host_starved(r.manifest), (
            f"loadgen sent the burst late ({lag_ms:.1f} ms, {r.manifest['generator'].get('cause') or 'unknown'})")
        pytest.skip(f"the burst did not reach vLLM's engine together: {free} of 8 found a free seat (its queue "
                    f"times {[round(w, 1) for w in waits]} ms; loadgen's send lag max {lag_ms:.1f} ms)")
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


def test_compare_2_vs_16_seats_names_queueing(seats, tmp_path):
    # The same run (seed, lengths, arrival times: the same texts, each server's cache cold) on 2 then 16 seats:
    # Poisson 14/s, 128-token prompts, 32 out. Two seats serve 6-10/s (here under load ~6/s; in CI a burst of 8
    # drained in 0.83 s: ~9.7/s), so 14/s is 1.4-2.3x their capacity on either: the queue in vLLM's engine
    # grows through the run and the median request waits too, not only the tail. At 8/s, right at CI's
    # capacity, the mean moved but p50 was "indistinguishable" there (and at 4/s here); the premise is now
    # checked, not hoped for: the 2-seat side's median request waited in vLLM's queue (its own per-request
    # stamp) longer than the 16-seat side's whole TTFT p50 (here 1047 ms against 27 ms). 16 seats admit them
    # all (waiting gauge 0; ~5 in flight). `compare` must find TTFT (mean and p50) better with 16 and name
    # queueing as the cause (analysis/compare.ttft_cause: the decomposition's queue mean, vLLM's own
    # per-request queue here, explains most of TTFT's change).
    # Premises, from vLLM's /metrics: the 2-seat server queued (waiting gauge > 0, its queue histogram's mean
    # most of the TTFT difference), the 16-seat one did not; the client kept its schedule on both (send lag
    # p99 under MAX_SEND_LAG_MS: a late client sends in bursts, which queue by themselves). On this shared
    # 2-core host other work held the client back by 350-430 ms in one run of two: a side so held is run
    # again, with a fresh seed (the first attempts share one seed, so the same arrival times and texts; a
    # retry's texts are new, the server's cache stays cold, checked), up to ATTEMPTS times.
    wl = workload(tmp_path, "seats", "completions", """
        [arrivals]
        process = "poisson"
        rate = "14/s"
        [prompt]
        tokens = 128
        [output]
        tokens = 32
        """)
    seed, side, tried = fresh_seed(), {}, []
    for n in (SEATS, MANY):
        for attempt in range(ATTEMPTS):
            out = tmp_path / f"seats-{n}-{attempt}"
            r, _ = run(seats(n), wl, out, "--requests", "32", "--no-calibrate", "--scrape-metrics",
                       "--scrape-interval", "250ms", seed=seed)
            df = check_rows(r, 32, 32)
            sm = pl.read_parquet(out / "server_metrics.parquet")
            s = report(out)   # writes decomposition.parquet, which compare reads
            assert s["decomposition_ms"]["method"] == "server_timings" and s["server_histograms_ms"]["n"] == 32
            assert counter_delta(sm, "vllm:prefix_cache_hits_total") == 0                   # cold
            side[n] = {"dir": out, "hist": s["server_histograms_ms"], "ttft_mean": float(df["ttft_ms"].mean()),
                       "ttft_p50": float(df["ttft_ms"].median()), "queue_p50": float(df["server_queue_ms"].median()),
                       "waiting_max": float(sm.filter(pl.col("name") == "vllm:num_requests_waiting")["value"].max()),
                       "send_lag_p99": float(df["send_lag_ms"].quantile(0.99))}
            tried.append((n, attempt, round(side[n]["send_lag_p99"], 1)))
            if side[n]["send_lag_p99"] < MAX_SEND_LAG_MS:
                break
            seed = fresh_seed()   # held back: again, with new texts (this server's cache stays cold)
    FIGURES["vllm 2 vs 16 seats: (seats, attempt, send lag p99 ms) per run"] = tried
    few, many = side[SEATS], side[MANY]
    FIGURES["vllm 14/s, 2 vs 16 seats: TTFT p50 ms; vLLM queue p50 ms"] = (
        (round(few["ttft_p50"], 1), round(many["ttft_p50"], 1)),
        (round(few["queue_p50"], 1), round(many["queue_p50"], 3)))
    if max(few["send_lag_p99"], many["send_lag_p99"]) >= MAX_SEND_LAG_MS:
        # the premise failed on every attempt of a side (beside two CPU burners: send lag p99 0.3-1.9 s): the
        # client could not keep the schedule, so the comparison is not judged there
        pytest.skip(f"the host held the client back on every attempt of a side (seats, attempt, send lag p99 "
                    f"ms): {tried}")
    assert few["waiting_max"] > 0 and many["waiting_max"] == 0, side
    # the median request waited on 2 seats, by vLLM's own stamps (not only the tail): p50 can move
    assert few["queue_p50"] - many["queue_p50"] > many["ttft_p50"], side
    ttft_gain = few["ttft_mean"] - many["ttft_mean"]
    assert few["hist"]["queue"] - many["hist"]["queue"] > 0.5 * ttft_gain > 0, side   # vLLM's own queue
    p = loadgen("compare", str(few["dir"]), str(many["dir"]), "--format", "json")
    assert p.returncode == 0, p.stderr
    c = orjson.loads(p.stdout)["comparisons"][0]
    assert c["same_work"]["same"], c["same_work"]
    ttft = {m["stat"]: m for m in c["metrics"] if m["metric"] == "ttft"}
    floor = c.get("noise_floor") or {}
    if any("below_noise_floor" in ttft[s]["reasons"] for s in ("mean", "p50")):
        # compare's own premise: the client's loop lateness (its noise floor) below the effect; a host that
        # stalled the client this much gets "indistinguishable", rightly, and the test cannot judge the cause
        pytest.skip(f"the client's loop lateness p99 ({floor.get('ms')} ms, {floor.get('source')}) is a noise "
                    f"floor above the TTFT change on this host: {ttft['mean']['why']}")
    assert ttft["mean"]["verdict"] == "better" and ttft["p50"]["verdict"] == "better", {
        st: (ttft[st]["a"], ttft[st]["b"], ttft[st]["verdict"], ttft[st]["why"]) for st in ("mean", "p50")}
    cause = c["ttft_cause"]
    assert cause["cause"] == "queueing" and cause["verdict"] == "better", cause
    text = loadgen("compare", str(few["dir"]), str(many["dir"])).stdout
    assert "cause of the TTFT change: TTFT mean fell" in text and "queueing: the decomposition's queue" in text
    FIGURES["vllm 14/s, 2 vs 16 seats: TTFT mean ms; vLLM queue mean ms; waiting max"] = (
        (round(few["ttft_mean"], 1), round(many["ttft_mean"], 1)),
        (round(few["hist"]["queue"], 1), round(many["hist"]["queue"], 3)), (few["waiting_max"], many["waiting_max"]))
    FIGURES["vllm 2 vs 16 seats: compare's cause"] = cause["why"]
