"""One definition per metric (loadgen/metrics.py): every consumer of a metric gets the same number.
No run, no clock: hand-made rows as in test_summary."""
import math

import numpy as np
import pytest

from loadgen.results import hdr
from loadgen import metrics
from loadgen.analysis.decompose import decompose
from loadgen.analysis.summary import summarize
from loadgen.run.ending import check_generator
from loadgen.run.intervals import metric_values_ns
from tests.unit.test_summary import make_run, row

MS = 1_000_000


@pytest.mark.parametrize("q,n,want", [
    (0.5, 1, 1),        # one sample is every percentile
    (0.5, 2, 1),        # the lower of two: ceil(1.0), no interpolation
    (0.5, 5, 3),        # the median
    (0.99, 76, 76),     # ceil(75.24): the largest (hdrh's rounded rank would say 75)
    (0.99, 100, 99),    # exactly 99.0 stays 99, not 100 by binary rounding of 0.99 * 100
    (0.999, 1000, 999),
    (0.0, 10, 1),       # p0 is the smallest
    (1.0, 10, 10),      # p100 is the largest
])
def test_nearest_rank(q, n, want):
    assert metrics.rank(q, n) == want
    assert metrics.quantiles(np.arange(1, n + 1, dtype=float)[::-1], [q]) == [want]


def test_distribution_reports_measured_values_only():
    d = metrics.distribution(np.array([3.0, 1.0, 2.0, 10.0, math.nan]))
    assert d == {"p50": 2.0, "p90": 10.0, "p99": 10.0, "p999": 10.0, "max": 10.0, "mean": 4.0}
    assert metrics.distribution(np.array([])) == dict.fromkeys(metrics.STATS)


def waited_rows():
    # 80 requests 10 ms apart; every 4th waited for a concurrency slot (30 ms) and was then sent 0.2 ms
    # after its slot freed; the others were sent 0.1..0.8 ms late. Two warm-up rows were very late.
    rows = []
    for i in range(80):
        r = row(i, 10 * i, [(10 * i + 60, 1), (10 * i + 70, 1)], warmup=i < 2)
        wait = 30 * MS if i % 4 == 0 else 0
        r.slot_wait_ns = wait
        r.dispatched_ns = r.intended_ns + wait + (200_000 if wait else 100_000 * (1 + i % 8))
        if i < 2:
            r.dispatched_ns += 50 * MS
        rows.append(r)
    return rows


def test_send_lag_is_one_number_in_the_summary_the_histograms_and_the_self_check():
    # Before metrics.py the summary and the histograms counted the slot wait as send lag and the
    # self-check did not (one quickstart report printed three p99s); now all three agree.
    rows = waited_rows()
    run = make_run(rows)
    exact = summarize(run)["latency_ms"]["send_lag"]
    _, generator = check_generator(run.requests)
    rec = hdr.record(metric_values_ns(rows)["send_lag"])
    from_hdr = hdr.summary_ms(rec)
    assert exact["p99"] == pytest.approx(0.8) and exact["max"] == pytest.approx(0.8)  # no slot wait in it
    assert generator["send_lag_p99_ms"] == exact["p99"]
    assert generator["send_lag_p50_ms"] == exact["p50"]
    for s in ("p50", "p99", "max"):
        assert exact[s] <= from_hdr[s] <= exact[s] * 1.001 + 0.001   # HDR: 3 digits, µs rounding
    assert summarize(run)["latency_ms"]["slot_wait"]["max"] == pytest.approx(30)


def test_slot_wait_is_its_own_component_of_the_decomposition():
    d = decompose(make_run(waited_rows()))
    waited = d.filter(d["slot_wait_ms"] > 0)
    assert waited.height == 19 and (waited["slot_wait_ms"] == 30).all()
    assert waited["send_lag_ms"].to_list() == pytest.approx([0.2] * 19)
    parts = sum(d[c] for c in ("send_lag_ms", "slot_wait_ms", "connect_ms", "decode_ms", "other_ms"))
    assert (parts - d["e2e_ms"]).abs().max() < 1e-9


def test_every_printed_percentile_agrees_with_hdr_within_its_precision():
    rng = np.random.default_rng(9)
    for n in (7, 76, 100, 1001):
        v_ns = rng.lognormal(16, 1.0, n).astype(np.int64)
        exact = metrics.distribution(v_ns / MS)
        h = hdr.summary_ms(hdr.record(v_ns))
        for s in ("p50", "p90", "p99", "p999", "max"):
            assert exact[s] - 0.0005 <= h[s] <= exact[s] * 1.001 + 0.0005, (n, s)


# requests.parquet-like columns with every kind of null: unsent rows, no first token, 0/1/None tokens,
# a slot wait or none, a first answer or none
_COLUMNS = {
    "intended_ns": [0, 10, 20, 30, 40, 50, 60],
    "dispatched_ns": [5, None, 25, 31, 47, 52, 61],
    "slot_wait_ns": [None, None, 3, 0, None, 1, None],
    "connected_ns": [6, None, 26, 33, None, 53, 62],
    "first_token_ns": [15, None, 40, None, 70, 58, 90],
    "first_answer_ns": [16, None, None, None, 75, None, 95],
    "last_token_ns": [55, None, 41, 90, 200, 58, 130],
    "output_tokens": [5, None, 1, 0, 9, 1, 3],
}


def test_the_array_evaluation_of_the_definitions_is_the_frames():
    # run/intervals.py takes the live histograms' values from metrics.values_ns, summary.json from EXPR_NS:
    # one definition, two evaluators, the same numbers (nulls where Polars has nulls)
    import polars as pl
    frame = metrics.latency_columns(pl.DataFrame(_COLUMNS, schema={k: pl.Int64 for k in _COLUMNS}), unit_ns=1)
    arrays = metrics.values_ns({k: np.array(v, dtype=np.float64) for k, v in _COLUMNS.items()})
    assert set(arrays) == set(metrics.EXPR_NS)
    for name, got in arrays.items():
        want = frame[name].cast(pl.Float64).fill_null(np.nan).to_numpy()
        np.testing.assert_array_equal(got, want, err_msg=name)
    # a column the arrays lack is all null, as a frame's missing first_answer_ns (folders that predate it)
    no_answer = metrics.values_ns({k: np.array(v, dtype=np.float64) for k, v in _COLUMNS.items()
                                   if k != "first_answer_ns"})
    assert np.isnan(no_answer["ttfa"]).all()
