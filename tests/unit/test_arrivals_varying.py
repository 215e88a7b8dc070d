"""Ramps, stages and trace replay: pure, seeded, and statistically right."""
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loadgen.plan import arrivals

S = 1_000_000_000


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**32), r0=st.floats(0.5, 50), r1=st.floats(0.5, 50),
       d_s=st.floats(1, 30), base=st.sampled_from(["poisson", "constant"]))
def test_ramp_is_reproducible_sorted_and_starts_at_zero(seed, r0, r1, d_s, base):
    a = arrivals.ramp(r0, r1, int(d_s * S), seed=seed, base=base, n=200)
    assert np.array_equal(a, arrivals.ramp(r0, r1, int(d_s * S), seed=seed, base=base, n=200))
    assert a.dtype == np.int64 and len(a) == 200 and a[0] == 0 and np.all(np.diff(a) >= 0)


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**32), r0=st.floats(5, 40), r1=st.floats(5, 40))
def test_ramp_count_matches_the_integral_of_the_rate(seed, r0, r1):
    # Over a 60 s ramp the count is Poisson with mean (r0 + r1) / 2 * 60 (+1 at t=0); allow 5 sigma.
    mean = (r0 + r1) / 2 * 60
    n = len(arrivals.ramp(r0, r1, 60 * S, seed=seed))
    assert abs(n - 1 - mean) < 5 * math.sqrt(mean) + 1


def test_constant_ramp_places_events_where_the_integral_reaches_each_integer():
    # rate 0 -> 2/s over 10 s: L(t) = t^2 / 10, so event i is at sqrt(10 i) s.
    got = arrivals.ramp(0, 2, 10 * S, seed=0, base="constant")
    want = np.rint(np.sqrt(10 * np.arange(10)) * S).astype(np.int64)
    assert np.array_equal(got, want)


def test_ramp_rate_rises_over_time():
    # Second half of a 1 -> 20/s ramp must hold far more arrivals than the first half (3/4 vs 1/4 ... )
    a = arrivals.ramp(1, 20, 100 * S, seed=4)
    first = np.sum(a < 50 * S)
    assert 2.5 < (len(a) - first) / first < 4.0  # expected (20+10.5)/(10.5+1) = 2.65..., widened


def test_stages_pause_and_hold():
    # 10 s at 5/s, a 10 s pause, 10 s at 5/s: no arrival lands inside the pause.
    a = arrivals.stages([(10 * S, 5, 5), (10 * S, 0, 0), (10 * S, 5, 5)], seed=2, base="constant")
    assert not np.any((a > 10 * S) & (a < 20 * S))
    assert len(a) == 100  # constant base: exactly 50 per active stage
    # bounded by a count beyond the stages, the last rate holds
    b = arrivals.stages([(1 * S, 10, 10)], seed=2, base="constant", n=30)
    assert b[-1] == round(2.9 * S)


@settings(max_examples=30, deadline=None)
@given(gaps=st.lists(st.integers(0, 10**10), min_size=1, max_size=50), origin=st.integers(0, 10**15))
def test_replay_at_time_scale_1_reproduces_the_gaps_exactly(gaps, origin):
    trace = origin + np.concatenate(([0], np.cumsum(gaps))).astype(np.int64)
    out = arrivals.replay(trace, time_scale=1.0)
    assert out[0] == 0 and np.array_equal(np.diff(out), np.diff(trace))


@settings(max_examples=30, deadline=None)
@given(gaps=st.lists(st.integers(1, 10**9), min_size=2, max_size=50), rate=st.floats(0.01, 100))
def test_replay_at_a_target_rate_offers_that_rate_and_keeps_the_gap_shape(gaps, rate):
    trace = np.concatenate(([0], np.cumsum(gaps))).astype(np.int64)
    out = arrivals.replay(trace, rate_per_s=rate)
    offered = (len(out) - 1) * S / out[-1]
    assert offered == pytest.approx(rate, rel=1e-6, abs=1e-6 * len(out))
    # The gaps are the trace's gaps times one factor (up to 1 ns rounding per offset).
    f = (len(trace) - 1) * S / (trace[-1] * rate)
    assert np.all(np.abs(out - trace * f) <= 1)


@pytest.mark.parametrize("kw,expected", [
    ({"start_ns": 15}, [0, 6, 30]),                  # window starts at the first t >= t0 + 15
    ({"limit": 2}, [0, 10]),                          # first 2 requests
    ({"start_ns": 10, "limit": 2}, [0, 10]),          # both, start first
    ({"time_scale": 0.5}, [0, 5, 10, 13, 25]),        # twice as fast
    ({"duration_ns": 30}, [0, 10, 20, 26]),              # bound after scaling
])
def test_replay_window_and_scale(kw, expected):
    trace = np.array([100, 110, 120, 126, 150], dtype=np.int64)
    assert arrivals.replay(trace, **kw).tolist() == expected


@pytest.mark.parametrize("call", [
    lambda: arrivals.replay(np.array([0, 5]), time_scale=1, rate_per_s=2),   # both scale rules
    lambda: arrivals.replay(np.array([5, 0])),                                # unsorted
    lambda: arrivals.replay(np.array([0, 5]), time_scale=0),                  # scale must be > 0
    lambda: arrivals.replay(np.array([3]), rate_per_s=1),                     # rate needs a span
    lambda: arrivals.stages([], seed=0),                                      # no stage
    lambda: arrivals.stages([(S, -1, 2)], seed=0),                            # negative rate
    lambda: arrivals.stages([(S, 1, 0)], seed=0, n=5),                        # ends at 0 with a count
])
def test_bad_parameters_raise(call):
    with pytest.raises(ValueError):
        call()


def test_time_rescaled_ramp_gaps_are_unit_exponential():
    # Under L(t) = r0 t + (r1 - r0) t^2 / (2T) the rescaled gaps of a Poisson ramp are Exp(1): a KS test
    # at alpha = 0.001 checks the inversion itself, not just the count.
    r0, r1, T = 2.0, 30.0, 200.0
    t = arrivals.ramp(r0, r1, int(T * S), seed=13) / S
    mass = r0 * t + (r1 - r0) * t ** 2 / (2 * T)
    gaps = np.sort(np.diff(mass))
    n = len(gaps)
    cdf = 1 - np.exp(-gaps)
    d = max(np.max(np.arange(1, n + 1) / n - cdf), np.max(cdf - np.arange(n) / n))
    assert d < 1.95 / math.sqrt(n)
    # and the test can fail: treating the ramp as homogeneous at its mean rate is rejected
    flat = np.sort(np.diff(t) * (r0 + r1) / 2)
    cdf = 1 - np.exp(-flat)
    assert max(np.max(np.arange(1, n + 1) / n - cdf), np.max(cdf - np.arange(n) / n)) > 1.95 / math.sqrt(n)
