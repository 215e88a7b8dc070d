"""A negative decode_contention is explained, not clamped: the diagnosis says decode_ideal is overstated, and
the decomposition still adds up (decode = ideal + contention + stalls)."""
from loadgen.analysis.diagnose import NEGATIVE_SHARE, Facts, diagnose


def _facts(contention: float, ideal: float = 40.0) -> Facts:
    mean = {"queue": 1.0, "prefill": 10.0, "decode": ideal + contention, "decode_ideal": ideal,
            "decode_contention": contention, "decode_stalls": 0.0}
    return Facts(mean=mean, ttft_mean_ms=12.0, by_prompt=[], requests=50)


def test_a_negative_contention_is_explained():
    (finding,) = [f for f in diagnose(_facts(-2.1)) if f["rule"] == "ideal_overstated"]
    assert finding["finding"].startswith("decode_contention is negative (mean -2.1 ms, 5% of decode_ideal 40.0 ms)")
    assert "not clamped" in finding["finding"]
    assert finding["evidence"] == {"mean_decode_contention_ms": -2.1, "mean_decode_ideal_ms": 40.0,
                                   "mean_decode_ms": 37.9}
    assert "upper bound" in finding["remedy"]


def test_no_word_for_a_positive_contention_or_noise():
    for c in (3.0, 0.0, -0.99 * NEGATIVE_SHARE * 40.0):
        assert [f for f in diagnose(_facts(c)) if f["rule"] == "ideal_overstated"] == [], c
