"""The knee rule and the rate search of loadgen/run/sweep.py, and the sweep's flag parsing, on made-up points."""
import numpy as np
import pytest

from loadgen.analysis.knee import keeps_up, knee
from loadgen.run.sweep import SweepSpec, search
from loadgen.cli.sweep_args import ArgError, parse_rates


def pt(rate, completed, ttft_p99=10.0, valid=True, offered=None):
    return {"rate_per_s": rate, "offered_per_s": offered or rate, "completed_per_s": completed, "valid": valid,
            "latency_ms": {"ttft": {"p99": ttft_p99}}}


@pytest.mark.parametrize("points, knee_rate, first_bad, ttft_knee", [
    # completions follow the offered rate up to 8/s, fall behind at 16/s: knee 8, ttft knee where p99 > 3x 10
    ([pt(2, 2.0), pt(4, 3.9), pt(8, 7.7, 25), pt(16, 11.0, 900)], 8, 16, 8),
    # 4.9% short still keeps up, 5.1% short does not (tolerance 5%)
    ([pt(10, 9.51), pt(20, 18.98)], 10, 20, 20),
    # the lowest point already falls behind: no knee
    ([pt(50, 30.0), pt(100, 31.0)], None, 50, 100),
    # an invalid run (the generator fell behind) ends the knee even if completions look fine
    ([pt(2, 2.0), pt(4, 4.0, valid=False), pt(8, 8.0)], 2, 4, 8),
    # a higher point that recovers does not move the knee past the first miss (monotone rule)
    ([pt(2, 2.0), pt(4, 3.0), pt(8, 8.0)], 2, 4, 8),
    # never saturated: the knee is the highest point measured
    ([pt(1, 1.0), pt(2, 2.0)], 2, None, 2),
    # the offered rate is the realized one, not the configured rate
    ([pt(10, 12.0, offered=12.5)], 10, None, 10),
])
def test_knee(points, knee_rate, first_bad, ttft_knee):
    k = knee(points)
    assert (k["rate_per_s"], k["first_saturated_per_s"], k["ttft_knee_per_s"]) == (knee_rate, first_bad, ttft_knee)
    assert k["saturated"] == (first_bad is not None)


def capacity(mu):
    # A fake server of capacity mu: completions = min(offered, mu).
    calls = []

    def measure(r):
        calls.append(r)
        return pt(r, min(r, mu))
    return measure, calls


@pytest.mark.parametrize("spec, mu, lo, hi, rates", [
    # geometric from 1 by 2 until the criterion fails at 16 (mu = 10): bracket 8..16, 5 points
    (SweepSpec(start_per_s=1), 10, 8, 16, [1, 2, 4, 8, 16]),
    # + 3 bisections at geometric midpoints of the rounded rates: 11.31 (miss), 9.512 (keeps up),
    # 10.37 (10/10.37 = 96.4 %: within the 5 % tolerance, so it keeps up)
    (SweepSpec(start_per_s=1, refine=3), 10, 10.37, 11.31, [1, 2, 4, 8, 16, 11.31, 9.512, 10.37]),
    # the first point already misses: the series goes down until one keeps up
    (SweepSpec(start_per_s=40), 10, 10, 20, [40, 20, 10]),
    # never misses below max_rate: stops there, no upper bracket
    (SweepSpec(start_per_s=1, max_rate_per_s=5), 100, 4, None, [1, 2, 4]),
    # max_points bounds the series
    (SweepSpec(start_per_s=1, max_points=3), 100, 4, None, [1, 2, 4]),
    # an explicit list is measured whole (in order), then refined between 4 (ok) and 16 (miss)
    (SweepSpec(rates=(16, 2, 4), refine=1), 10, 8, 16, [2, 4, 16, 8]),
])
def test_search_brackets_then_bisects(spec, mu, lo, hi, rates):
    measure, calls = capacity(mu)
    found = search(measure, keeps_up, spec)
    assert (found["lo"], found["hi"]) == (lo, hi)
    assert calls == rates and found["points"] == len(rates)
    if hi is not None:
        assert found["resolution_rel"] == pytest.approx(hi / lo - 1)


@pytest.mark.parametrize("text, expected", [
    ("2,4,8/s", (2.0, 4.0, 8.0)),        # a unit on the last item applies to all
    ("120/m, 60", (1.0, 2.0)),           # per minute, sorted
    ("0.5,1", (0.5, 1.0)),               # bare numbers are per second
])
def test_parse_rates(text, expected):
    assert parse_rates(text) == expected


@pytest.mark.parametrize("text, message", [
    ("2,x,8/s", "bad rate 'x/s'"),       # the bad item is named
    ("2,2/s", "listed twice"),           # duplicates would be one folder
    ("", "expected e.g."),               # nothing
])
def test_bad_rates(text, message):
    with pytest.raises(ArgError, match=message):
        parse_rates(text)


def test_fitted_rate_weighs_every_event():
    from loadgen.metrics import fitted_rate_per_s

    even = np.arange(0, 2_000_000_000, 100_000_000)  # 20 events, 10/s
    assert fitted_rate_per_s(even) == pytest.approx(10.0)
    # the last one 300 ms late (a slow last request): (n - 1) / span says 8.6/s; the fit barely moves
    late = even.copy()
    late[-1] += 300_000_000
    assert 19 / ((late[-1] - late[0]) / 1e9) == pytest.approx(8.64, abs=0.01)
    assert fitted_rate_per_s(late) == pytest.approx(10.0, rel=0.05)
    assert fitted_rate_per_s(even[:2]) is None  # too few to fit
