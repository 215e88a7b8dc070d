"""The invalid-run rule (loadgen/run/selfcheck.py) on hand-made dispatch times: no clock, no run."""
import numpy as np
import pytest

from loadgen.run.selfcheck import Limits, check

MS = 1_000_000


def poisson_plan(n=2000, rate=100.0, seed=0) -> np.ndarray:
    return np.cumsum(np.random.default_rng(seed).exponential(1e9 / rate, n)).astype(np.int64)


def test_a_kept_schedule_is_valid():
    plan = poisson_plan()
    jitter = np.random.default_rng(1).integers(0, 200_000, plan.size)  # up to 0.2 ms late
    reasons, stats = check(plan, plan + jitter)
    assert reasons == []
    assert stats["send_lag_p99_ms"] < 0.2 and stats["overdue"] == 0
    assert stats["cv_dispatch"] == pytest.approx(stats["cv_plan"], abs=0.01)


def test_send_lag_p99_above_the_threshold_is_invalid_and_says_what_to_do():
    plan = poisson_plan()
    late = plan.copy()
    late[::50] += 8 * MS  # 2 % of the requests 8 ms late: p99 is 8 ms
    reasons, stats = check(plan, late)
    assert any("send_lag p99" in r and "add workers or lower the rate" in r for r in reasons)
    assert stats["overdue"] == plan.size // 50
    # the threshold is configurable
    assert not [r for r in check(plan, late, limits=Limits(max_send_lag_p99_ns=10 * MS))[0] if "send_lag" in r]


def test_waiting_for_a_concurrency_slot_is_not_generator_lag():
    plan = poisson_plan()
    wait = np.full(plan.size, 50 * MS)
    reasons, _ = check(plan, plan + wait, wait)
    assert reasons == []


def test_overdue_requests_sent_in_a_burst_change_the_arrival_shape():
    # The loop was blocked for 200 ms every second: every request due meanwhile left at the end of the
    # block, back to back (what a silent catch-up does). The rate holds; the shape does not.
    plan = np.arange(300 * MS, 9_900 * MS, 5 * MS, dtype=np.int64)  # constant 200/s: CV 0
    phase = plan % (1000 * MS)
    sent = np.where(phase < 200 * MS, plan - phase + 200 * MS + np.arange(plan.size) % 40 * 1000, plan)
    reasons, stats = check(plan, sent, limits=Limits(max_send_lag_p99_ns=1000 * MS))  # lag rule off
    assert stats["cv_plan"] == pytest.approx(0, abs=1e-9)
    assert any("arrival shape" in r for r in reasons), stats
    assert not any("achieved rate" in r for r in reasons)


def test_a_generator_that_falls_behind_misses_the_rate():
    plan = poisson_plan(rate=1000)
    sent = plan + np.arange(plan.size) * 100_000  # each request 0.1 ms later than the one before
    reasons, stats = check(plan, sent, limits=Limits(max_send_lag_p99_ns=10**12))
    assert stats["achieved_per_s"] < stats["offered_per_s"] * 0.95
    assert any("achieved rate" in r for r in reasons)


def test_too_few_requests_say_nothing_about_rate_or_shape():
    plan = np.arange(10, dtype=np.int64) * 10 * MS
    sent = plan.copy()
    sent[-1] += 4 * MS  # 40 % rate error on 9 gaps; lag still under 5 ms
    assert check(plan, sent)[0] == []
    assert check(np.empty(0, np.int64), np.empty(0, np.int64))[0] == []


def test_a_binding_concurrency_cap_does_not_make_the_run_invalid():
    # 100/s offered through a cap that carries ~50/s. Each request leaves when a slot frees,
    # so dispatch gaps are 20 ms apart (rate halved, CV ~0) and the waits grow; on the old code the rate
    # and shape rules fired ("add workers"). The waits are the user's cap, recorded as slot_wait.
    plan = poisson_plan(n=500, rate=100)
    dispatched = np.maximum.accumulate(np.maximum(plan, plan[0] + np.arange(plan.size) * 20 * MS))
    wait = dispatched - plan
    reasons, stats = check(plan, dispatched, wait)
    assert wait.max() > 1000 * MS  # the cap really bound
    assert reasons == [], reasons
    assert stats["achieved_per_s"] == pytest.approx(stats["offered_per_s"])


def test_a_closed_loop_is_judged_on_send_lag_only():
    # A closed loop's rate is an outcome (the server's replies), not a plan to keep.
    plan = poisson_plan(rate=1000)
    sent = plan + np.arange(plan.size) * 100_000
    assert any("achieved rate" in r for r in check(plan, sent, limits=Limits(max_send_lag_p99_ns=10**12))[0])
    assert check(plan, sent, limits=Limits(max_send_lag_p99_ns=10**12), open_loop=False)[0] == []
    late = plan + 8 * MS
    assert any("send_lag" in r for r in check(plan, late, open_loop=False)[0])
