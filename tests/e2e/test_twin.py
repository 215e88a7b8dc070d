"""The twin against llama-server (docs/twin.md): fit it, predict the mixed workload with intervals at 0.2
and 0.6 of the predicted capacity and 2x past it, measure the same plans REPEATS times each, and count the
measured figures inside their intervals (twin_validation.py). ~8 min on the 2-core machine.

test_twin_predicts_llama_server checks what must hold whatever the host: the fit describes its own probes,
and prediction and measurement agree on which rates keep up at light load and far past the knee.
test_intervals_cover_the_measured_figures is the twin's accuracy: at least the binomial bound of the cells
inside their intervals (twin_validation.min_inside). No run is judged inadmissible and none is tried again.
Against llama-server it is a KNOWN GAP (xfail, not strict; docs/twin.md, "Batched reads, and what is left"
and "The model at a workload's shapes, and the recheck"): the runs' errors had one sign (9, 20 and 1 of 26 in
three quiet validations) until the fit probed a middle decode context (llama.cpp's decode step is concave in
the context) and read a decode probe's mean gap rather than a trimmed mean: 25 and 21 of 26 since, errors on
both sides; but 2 of 26 in a fresh clone's make test, where this session server (after the other e2e tests)
ran 6-11 % slower in every run than during its fit. Strict once more validations say otherwise.
The vLLM test (test_vllm_twin.py) is the same kind.
"""
from __future__ import annotations

import pytest

from tests.e2e.conftest import FIGURES
from tests.e2e.twin_validation import FIT_WAITED_MAX, HostHeld, table, validate


@pytest.fixture(scope="module")
def validation(llama, tmp_path_factory):
    try:
        v = validate(llama.url, llama.proc.pid, tmp_path_factory.mktemp("twin"))
    except HostHeld as e:
        pytest.skip(str(e))
    print("\n" + table(v))
    FIGURES["twin coverage (cells inside their 80 % intervals / cells, bound)"] = \
        f"{v['inside']}/{v['cells']} (>= {v['min_inside']})"
    widths = sorted(c["width_rel"] for r in v["runs"] for c in r["cells"])
    errors = sorted(abs(c["error_rel"]) for r in v["runs"] for c in r["cells"])
    FIGURES["twin interval width / point, median and max"] = f"{widths[len(widths) // 2]:.0%}, {widths[-1]:.0%}"
    FIGURES["twin point error |predicted - measured| / measured, median and max"] = \
        f"{errors[len(errors) // 2]:.0%}, {errors[-1]:.0%}"
    return v


def test_twin_predicts_llama_server(validation):
    v = validation
    assert v["interval_rounds"] >= 2
    for r in v["runs"]:
        if r["fraction"] in (min(v["fractions"]), max(v["fractions"])):   # light load, far past the knee
            assert r["keeps_up"]["predicted"] == r["keeps_up"]["measured"], r
    for r in v["runs"]:
        assert all(c["low"] <= c["predicted"] <= c["high"] for c in r["cells"]), r
    # llama.cpp on a CPU: a one-token step is several times cheaper (multi_token); its mixed steps are described
    # within a few % by both CPU forms (max or sum of reads and compute: the reads are small beside a prompt).
    # Judged where the host let the server keep its speed during the fit: its compute thread waited for a CPU
    # at most FIT_WAITED_MAX of its runnable time (docs/twin.md: compute or sum at 1.5, 12 and 25 %; beside
    # two CPU burners, 34 %, the probes' steps were the host's and the fit chose roofline)
    if v["fit_waited"] > FIT_WAITED_MAX:
        pytest.skip(f"the fit's form is not judged: the server waited {v['fit_waited']:.0%} of its runnable time "
                    f"during the fit (form {v['fit']['form']}, rms {v['fit']['rms_rel']:.1%})")
    assert v["fit"]["form"] in ("compute", "sum"), v["fit"]
    assert v["fit"]["rms_rel"] < 0.2, v["fit"]


@pytest.mark.xfail(strict=False, reason="known gap (docs/twin.md, The model at a workload's shapes): 25 and 21 of "
                                        "26 in two quiet validations since the middle decode context, 2 in a fresh "
                                        "clone's make test (the session server 6-11 % slower than during its fit)")
def test_intervals_cover_the_measured_figures(validation):
    v = validation
    assert v["inside"] >= v["min_inside"], table(v)
