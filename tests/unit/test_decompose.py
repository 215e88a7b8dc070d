"""analysis/decompose.py and steps.py on synthetic runs (tests/frames.py): every method, the sum rule,
the decode split, aggregates."""
import polars as pl
import pytest

from loadgen.analysis.decompose import COMPONENTS, aggregate, by_prompt_tokens, by_window, decompose
from tests.frames import make_run, stream

CAL = {"prefill_ms": {"coef": [0.0, 0.1]}, "itl_ms": {"coef": [10.0]}}  # prefill_idle = 0.1 ms/token


def row(d: pl.DataFrame, rid: str) -> dict:
    return d.filter(pl.col("request_id") == rid).row(0, named=True)


def test_server_timings_are_taken_as_reported():
    run = make_run([{"id": "a", "lag": 1, "connect": 2, "tokens": stream(40, 10, 10),
                     "server_queue": 10.0, "server_prefill": 25.0, "server_decode": 89.0}])
    r = row(decompose(run, CAL), "a")
    assert r["method"] == "server_timings"
    assert (r["send_lag_ms"], r["connect_ms"], r["queue_ms"], r["prefill_ms"], r["decode_ms"]) == (1, 2, 10, 25, 89)
    # e2e 130 = 1 + 2 + 10 + 25 + 89 + other
    assert r["other_ms"] == pytest.approx(3.0)


def test_prefill_only_timings_derive_the_queue():
    # llama.cpp gives prefill but no queue: queue = ttft_from_send - connect - prefill = 40 - 0 - 25
    run = make_run([{"id": "a", "tokens": stream(40, 3, 10), "server_prefill": 25.0, "server_decode": 20.0}])
    r = row(decompose(run, None), "a")
    assert (r["method"], r["queue_ms"], r["prefill_ms"]) == ("server_timings", 15.0, 25.0)


def test_calibrated_on_an_idle_server_puts_the_whole_ttft_in_prefill():
    # No other stream: no step boundary between send and first token, so the prefill started at send.
    run = make_run([{"id": "a", "intended": 0, "prompt": 200, "tokens": stream(30, 5, 10)}])
    r = row(decompose(run, CAL), "a")
    assert (r["method"], r["queue_ms"], r["prefill_ms"]) == ("calibrated", 0.0, 30.0)


@pytest.mark.parametrize("busy_tokens, first_token, prompt, scheduled_ms", [
    # steps of 10 ms; the step 45 -> 65 is 10 ms longer (r's prefill); r's compute at 0.1 ms/token is
    # 8 ms, 0.75 x 8 = 6 <= 10: its prefill is that one step
    ([5, 15, 25, 35, 45, 65, 75, 85], 65, 80, 45),
    # chunked: steps 25 -> 40 -> 55 -> 70 are 5 ms long each over the 10 ms decode step; compute 12 ms,
    # 0.75 x 12 = 9 needs two excess steps: the prefill started at 40
    ([5, 15, 25, 40, 55, 70, 80, 90], 70, 120, 40),
    # a short prompt in a step with no visible excess still takes at least its own step
    ([5, 15, 25, 35, 45, 55, 65], 55, 10, 45),
])
def test_calibrated_under_load_starts_the_prefill_at_a_step_boundary(busy_tokens, first_token, prompt, scheduled_ms):
    run = make_run([{"id": "busy", "tokens": busy_tokens},
                    {"id": "r", "intended": 12, "prompt": prompt, "tokens": [first_token, first_token + 10]}])
    r = row(decompose(run, CAL), "r")
    assert r["prefill_ms"] == pytest.approx(first_token - scheduled_ms)
    assert r["queue_ms"] == pytest.approx(scheduled_ms - 12)


def test_without_calibration_or_timings_queue_and_prefill_are_unknown():
    run = make_run([{"id": "a", "tokens": stream(30, 5, 10)}])
    r = row(decompose(run, None), "a")
    assert (r["method"], r["queue_ms"], r["prefill_ms"]) == ("none", None, None)
    assert r["other_ms"] == pytest.approx(30.0)  # the server-side TTFT lands in `other`


@pytest.mark.parametrize("calibration, timings", [
    (CAL, {}),                                                                   # calibrated
    (None, {}),                                                                  # none
    (None, {"server_queue": 3.0, "server_prefill": 9.0, "server_decode": 70.0}),  # server timings
])
def test_components_add_up_to_e2e(calibration, timings):
    run = make_run([{"id": "busy", "tokens": stream(5, 30, 10)},
                    {"id": "a", "intended": 20, "lag": 0.5, "connect": 1.5, "tokens": stream(47, 8, 10, {3: 25}),
                     **timings}])
    d = decompose(run, calibration).with_columns(pl.col(f"{c}_ms").fill_null(0) for c in COMPONENTS)
    total = sum(d[f"{c}_ms"] for c in ("send_lag", "connect", "queue", "prefill", "decode", "other"))
    assert (total - d["e2e_ms"]).abs().max() < 1e-9
    split = d["decode_ideal_ms"] + d["decode_contention_ms"] + d["decode_stalls_ms"]
    assert (split - d["decode_ms"]).abs().max() < 1e-9


def test_decode_split_ideal_stalls_contention():
    # a: 10 tokens, idle ITL 10 ms; steady gaps of 11 ms (contention 1 ms each) and one gap of 41 ms
    # that contains b's first token (b's prefill stalled a): stall = 41 - 11 (a's median gap) = 30.
    a = {"id": "a", "tokens": stream(20, 10, 11, {5: 30})}
    b = {"id": "b", "intended": 60, "prompt": 100, "tokens": [a["tokens"][5], 200]}
    r = row(decompose(make_run([a, b]), CAL), "a")
    assert r["decode_ideal_ms"] == pytest.approx(90.0)
    assert r["decode_stalls_ms"] == pytest.approx(30.0)
    assert r["decode_contention_ms"] == pytest.approx(9.0)
    assert r["stall_causes"] == ["b"]


def test_aggregates_tail_windows_and_lengths():
    reqs = [{"id": f"r{i}", "intended": i * 1000, "prompt": 100 + 100 * i, "tokens": stream(i * 1000 + 10 + i, 3, 5)}
            for i in range(10)]
    d = decompose(make_run(reqs), CAL)
    agg = aggregate(d)
    assert agg["n"] == 10 and agg["method"] == "calibrated"
    assert agg["p99_e2e"]["n"] == 1 and agg["p99_ttft"]["prefill"] == pytest.approx(19.0)  # the slowest, r9
    assert set(agg["mean"]) == set(COMPONENTS)
    windows = by_window(d, 5_000_000_000)
    assert [w["n"] for w in windows] == [5, 5] and windows[1]["t_s"] == 5.0
    bins = by_prompt_tokens(d, bins=2)
    assert [b["n"] for b in bins] == [5, 5] and bins[0]["ttft_p50"] < bins[1]["ttft_p50"]


def test_a_stall_no_longer_than_the_clients_own_lateness_is_not_counted():
    # v's gap 6 holds q's first token and 9 ms of excess, but v's whole decode is only 4 ms beyond its
    # ideal (its other gaps were read early): on a host whose loop ran 5 ms late at p99 that is client
    # jitter; on a quiet host it is a stall (of at most those 4 ms).
    v = stream(0, 12, 10, {6: 9})
    v[8:] = [t - 5 for t in v[8:]]
    reqs = [{"id": "v", "tokens": v}, {"id": "q", "intended": 40, "tokens": [55.0, 555.0]}]
    cal = {"prefill_ms": {"coef": [0.0, 0.1]}, "itl_ms": {"coef": [10.0]}}
    quiet = row(decompose(make_run(reqs), cal), "v")
    busy = row(decompose(make_run(reqs, {"generator": {"loop_lateness_ms": {"p99": 5.0}}}), cal), "v")
    assert quiet["decode_ms"] - quiet["decode_ideal_ms"] == pytest.approx(4.0)
    assert quiet["decode_stalls_ms"] == pytest.approx(4.0) and busy["decode_stalls_ms"] == 0.0
