"""The moving-block bootstrap (loadgen/analysis/bootstrap.py) with fixed seeds, and --fail-if rules
(loadgen/analysis/fail_if.py): parsing and evaluation on made-up comparison entries."""
import numpy as np
import pytest

from loadgen.analysis import compare
from loadgen.analysis import bootstrap as bs
from loadgen.analysis.fail_if import FailIfError, evaluate, parse_fail_if


def test_block_indices_are_runs_of_consecutive_requests():
    idx = bs.block_indices(100, 50, np.random.default_rng(0))
    assert idx.shape == (50, 100) and idx.min() >= 0 and idx.max() < 100
    b = bs.block_length(100)
    assert b == 5  # ceil(100^(1/3))
    # within a block, indices step by one
    assert (np.diff(idx[:, :b], axis=1) == 1).all()
    # a fixed seed gives the same resamples
    assert (idx == bs.block_indices(100, 50, np.random.default_rng(0))).all()


@pytest.mark.parametrize("rows, p, expected", [
    # nearest rank per row; NaN (a failed request) is not a value
    ([[1, 2, 3, 4]], 0.5, [2]),
    ([[1, np.nan, 3, 4]], 0.5, [3]),      # m = 3: ceil(1.5) = 2nd smallest of 1, 3, 4
    ([[np.nan, np.nan]], 0.5, [np.nan]),  # no value at all
    ([[1, 2, 3, 10]], None, [4]),         # p None: the mean
    ([[4, 3, 2, 1], [9, 9, 9, 1]], 0.99, [4, 9]),
])
def test_nearest_rank_rows(rows, p, expected):
    np.testing.assert_array_equal(bs.nearest_rank_rows(np.array(rows, dtype=float), p), expected)


def test_ci_of_a_mean_covers_the_truth_and_shrinks_with_n():
    rng = np.random.default_rng(1)
    widths = []
    for n in (100, 1600):
        x = rng.normal(10.0, 2.0, n)
        lo, hi = bs.interval(bs.per_request(x, None, bs.block_indices(n, 1000, np.random.default_rng(2))))
        assert lo < 10.0 < hi
        widths.append(hi - lo)
    # the width goes about as 1/sqrt(n): 16x the requests, well under half the width
    assert widths[1] < 0.5 * widths[0]


def test_clustered_resampling_takes_a_requests_samples_together():
    # Two kinds of request: 10 with ITL 1 ms (10 samples each), 10 with 5 ms. Resampling by request
    # varies the mix; every resample's values are still only 1 or 5.
    samples = np.concatenate([np.full(10, 1.0)] * 10 + [np.full(10, 5.0)] * 10)
    owner = np.repeat(np.arange(20), 10)
    idx = bs.block_indices(20, 200, np.random.default_rng(3), block=1)
    p50 = bs.clustered(samples, owner, 20, 0.5, idx)
    assert set(np.unique(p50)) <= {1.0, 5.0} and len(np.unique(p50)) == 2
    means = bs.clustered(samples, owner, 20, None, idx)
    assert means.min() < 3.0 < means.max()
    # the identity resample gives the plain statistic
    assert bs.clustered(samples, owner, 20, None, np.arange(20)[None, :])[0] == pytest.approx(3.0)


def test_ratio_is_a_ratio_of_sums():
    counts, intervals = np.array([1.0, 1, 0, 1]), np.array([0.5, 0.5, 1.0, 2.0])
    assert bs.ratio(counts, intervals, np.arange(4)[None, :])[0] == pytest.approx(3 / 4.0)


@pytest.mark.parametrize("text, metric, stat, op, threshold, relative", [
    # the example: p99 TTFT up by more than 10 %
    ("p99 ttft > +10%", "ttft", "p99", ">", 0.10, True),
    # throughput down by more than 5 %: single-valued, no stat
    ("throughput < -5%", "throughput", "value", "<", -0.05, True),
    # absolute latency change in the metric's unit (ms), from seconds
    ("p50 e2e > +0.5s", "e2e", "p50", ">", 500.0, False),
    # absolute rate change
    ("goodput < -2/s", "goodput", "value", "<", -2.0, False),
    # attainment: a bare share
    ("attainment < -0.05", "attainment", "value", "<", -0.05, False),
    # case and spacing do not matter
    ("MEAN ITL>2ms", "itl", "mean", ">", 2.0, False),
])
def test_fail_if_rules_parse(text, metric, stat, op, threshold, relative):
    r = parse_fail_if(text)
    assert (r.metric, r.stat, r.op, r.relative) == (metric, stat, op, relative)
    assert r.threshold == pytest.approx(threshold)


@pytest.mark.parametrize("text, message", [
    ("p99 latency > +10%", "unknown metric 'latency'"),      # not a metric
    ("ttft > +10%", "needs a statistic"),                    # latency needs p50/p90/p99/mean
    ("p99 throughput < -5%", "has a single value"),          # throughput has one value
    ("p99 ttft > +10", "give a unit"),                       # bare number on a latency
    ("p99 ttft >= +10%", "expected e.g."),                   # only > and <
    ("throughput < -5ms", "takes a relative change"),        # a duration is not a rate
])
def test_bad_fail_if_rules_say_why(text, message):
    with pytest.raises(FailIfError, match=message):
        parse_fail_if(text)


def entry(rel, diff, diff_ci):
    return [{"metric": "ttft", "stat": "p99", "rel": rel, "diff": diff, "diff_ci": diff_ci}]


@pytest.mark.parametrize("rule, metrics, held", [
    # +20 % and resolved: holds
    ("p99 ttft > +10%", entry(0.20, 4.0, [1.0, 7.0]), True),
    # +20 % but the CI of the difference straddles 0: noise, does not hold
    ("p99 ttft > +10%", entry(0.20, 4.0, [-1.0, 7.0]), False),
    # resolved but below the threshold
    ("p99 ttft > +10%", entry(0.05, 1.0, [0.5, 1.5]), False),
    # the better side of a "<" rule: -20 % is below -10 %
    ("p99 ttft < -10%", entry(-0.20, -4.0, [-6.0, -2.0]), True),
    # absolute threshold in ms
    ("p99 ttft > +3ms", entry(0.20, 4.0, [1.0, 7.0]), True),
])
def test_fail_if_evaluation(rule, metrics, held):
    assert evaluate(parse_fail_if(rule), metrics)["held"] is held


def test_fail_if_on_a_metric_the_comparison_lacks_says_nothing():
    assert evaluate(parse_fail_if("goodput < -5%"), entry(0.2, 4.0, [1.0, 7.0])) is None


@pytest.mark.parametrize("unit, a_val, b_val, floor_ms, verdict", [
    # a rerun's `other`: 0.9 -> 0.7 ms is -22 % with a CI excluding 0, but below the host's 3.9 ms lateness p99
    ("ms", 0.9, 0.7, 3.9, "indistinguishable"),
    # the same change on a host that took its stamps on time
    ("ms", 0.9, 0.7, 0.0, "better"),
    # a server-made change far above the floor
    ("ms", 200.0, 280.0, 3.9, "worse"),
    # rates have no ms floor
    ("req/s", 0.9, 0.7, 3.9, "worse"),
])
def test_a_verdict_needs_a_change_above_the_hosts_lateness(unit, a_val, b_val, floor_ms, verdict):
    a_draws, b_draws = a_val * np.linspace(0.99, 1.01, 100), np.full(100, b_val)
    better = "higher" if unit == "req/s" else "lower"
    e = compare._entry("m", "mean", unit, better, a_draws, b_draws, a_val, b_val, 0.05, floor_ms)
    assert e["resolved"] and e["verdict"] == verdict
