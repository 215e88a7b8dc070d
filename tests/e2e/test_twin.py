"""The twin against llama-server (docs/twin.md): fit it, predict the mixed workload at 3 rates (0.2 and 0.6
of the predicted capacity, and 2x past it), measure the same plans, compare. ~5 min on the 2-core machine
(up to ~12 when the host's load makes runs be tried again).

test_twin_predicts_llama_server checks what must hold whatever the machine's load: the fit describes
its own probes, every rate is predicted and measured (one row per request, all ok), and the prediction
and the measurement agree on which rates keep up at light load and far past the knee.
test_issue_targets asserts the targets (p50 TTFT and TPOT within 10 % below the knee, p99 within 20 %,
capacity within 15 %) on runs during which the server kept the speed it was fitted at (twin_validation.py:
the server's own timings of the run's requests that had it to themselves; past the knee, speed checks at
the run's edges; its compute thread's run-queue wait); where the fit or every try of a rate was disturbed,
the host changed the server under the test and it skips, naming the figures. It is still a KNOWN GAP
(xfail, not strict): the capacity met its target in all quiet validations but one (-1.6 to +12.8 %; +15.3 %
with the server 15-20 % slower than fitted), the latency targets in six of the eight runs judged admissible
(the one validation admissible at every rate passed), but such runs are one try in three on this VM and the
other two missed light-load TPOT p50 (+16 %) and the light-load p99s (-24 %, -20 %) (docs/twin.md). The
figures are printed either way.
"""
from __future__ import annotations

import pytest

from tests.e2e.conftest import FIGURES
from tests.e2e.twin_validation import (IN_RUN_SPREAD, MAX_WAITED, METRICS, SPEED_TOLERANCE, table, tries_text,
                                       validate)


@pytest.fixture(scope="module")
def validation(llama, tmp_path_factory):
    v = validate(llama.url, llama.proc.pid, tmp_path_factory.mktemp("twin"))
    print("\n" + table(v))
    for x in v["points"]:
        for m in METRICS:
            for q in ("p50", "p99"):
                FIGURES[f"twin {x['rate_per_s']:g}/s {m} {q} predicted/measured ms"] = (
                    f"{x[f'{m}_{q}']['predicted_ms']:.1f}/{x[f'{m}_{q}']['measured_ms']:.1f} "
                    f"({x[f'{m}_{q}']['error_rel']:+.0%})")
    if v["capacity"]:
        FIGURES["twin capacity predicted/measured /s"] = (f"{v['capacity']['predicted_per_s']:.2f}/"
                                                         f"{v['capacity']['measured_per_s']:.2f}")
    FIGURES["twin server speed per try (slowdown before/after, waited, in-run), per rate"] = " | ".join(
        f"{x['rate_per_s']:g}/s {tries_text(x)}" for x in v["points"])
    return v


def test_twin_predicts_llama_server(validation):
    v = validation
    assert v["fit"]["form"] == "compute"   # llama.cpp on a CPU: a one-token step is several times cheaper
    assert v["fit"]["rms_rel"] < 0.2, v["fit"]
    pts = v["points"]
    assert len(pts) == 3
    # Light load and far past the knee: predicted and measured agree. The middle rate (0.6 of the predicted
    # capacity) keeps up on a server that keeps its speed; one that a busy host slowed by 40 % under the test
    # is past its knee there, so either side of it is right here (test_issue_targets judges it).
    for x in (pts[0], pts[-1]):
        assert x["keeps_up"]["predicted"] == x["keeps_up"]["measured"], x
    assert pts[0]["keeps_up"]["measured"] and not pts[-1]["keeps_up"]["measured"]
    assert v["capacity"] is not None


@pytest.mark.xfail(strict=False, reason="known gap (docs/twin.md): a quiet 2-core VM runs the server in +-10-20 % "
                                        "speed phases, so a rate often has no try at the fitted speed, and light-load "
                                        "TPOT p50 follows the decode speed alone, which moves apart from prefill's")
def test_issue_targets(validation):
    moved = [f"{x['rate_per_s']:g}/s: {tries_text(x)}" for x in validation["points"] if not x["admissible"]]
    if validation["fit_waited"] > MAX_WAITED:
        moved.insert(0, f"the fit: waited {validation['fit_waited']:.0%}")
    if moved:
        pytest.skip(f"the server's speed moved under the fit or under every try of a rate (in-run median and "
                    f"edge slowdown limit {SPEED_TOLERANCE:.0%}, in-run quartiles {IN_RUN_SPREAD:.0%}, waited limit "
                    f"{MAX_WAITED:.0%}): " + " | ".join(moved))
    errors = []
    for x in validation["points"]:
        below = x["keeps_up"]["measured"]
        for m in ("ttft", "tpot"):
            for q, limit in (("p50", 0.10), ("p99", 0.20)):
                e = x[f"{m}_{q}"]["error_rel"]
                if below and abs(e) > limit:
                    errors.append(f"{x['rate_per_s']:g}/s {m} {q}: {e:+.0%} (limit {limit:.0%})")
    cap = validation["capacity"]
    if abs(cap["error_rel"]) > 0.15:
        errors.append(f"capacity {cap['error_rel']:+.0%} (limit 15%)")
    assert not errors, errors
