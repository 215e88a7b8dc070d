"""SLO parsing and per-request SLO checks (loadgen/analysis/goodput.py) on hand-made rows."""
import polars as pl
import pytest

from loadgen.analysis.goodput import goodput, meets, nearest_rank
from loadgen.config.slo import parse_slo

MS = 1_000_000


@pytest.mark.parametrize("text, expected", [
    # the example: two bounds, in ms
    ("ttft=500ms,tpot=50ms", {"ttft": 500.0, "tpot": 50.0}),
    # every metric, mixed units and spaces, upper-case names
    ("TTFT = 0.5s, tpot=50ms,e2e=2s,itl_p99=80ms", {"ttft": 500.0, "tpot": 50.0, "e2e": 2000.0, "itl_p99": 80.0}),
    # sub-millisecond bounds keep their precision
    ("itl_p99=250us", {"itl_p99": 0.25}),
])
def test_slo_specs_parse_to_ms(text, expected):
    assert parse_slo(text) == expected


@pytest.mark.parametrize("text, message", [
    # an unknown metric is named with the list of known ones
    ("ttft=500ms,latency=1s", "unknown metric 'latency'"),
    # a bound must say its unit
    ("ttft=500", "needs a unit"),
    # not METRIC=VALUE
    ("ttft", "expected METRIC=DURATION"),
    # the same metric twice is ambiguous
    ("ttft=1s,ttft=2s", "given twice"),
    # zero is no bound
    ("tpot=0ms", "must be > 0"),
    # nothing at all
    (" , ", "empty SLO"),
])
def test_bad_slo_specs_name_the_part(text, message):
    with pytest.raises(ValueError, match=message):
        parse_slo(text)


@pytest.mark.parametrize("values, p, expected", [
    ([5, 1, 4, 2, 3], 0.5, 3),      # ceil(2.5) = 3rd smallest
    ([5, 1, 4, 2, 3], 0.99, 5),     # ceil(4.95) = 5th
    ([7], 0.01, 7),                 # one value is every percentile
    (list(range(1, 101)), 0.9, 90),  # ceil(90) = 90th exactly, no interpolation
])
def test_nearest_rank(values, p, expected):
    assert nearest_rank(values, p) == expected


def _rows():
    # ttft/tpot/e2e in ms as latency_columns makes them; times in ns from t0.
    return pl.DataFrame({
        "request_id": ["a", "b", "c", "d", "e"],
        "outcome": ["ok", "ok", "ok", "timeout", "ok"],
        "ttft": [100.0, 600.0, 200.0, None, 300.0],
        "tpot": [10.0, 10.0, 70.0, None, None],   # e: a single output token, no tpot
        "e2e": [500.0, 1000.0, 900.0, None, 300.0],
        "intended_ns": [0, 100 * MS, 200 * MS, 300 * MS, 400 * MS],
        "done_ns": [500 * MS, 1100 * MS, 1100 * MS, 1300 * MS, 2000 * MS],
    })


def test_a_request_meets_when_ok_and_every_bound_holds():
    m = meets(_rows(), pl.DataFrame(schema={"request_id": pl.String, "t_ns": pl.Int64, "n_tokens": pl.Int32}),
              {"ttft": 500.0, "tpot": 50.0})
    # a: both hold; b: ttft misses; c: tpot misses; d: failed; e: tpot vacuous (one token)
    assert m["met"].to_list() == [True, False, False, False, True]
    assert m["met_ttft"].to_list() == [True, False, True, False, True]


def test_goodput_counts_met_requests_over_the_throughput_window():
    g = goodput(_rows(), pl.DataFrame(schema={"request_id": pl.String, "t_ns": pl.Int64, "n_tokens": pl.Int32}),
                {"ttft": 500.0, "tpot": 50.0})
    assert g["met"] == 2 and g["requests"] == 5
    assert g["attainment"] == pytest.approx(0.4)  # the failed request counts and misses
    assert g["requests_per_s"] == pytest.approx(2 / 2.0)  # window: 0 .. 2000 ms
    assert g["attainment_by_slo"] == {"ttft": pytest.approx(0.6), "tpot": pytest.approx(0.6)}


def test_itl_p99_is_each_requests_own_p99():
    # a: tokens 10 ms apart; b: one 100 ms gap among them; c: a 3-token chunk after 30 ms counts as
    # three gaps of 10 ms (the per-token rule), so it meets a 50 ms bound. Rows listed out of id order.
    t = [("a", 0), ("a", 10), ("a", 20), ("a", 30), ("b", 0), ("b", 10), ("b", 110), ("c", 0), ("c", 30)]
    n = [1, 1, 1, 1, 1, 1, 1, 1, 3]
    tokens = pl.DataFrame({"request_id": [r for r, _ in t], "t_ns": [ms * MS for _, ms in t], "n_tokens": n},
                          schema={"request_id": pl.String, "t_ns": pl.Int64, "n_tokens": pl.Int32})
    req = pl.DataFrame({"request_id": ["c", "b", "a"], "outcome": ["ok"] * 3})
    m = meets(req, tokens, {"itl_p99": 50.0})
    assert m["itl_p99"].to_list() == [10.0, 100.0, 10.0]
    assert m["met"].to_list() == [True, False, True]
