"""The twin validation's in-run speed (tests/e2e/twin_validation.py): the server's own timings of the requests
that had it to themselves, over the fitted profile's; and the rule that judges a run by them."""
from __future__ import annotations

import polars as pl
import pytest

from loadgen.sim.profiles import load_profile
from tests.e2e.twin_validation import in_run_speed, kept_speed, model_prefill_s

PROFILE = load_profile("h100-sxm")
MS = 1_000_000


def rows(*reqs) -> pl.DataFrame:
    # reqs: (sent_ms, first_ms, last_ms, prompt, output, server_prefill_ms, server_decode_ms, outcome)
    cols = ("sent_ns", "first_token_ns", "last_token_ns", "prompt_tokens", "output_tokens",
            "server_prefill_ms", "server_decode_ms", "outcome")
    data = {c: [r[k] for r in reqs] for k, c in enumerate(cols)}
    for c in cols[:3]:
        data[c] = [v * MS for v in data[c]]
    return pl.DataFrame(data)


def prefill_ms(prompt: int, slower: float) -> float:
    return slower * model_prefill_s(PROFILE, prompt) * 1e3


def decode_ms(prompt: int, output: int, slower: float) -> float:
    return slower * (output - 1) * PROFILE.decode_ns(1, prompt + output // 2) / 1e6


def test_requests_alone_count_and_overlapping_ones_do_not():
    r = rows(
        # alone: prefill 10 % slower, decode 20 % slower than the profile
        (0, 50, 100, 512, 9, prefill_ms(512, 1.1), decode_ms(512, 9, 1.2), "ok"),
        # these two overlap each other throughout: neither counts
        (200, 250, 300, 256, 9, prefill_ms(256, 3.0), decode_ms(256, 9, 3.0), "ok"),
        (210, 260, 310, 256, 9, prefill_ms(256, 3.0), decode_ms(256, 9, 3.0), "ok"),
        # alone, but failed: its timings are not the server's speed
        (400, 450, 500, 128, 9, prefill_ms(128, 3.0), decode_ms(128, 9, 3.0), "error"),
    )
    s = in_run_speed(r, PROFILE)
    assert s["n"] == 2
    assert s["q50"] == pytest.approx(1.15)
    assert s["q25"] == pytest.approx(1.125) and s["q75"] == pytest.approx(1.175)


def test_a_prefill_alone_counts_though_the_decode_overlaps():
    r = rows(
        (0, 50, 300, 512, 9, prefill_ms(512, 1.0), decode_ms(512, 9, 5.0), "ok"),
        (100, 150, 200, 64, 1, prefill_ms(64, 5.0), None, "ok"),  # arrives during the first one's decode
    )
    s = in_run_speed(r, PROFILE)
    assert s["n"] == 1 and s["q50"] == pytest.approx(1.0)


def test_no_timings_no_samples():
    r = rows((0, 50, 100, 512, 9, None, None, "ok"))
    assert in_run_speed(r, PROFILE) == {"n": 0, "q25": None, "q50": None, "q75": None}


@pytest.mark.parametrize("in_run, before, after, kept", [
    ({"n": 40, "q25": 0.96, "q50": 1.0, "q75": 1.05}, -0.18, 0.09, True),   # the fitted speed throughout; the
                                                                            # edge checks caught passing phases
    ({"n": 40, "q25": 0.92, "q50": 0.98, "q75": 1.18}, 0.0, 0.02, False),   # a slow phase in the run's last third
    ({"n": 40, "q25": 0.85, "q50": 0.89, "q75": 0.92}, 0.0, 0.0, False),    # 11 % faster than fitted all along
    ({"n": 40, "q25": 0.86, "q50": 1.04, "q75": 1.14}, 0.0, 0.0, True),     # noisy, but centred and within the spread
    ({"n": 3, "q25": 0.5, "q50": 0.6, "q75": 0.7}, 0.03, -0.04, True),      # past the knee: too few alone, the edges
    ({"n": 3, "q25": 1.0, "q50": 1.0, "q75": 1.0}, 0.03, -0.08, False),     # decide: one 8 % off
    ({"n": 0, "q25": None, "q50": None, "q75": None}, 0.0, 0.0, True),      # no server timings: the edges decide
])
def test_kept_speed(in_run, before, after, kept):
    assert kept_speed(in_run, before, after) is kept
