import math

import numpy as np
import pytest

from loadgen.plan import arrivals


def ks_statistic_exponential(gaps_s: np.ndarray, rate: float) -> float:
    x = np.sort(gaps_s)
    cdf = 1.0 - np.exp(-rate * x)
    n = len(x)
    return float(max(np.max(np.arange(1, n + 1) / n - cdf), np.max(cdf - np.arange(n) / n)))


@pytest.mark.parametrize("make", [
    lambda s: arrivals.poisson(10, seed=s, n=500),
    lambda s: arrivals.gamma(10, 0.25, seed=s, n=500),
    lambda s: arrivals.poisson(10, seed=s, duration_ns=20 * 10**9),
])
def test_same_seed_same_schedule_other_seed_other(make):
    assert np.array_equal(make(7), make(7))
    assert not np.array_equal(make(7), make(8))


@pytest.mark.parametrize("offsets", [
    arrivals.poisson(50, seed=1, n=2000),
    arrivals.gamma(50, 0.5, seed=1, n=2000),
    arrivals.constant(50, n=2000),
    arrivals.poisson(50, seed=1, duration_ns=10**10),
])
def test_offsets_are_sorted_int64_from_zero(offsets):
    assert offsets.dtype == np.int64
    assert offsets[0] == 0
    assert np.all(np.diff(offsets) >= 0)


def test_constant_offsets_are_exact():
    # 3/s: offsets are round(i * 1e9 / 3), computed directly so no rounding accumulates.
    assert arrivals.constant(3, n=4).tolist() == [0, 333_333_333, 666_666_667, 1_000_000_000]
    assert arrivals.constant(2, duration_ns=2 * 10**9).tolist() == [0, 500_000_000, 1_000_000_000, 1_500_000_000]


def test_poisson_count_in_duration_within_statistical_bounds():
    # Over 100 s at 20/s the count is Poisson(2000) (+1 for the arrival at 0): 5 sigma = 224.
    for seed in range(5):
        n = len(arrivals.poisson(20, seed=seed, duration_ns=100 * 10**9))
        assert abs(n - 2001) < 5 * math.sqrt(2000), n


def test_duration_bound_excludes_the_end():
    offsets = arrivals.poisson(1000, seed=3, duration_ns=10**9)
    assert offsets[-1] < 10**9


def test_poisson_mean_gap_and_ks():
    rate, n = 20.0, 20_000
    gaps = np.diff(arrivals.poisson(rate, seed=11, n=n + 1)) / 1e9
    # Mean of n exponential gaps: sd = (1/rate)/sqrt(n); allow 5 sd.
    assert abs(gaps.mean() - 1 / rate) < 5 * (1 / rate) / math.sqrt(n)
    # Kolmogorov-Smirnov against Exp(rate): critical value at alpha = 0.001 is 1.95/sqrt(n).
    assert ks_statistic_exponential(gaps, rate) < 1.95 / math.sqrt(n)


def test_ks_rejects_a_non_poisson_schedule():
    # The test above must be able to fail: gamma gaps with CV 2 are far from exponential.
    rate, n = 20.0, 20_000
    gaps = np.diff(arrivals.gamma(rate, 0.25, seed=11, n=n + 1)) / 1e9
    assert ks_statistic_exponential(gaps, rate) > 1.95 / math.sqrt(n)


@pytest.mark.parametrize("burstiness", [0.25, 0.5, 1.0, 2.0, 8.0])
def test_gamma_cv_is_one_over_sqrt_burstiness(burstiness):
    gaps = np.diff(arrivals.gamma(10, burstiness, seed=5, n=50_001)) / 1e9
    assert abs(gaps.mean() - 0.1) < 0.1 * 0.05
    assert abs(gaps.std() / gaps.mean() - 1 / math.sqrt(burstiness)) < 0.05 / math.sqrt(burstiness)


@pytest.mark.parametrize("call", [
    lambda: arrivals.poisson(0, seed=1, n=5),            # rate must be > 0
    lambda: arrivals.poisson(5e-324, seed=1, duration_ns=10**9),  # gaps overflow int64 ns (looped)
    lambda: arrivals.gamma(math.inf, 1, seed=1, duration_ns=10**9),  # zero gaps never reach the end (looped)
    lambda: arrivals.poisson(1, seed=1),                 # no bound
    lambda: arrivals.poisson(1, seed=1, n=5, duration_ns=10),  # two bounds
    lambda: arrivals.gamma(1, 0, seed=1, n=5),           # burstiness must be > 0
    lambda: arrivals.constant(1, n=-1),                  # negative count
])
def test_bad_parameters_raise_value_error(call):
    with pytest.raises(ValueError):
        call()
