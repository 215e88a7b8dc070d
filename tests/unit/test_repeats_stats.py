"""The across-run statistics of --repeat N (loadgen/analysis/repeats.py) against known values: Student's t
quantiles from published tables and closed forms, the t CI of a mean, Welch's t, and a single run against
a repeated side."""
import math

import numpy as np
import pytest

from loadgen.analysis import repeats


@pytest.mark.parametrize("df, q975", [(1, 12.706204736), (2, 4.302652730), (3, 3.182446305), (4, 2.776445105),
                                      (10, 2.228138852), (30, 2.042272456), (1000, 1.962339081)])
def test_t_quantile_matches_the_tables(df, q975):
    assert repeats.t_quantile(0.975, df) == pytest.approx(q975, abs=1e-8)
    assert repeats.t_quantile(0.025, df) == pytest.approx(-q975, abs=1e-8)


@pytest.mark.parametrize("t", [-7.0, -1.3, 0.0, 0.4, 2.5, 40.0])
def test_t_cdf_matches_the_closed_forms(t):
    assert repeats.t_cdf(t, 1) == pytest.approx(0.5 + math.atan(t) / math.pi, abs=1e-12)      # Cauchy
    assert repeats.t_cdf(t, 2) == pytest.approx(0.5 + t / (2 * math.sqrt(2 + t * t)), abs=1e-12)


def _density_integral(x: float, df: float) -> float:
    grid = np.linspace(0.0, x, 400_001)
    c = math.exp(math.lgamma((df + 1) / 2) - math.lgamma(df / 2)) / math.sqrt(df * math.pi)
    return 0.5 + float(np.trapezoid(c * (1 + grid * grid / df) ** (-(df + 1) / 2), grid))


@pytest.mark.parametrize("df", [2.5, 3.4482758620689653, 7.3])
def test_t_quantile_for_welch_degrees_of_freedom(df):
    # a non-whole df (Welch-Satterthwaite) has no table: the density integrated numerically to the quantile
    assert _density_integral(repeats.t_quantile(0.975, df), df) == pytest.approx(0.975, abs=1e-9)


def test_t_quantile_rejects_what_it_cannot_answer():
    for p, df in ((0.0, 3), (1.0, 3), (0.5, 0)):
        with pytest.raises(ValueError):
            repeats.t_quantile(p, df)


def test_spread_is_the_t_interval_of_the_mean():
    s = repeats.spread([10.0, 12.0, 14.0])
    half = 4.302652730 * 2.0 / math.sqrt(3)
    assert (s["n"], s["mean"], s["sd"]) == (3, 12.0, pytest.approx(2.0))
    assert s["ci"] == [pytest.approx(12 - half), pytest.approx(12 + half)]
    assert s["cv"] == pytest.approx(2 / 12)
    one = repeats.spread([5.0])
    assert (one["mean"], one["sd"], one["ci"]) == (5.0, None, [None, None])


def test_welch_on_a_worked_example():
    # R: t.test(c(4, 5, 7), c(1, 2, 3)): t = 3.1623, df = 3.4483, p-value = 0.04191
    w = repeats.welch([1.0, 2.0, 3.0], [4.0, 5.0, 7.0])
    se = math.sqrt(1 / 3 + (7 / 3) / 3)
    assert w["diff"] == pytest.approx(10 / 3)
    assert w["t"] == pytest.approx((10 / 3) / se) == pytest.approx(3.16228, abs=1e-5)
    assert w["df"] == pytest.approx(3.44828, abs=1e-5)
    assert w["p"] == pytest.approx(2 * (1 - _density_integral(w["t"], w["df"])), abs=1e-8)
    assert w["p"] == pytest.approx(0.04191, abs=1e-5)
    half = repeats.t_quantile(0.975, w["df"]) * se
    assert w["diff_ci"] == [pytest.approx(10 / 3 - half), pytest.approx(10 / 3 + half)]
    assert w["diff_ci"][0] > 0  # p < 0.05: the CI excludes 0


def test_welch_without_variance_is_exact():
    assert repeats.welch([2.0, 2.0], [3.0, 3.0])["diff_ci"] == [1.0, 1.0]


def test_a_single_run_against_repeats_is_a_prediction_interval():
    r = repeats.single_vs_repeats([10.0, 12.0, 14.0], 20.0)
    half = 4.302652730 * 2.0 * math.sqrt(1 + 1 / 3)
    assert r["diff"] == pytest.approx(8.0)
    assert r["diff_ci"] == [pytest.approx(8 - half), pytest.approx(8 + half)]
    assert r["df"] == 2


def test_figures_need_every_run():
    summaries = [{"latency_ms": {"ttft": {"p50": v, "p99": 2 * v}}, "throughput": {"requests_per_s": 5.0}}
                 for v in (1.0, 2.0, 3.0)]
    summaries[2]["throughput"] = {"requests_per_s": None}
    by = {(f["metric"], f["stat"]): f for f in repeats.figures(summaries)}
    assert by[("ttft", "p99")]["values"] == [2.0, 4.0, 6.0] and by[("ttft", "p99")]["mean"] == 4.0
    assert by[("throughput", "value")]["values"] == [5.0, 5.0, None]
    assert by[("throughput", "value")]["mean"] is None
    assert ("goodput", "value") not in by and ("tpot", "p50") not in by


def test_the_note_says_whether_the_prompt_text_was_fresh():
    from loadgen.run.repeat import NOTE, note

    assert note([{"config": {"seed": 1}}] * 3) == NOTE                       # no salt recorded
    assert note([{"config": {"prompt_salt": 7}}, {"config": {"prompt_salt": 7}}]) == NOTE   # one salt shared
    fresh = note([{"config": {"prompt_salt": 7}}, {"config": {"prompt_salt": 9}}])
    assert "own prompt text" in fresh and "7, 9" in fresh
