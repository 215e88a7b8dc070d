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


@pytest.mark.parametrize("prompt, scheduled_ms", [
    # idle prefill 0.1 ms/token: 80 tokens = 8 ms < one 10 ms step: prefill = the last step (50 -> 60)
    (80, 50.0),
    # 200 tokens = 20 ms: at least 0.75 * 20 = 15 ms before the first token -> the boundary at 40
    (200, 40.0),
])
def test_calibrated_under_load_starts_the_prefill_at_a_step_boundary(prompt, scheduled_ms):
    busy = {"id": "busy", "intended": 0, "tokens": stream(5, 12, 10)}  # tokens at 5, 15, ..., 115
    run = make_run([busy, {"id": "r", "intended": 12, "prompt": prompt, "tokens": [65, 75, 85]}])
    # boundaries are at 5, 15, ..., and r's first token at 65 shares the step of busy's token at 65
    r = row(decompose(run, CAL), "r")
    assert r["prefill_ms"] == pytest.approx(65 - scheduled_ms - 5)  # boundaries are at x5: 55 or 45
    assert r["queue_ms"] == pytest.approx(65 - 12 - r["prefill_ms"])


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
