"""The twin validation's in-run speed (tests/e2e/twin_validation.py): the server's own timings of the requests
that had it to themselves, over the fitted profile's (reported beside the coverage); and the coverage's
binomial bound."""
from __future__ import annotations

import math

import polars as pl
import pytest

from loadgen.sim.profiles import load_profile
from tests.e2e.twin_validation import in_run_speed, min_inside, model_prefill_s

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


@pytest.mark.parametrize("cells, level, alpha, expected", [
    (10, 0.8, 0.001, 4),    # P(Bin(10, .8) <= 3) = 0.00086, <= 4: 0.0064
    (39, 0.8, 0.001, 23),
    (20, 0.5, 0.05, 6),     # the usual sign-test table: P(Bin(20, .5) <= 5) = 0.0207, <= 6: 0.0577
])
def test_min_inside_is_the_binomial_lower_bound(cells, level, alpha, expected):
    k = min_inside(cells, level, alpha)
    assert k == expected
    below = sum(math.comb(cells, j) * level ** j * (1 - level) ** (cells - j) for j in range(k))
    more = below + math.comb(cells, k) * level ** k * (1 - level) ** (cells - k)
    assert below <= alpha < more
