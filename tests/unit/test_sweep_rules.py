"""The knee rule and the rate search of loadgen/run/sweep.py, and the sweep's flag parsing, on made-up points."""
import numpy as np
import pytest

from loadgen.analysis.knee import keeps_up, knee, stop_reason
from loadgen.run.sweep import SweepSpec, search
from loadgen.run.sweep_args import ArgError, parse_rates


def pt(rate, completed, ttft_p99=10.0, valid=True, offered=None, tpot=20.0, ttft_p50=5.0, waiting=None, e2e=100.0):
    return {"rate_per_s": rate, "offered_per_s": offered or rate, "completed_per_s": completed, "valid": valid,
            "invalid_reasons": [] if valid else ["generator lag p99 20.9 ms > 5 ms"],
            "latency_ms": {"ttft": {"p99": ttft_p99, "p50": ttft_p50}, "tpot": {"p50": tpot}, "e2e": {"p50": e2e}},
            "server_mean_waiting": waiting}


@pytest.mark.parametrize("points, knee_rate, first_bad, ttft_knee", [
    # completions follow the offered rate up to 8/s, fall behind at 16/s: knee 8, ttft knee where p99 > 3x 10
    ([pt(2, 2.0), pt(4, 3.9), pt(8, 7.7, 25), pt(16, 11.0, 900)], 8, 16, 8),
    # 4.9% short still keeps up, 5.1% short does not (tolerance 5%)
    ([pt(10, 9.51), pt(20, 18.98)], 10, 20, 20),
    # the lowest point already falls behind: no knee
    ([pt(50, 30.0), pt(100, 31.0)], None, 50, 100),
    # an invalid run (the generator fell behind) is excluded: it neither ends nor wipes the knee
    ([pt(2, 2.0), pt(4, 4.0, valid=False), pt(8, 8.0)], 8, None, 8),
    # ... nor when it is the lowest point: the base of the latency rules is the lowest valid point
    ([pt(1, 1.0, valid=False, tpot=5.0), pt(2, 2.0), pt(4, 4.0, tpot=39.0), pt(8, 8.0, tpot=41.0)], 4, 8, 8),
    # TPOT growth past 2x the base's (vLLM's defaults: 21 -> 65 ms) saturates though completions keep up
    ([pt(2, 2.0, tpot=21.0), pt(4, 4.0, tpot=30.0), pt(8, 8.0, tpot=65.0)], 4, 8, 8),
    # queueing: the median request waits for its first token longer than a whole request took at the base
    # (TTFT p50 10 -> 110 ms against the base's e2e p50 of 100 ms); 3x TTFT from slower steps is not a queue
    ([pt(2, 2.0, ttft_p50=10.0), pt(4, 4.0, ttft_p50=109.0), pt(8, 8.0, ttft_p50=111.0)], 4, 8, 8),
    # the server's own waiting gauge, averaging >= 1 over the window
    ([pt(2, 2.0, waiting=0.0), pt(4, 4.0, waiting=0.6), pt(8, 8.0, waiting=1.5)], 4, 8, 8),
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
    assert k["saturated"] == (first_bad is not None) == bool(k["saturated_by"])
    assert [x["rate_per_s"] for x in k["excluded"]] == [p["rate_per_s"] for p in points if not p["valid"]]


def pooled(rate, completed, e2e):
    # a pooling API's point (embeddings, rerank): no TTFT, TPOT or ITL figures, e2e only
    p = pt(rate, completed, e2e=e2e)
    p["latency_ms"] = {"ttft": {"p50": None, "p99": None}, "tpot": {"p50": None}, "e2e": {"p50": e2e}}
    return p


def test_answers_without_a_token_queue_by_their_e2e():
    # base e2e p50 10 ms: 19.9 ms is slower steps, 20.1 ms waits longer than a whole request took at low load
    k = knee([pooled(2, 2.0, 10.0), pooled(4, 4.0, 19.9), pooled(8, 8.0, 20.1)])
    assert (k["rate_per_s"], k["first_saturated_per_s"], k["saturated_by"]) == (4, 8, ["queueing"])
    assert k["ttft_knee_per_s"] is None
    # one side with a TTFT (not a pooling sweep): the e2e stand-in is not used
    assert knee([pooled(2, 2.0, 10.0), pt(4, 4.0, e2e=50.0)])["first_saturated_per_s"] is None


def test_knee_names_the_rules_a_point_broke_and_the_excluded_points_reasons():
    k = knee([pt(1, 1.0, valid=False), pt(2, 2.0, tpot=20.0), pt(8, 5.0, tpot=45.0, ttft_p50=106.0, waiting=3.0)])
    assert k["saturated_by"] == ["completions", "queueing", "tpot", "server_waiting"]
    assert k["excluded"] == [{"rate_per_s": 1, "reasons": ["generator lag p99 20.9 ms > 5 ms"]}]
    assert k["base_rate_per_s"] == 2


@pytest.mark.parametrize("point, reason", [
    (pt(8, 8.0) | {"requests": {"scheduled": 30, "ok": 14}}, "error-dominated (16 of 30"),
    (pt(8, 3.9) | {"requests": {"scheduled": 30, "ok": 30}}, "over-saturated (completes 3.9/s of 8/s"),
    (pt(8, 4.1) | {"requests": {"scheduled": 30, "ok": 15}}, None),   # half failed, half the rate: not yet
])
def test_stop_reason(point, reason):
    got = stop_reason(point)
    assert (got is None) if reason is None else got.startswith(reason)


def test_an_explicit_list_stops_escalating_at_an_error_dominated_point():
    calls = []

    def measure(r):
        calls.append(r)
        return pt(r, r) | {"requests": {"scheduled": 20, "ok": 20 if r < 8 else 2}}
    found = search(measure, keeps_up, SweepSpec(rates=(2, 4, 8, 16, 32)), stop_reason)
    assert calls == [2, 4, 8] and (found["lo"], found["hi"]) == (4, 8)
    assert found["stopped"].startswith("stopped escalating at 8/s: error-dominated (18 of 20")


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


def _steady(intended_s, done_s):
    from loadgen.metrics import steady_rates

    t = np.asarray(intended_s) * 1e9
    return steady_rates(t, np.asarray(done_s) * 1e9, int(np.nanmin(t)))


def test_steady_rates_keep_up_below_capacity_with_poisson_noise_and_a_fill():
    # 60 Poisson sends at 4/s, each served in 0.3-0.6 s: no backlog growth, whatever the noise at the ends
    rng = np.random.default_rng(3)
    for _ in range(20):
        t = np.cumsum(rng.exponential(0.25, 60))
        s = _steady(t, t + rng.uniform(0.3, 0.6, 60))
        assert s.completed_per_s >= 0.97 * s.offered_per_s and not s.short and s.method == "trend"
        assert s.start_ns >= (t[0] + 0.3) * 1e9 and s.end_ns == round(t[-1] * 1e9)  # after the fill, to the last send


def test_steady_rates_read_a_queue_at_the_servers_capacity():
    # one server of 0.2 s per request (5/s) offered 8/s: completions at 5/s, the backlog grows by 3/s
    t = np.arange(80) / 8
    done = 0.2 * np.arange(1, 81)  # served back to back from t = 0
    s = _steady(t, done)
    assert s.offered_per_s == pytest.approx(8, rel=0.05) and s.completed_per_s == pytest.approx(5, rel=0.05)
    assert s.short and s.method == "backlog"
    # a longer run at 1.25x a 0.2 s server: the window is not short; each request waits 0.05 s longer
    t = np.arange(200) / 6.25
    s = _steady(t, 0.2 * np.arange(1, 201))
    assert not s.short and s.method == "trend" and s.completed_per_s == pytest.approx(5, rel=0.01)


def test_steady_rates_do_not_count_the_bunch_after_the_last_send():
    # continuous batching finishing every request at once after the sends stop: the fitted slope reads it
    # as ~1000/s; over the window nothing completed, so the point is behind (the 839 vs 58)
    from loadgen.metrics import fitted_rate_per_s

    t = np.arange(60) / 10
    done = t[-1] + 2 + np.arange(60) * 1e-3
    assert fitted_rate_per_s(done * 1e9) > 500
    s = _steady(t, done)
    assert s.short and s.completed_per_s < 0.02 * s.offered_per_s
    # a request that never ended (done null) stays in the backlog
    s = _steady(t, np.full(60, np.nan))
    assert s.completed_per_s < 0.02 * s.offered_per_s
    assert _steady(t[:5], t[:5] + 0.1) is None  # too few sends in the window
    # rows without an intended time are left out, not a NaN window
    s = _steady(np.append(t, np.nan), np.append(t + 0.1, np.nan))
    assert s.end_ns == round(t[-1] * 1e9) and s.completed_per_s == pytest.approx(s.offered_per_s)


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
