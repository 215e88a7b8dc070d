"""The idle-server fit (calibrate.py)."""
import pytest

from loadgen.probe.calibrate import fit, probe_lengths


def probes(f, lengths, reps=3, itl=lambda L: 10.0):
    return [{"prompt_tokens": L, "prefill_ms": f(L) + (0.5 if r == 0 else 0.0), "itl_ms": itl(L),
             "server_prefill_ms": None, "server_queue_ms": None} for L in lengths for r in range(reps)]


def test_quadratic_prefill_is_recovered_from_medians():
    # one slow probe per length (+0.5 ms) is ignored by the per-length median
    cal = fit(probes(lambda L: 5 + 0.02 * L + 1e-5 * L * L, [64, 300, 600, 900, 1200],
                     itl=lambda L: 8 + 0.001 * L))
    assert cal["prefill_ms"]["coef"] == pytest.approx([5, 0.02, 1e-5], rel=1e-6, abs=1e-9)
    assert cal["itl_ms"]["coef"] == pytest.approx([8, 0.001])
    assert cal["server_timings"] is False


def test_a_curve_bending_down_falls_back_to_a_line():
    cal = fit(probes(lambda L: 5 + 0.05 * L - 2e-5 * L * L, [100, 500, 900]))
    assert len(cal["prefill_ms"]["coef"]) == 2 and cal["prefill_ms"]["coef"][1] > 0


def test_one_length_gives_a_constant():
    assert fit(probes(lambda L: 12.0, [256]))["prefill_ms"]["coef"] == pytest.approx([12.0])


def test_nothing_usable_is_an_error():
    with pytest.raises(ValueError, match="no calibration probe"):
        fit([None, None])


@pytest.mark.parametrize("planned, lengths", [
    (list(range(64, 1025)), [64, 304, 544, 784, 1024]),  # min, quartiles, max of the planned lengths
    ([128] * 10, [128]),                                  # one length: that length
    ([100, 100, 100, 900], [100, 900]),                   # repeated quantiles collapse
    ([], []),                                             # nothing planned: no probes
])
def test_probe_lengths_span_the_workload(planned, lengths):
    assert probe_lengths(planned) == lengths
