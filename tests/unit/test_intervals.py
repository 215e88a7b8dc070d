"""Live interval histograms (loadgen/run/intervals.py): the per-token ITL rule vectorized, the *.hlog round
trip, out-of-range counting, and the exact merge of several workers' logs. No clock, no run."""
import numpy as np
import polars as pl
import pytest

from loadgen.results import hdr
from loadgen.analysis.summary import histograms, itl_ms
from loadgen.run.intervals import LiveHistograms, metric_values_ns
from loadgen.metrics import itl_samples_ns
from tests.unit.test_summary import make_run, row

MS = 1_000_000
S = 1_000_000_000


@pytest.mark.parametrize("chunks", [
    [(10, 1), (20, 1), (35, 1)],
    [(10, 1), (30, 4)],                          # multi-token chunk
    [(10, 1), (40, 1), (40, 1), (40, 1)],        # coalesced read
    [(10, 3), (20, 1), (20, 2), (50, 0), (60, 1)],
])
def test_vectorized_itl_equals_the_summary_rule(chunks):
    r = row(0, 0, chunks)
    got = np.sort(metric_values_ns([r])["itl"]) / MS
    want = np.sort(itl_ms(make_run([r]).tokens, pl.Series(["r0"])).to_numpy())
    assert got == pytest.approx(want)


def test_itl_never_crosses_requests():
    t = np.array([10, 20, 5, 25], dtype=np.int64)
    assert itl_samples_ns(t, np.ones(4, np.int64), np.array([0, 0, 1, 1])).tolist() == [10, 20]


def rows_finishing(n, start_ms, ttft_ms=20, itl_ms_=5, tokens=4):
    out = []
    for i in range(n):
        t = start_ms + i
        out.append(row(i, t, [(t + ttft_ms + k * itl_ms_, 1) for k in range(tokens)]))
    return out


def test_interval_log_round_trip_and_out_of_range(tmp_path):
    live = LiveHistograms(tmp_path, t0_ns=0, start_wall_s=1_700_000_000.0)
    first = rows_finishing(10, 0)
    second = rows_finishing(5, 1000)
    second[0].first_token_ns = second[0].intended_ns - 1   # negative TTFT: a bug, counted, not dropped
    second[1].last_token_ns = second[1].intended_ns + 2 * 3600 * S   # e2e over 1 h: out of range
    live.record_interval(first, 1 * S)
    live.record_interval([], 2 * S)                      # a quiet second is written too
    live.record_interval(second, 2 * S + 400 * MS)       # the last, shorter interval
    totals = live.close()
    ivs = hdr.read_interval_log(tmp_path / "ttft.hlog")
    assert [(iv.start_s, iv.length_s) for iv in ivs] == [(0, 1), (1, 1), (2, 0.4)]
    assert [iv.hist.get_total_count() for iv in ivs] == [10, 0, 4]
    assert [iv.out_of_range for iv in ivs] == [0, 0, 1]
    assert totals["ttft"]["out_of_range"] == 1 and totals["e2e"]["out_of_range"] == 1
    assert totals["ttft"]["p50"] == pytest.approx(20, rel=1e-3)
    itl = hdr.merge_log(tmp_path / "itl.hlog")
    assert itl.get_total_count() == 15 * 3 and itl.get_value_at_percentile(100) == pytest.approx(5000, rel=1e-3)
    # `loadgen report` reads them back, out-of-range counts included
    h = histograms(tmp_path)
    assert h["ttft"]["count"] == 14 and h["ttft"]["out_of_range"] == 1 and h["send_lag"]["count"] == 15


def test_workers_logs_merge_exactly(tmp_path):
    rng = np.random.default_rng(0)
    all_rows = [row(i, i * 3.0, [(i * 3.0 + 20 + rng.exponential(5), 1)]) for i in range(300)]
    halves = all_rows[::2], all_rows[1::2]
    for w, part in enumerate(halves):
        live = LiveHistograms(tmp_path / f"w{w}", 0, 1_700_000_000.0, tag=f"w{w}")
        live.record_interval(part[:75], S)
        live.record_interval(part[75:], 2 * S)
        live.close()
    merged = hdr.merge_logs([tmp_path / "w0" / "ttft.hlog", tmp_path / "w1" / "ttft.hlog"])
    whole = hdr.record(metric_values_ns(all_rows)["ttft"])
    assert merged.hist.get_total_count() == 300 and merged.out_of_range == 0
    assert hdr.merge([merged.hist]).encode() == hdr.merge([whole.hist]).encode()


@pytest.fixture(autouse=True)
def _worker_dirs(tmp_path):
    for w in ("w0", "w1"):
        (tmp_path / w).mkdir()


def test_intervals_leave_no_histogram_for_the_cycle_collector(tmp_path):
    # Each interval reuses one histogram per metric: a new one per interval would be cyclic garbage (the
    # package's histogram and its encoder refer to each other) that only a full collection frees. And the
    # reused one starts every interval empty: each interval holds its own rows only.
    import gc
    live = LiveHistograms(tmp_path, t0_ns=0, start_wall_s=1_700_000_000.0)
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        for k in range(4):
            live.record_interval(rows_finishing(3 + k, k * 1000), (k + 1) * S)
        gc.collect()
        assert not [o for o in gc.garbage if isinstance(o, hdr.HdrHistogram)]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    live.close()
    assert [iv.hist.get_total_count() for iv in hdr.read_interval_log(tmp_path / "ttft.hlog")] == [3, 4, 5, 6]
