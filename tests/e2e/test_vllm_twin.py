"""The twin against vLLM (CPU build), docs/twin.md: `loadgen fit` a vLLM started with SEATS seats, predict the
mixed workload with intervals and measure it (twin_validation.cover, as test_twin.py does for llama-server);
then **what if**: the same fit predicts `--set max_num_seqs=WHAT_IF_SEATS`, a setting it never saw, and a vLLM
started with that many seats is measured at the rates of that prediction. Both are judged by coverage (the
cells inside their intervals, at least the binomial bound), a known gap for now (xfail, not strict; docs/twin.md,
"Batched reads, and what is left": the fit describes the probes at rms ~2 %, mixed steps included, but a vLLM
instance runs up to ~10 % slower or faster per request than the model from one start or minute to the next, more
than the fit's rounds disagree).
~8 min on the 2-core machine, one vLLM at a time.

vLLM publishes max_model_len (/v1/models) but not its seats or its step budget: the fit is told both, as the
server was started. Prefix caching is off (`--no-enable-prefix-caching`): the workload's prompts are distinct,
but a cache hit would make a measured prefill shorter than any the fit probed.
"""
from __future__ import annotations

import pytest

from tests.e2e.conftest import FIGURES
from tests.e2e.twin_validation import HostHeld, cover, fit_twin, summary, table
from tests.e2e.waited import Waited
from tests.e2e.vllm_server import MODEL_NAME, VllmServer, serve

SEATS, WHAT_IF_SEATS, BUDGET_TOKENS = 8, 2, 2048
FLAGS = ("--max-num-batched-tokens", str(BUDGET_TOKENS), "--no-enable-prefix-caching")
WHAT_IF_FRACTIONS = (0.6, 2.0)
# 8 seats make 8 decode shapes a round (llama-server's 2 slots: 4): ~7 s a round on an idle host, 8 rounds in
# ~55 s; on a busy one a decode probe whose streams hardly overlapped is asked again longer (fit.py), and a
# 60-s budget once kept a single round (no interval)
FIT_BUDGET = "120s"


def _server(tmp_path_factory, name: str, seats: int):
    gen = serve(tmp_path_factory, name, url_env=None, extra=("--max-num-seqs", str(seats), *FLAGS))
    return gen, next(gen)


@pytest.fixture(scope="module")
def validations(tmp_path_factory):
    work = tmp_path_factory.mktemp("vllm-twin")
    gen, srv = _server(tmp_path_factory, "vllm-twin-8", SEATS)
    assert isinstance(srv, VllmServer) and srv.proc is not None
    try:
        waited = Waited(srv.proc.pid, group=True)
        try:
            twin = fit_twin(srv.url, waited, work, "--max-num-seqs", str(SEATS), "--max-batched-tokens",
                            str(BUDGET_TOKENS), "--budget", FIT_BUDGET)
        except HostHeld as e:
            pytest.skip(str(e))
        fitted = {**summary(twin), **cover(srv.url, waited, work / "fitted", twin, run_args=("--model", MODEL_NAME))}
    finally:
        gen.close()
    gen, srv = _server(tmp_path_factory, "vllm-twin-2", WHAT_IF_SEATS)
    assert isinstance(srv, VllmServer) and srv.proc is not None
    try:
        other = {**summary(twin), **cover(srv.url, Waited(srv.proc.pid, group=True), work / "what-if", twin,
                                          WHAT_IF_FRACTIONS, run_args=("--model", MODEL_NAME),
                                          sets={"max_num_seqs": WHAT_IF_SEATS})}
    finally:
        gen.close()
    for name, v in (("vllm", fitted), (f"vllm what-if max_num_seqs {SEATS} -> {WHAT_IF_SEATS}", other)):
        print(f"\n{name}\n" + table(v))
        FIGURES[f"twin {name} coverage (inside / cells, bound)"] = f"{v['inside']}/{v['cells']} (>= {v['min_inside']})"
    return fitted, other


def test_vllm_twin_fit_and_capacity(validations):
    fitted, other = validations
    assert fitted["fit"]["rms_rel"] < 0.25, fitted["fit"]
    # fewer seats, less capacity: the what-if predicts it, and the measurement past the knee shows it
    assert other["knee"]["capacity_per_s"] < fitted["knee"]["capacity_per_s"]
    for v in validations:
        for r in v["runs"]:
            if r["fraction"] == max(v["fractions"]):   # far past the knee: neither keeps up
                assert not r["keeps_up"]["measured"] and not r["keeps_up"]["predicted"], r


@pytest.mark.xfail(strict=False, reason="known gap (docs/twin.md, Batched reads, and what is left): probes described "
                                        "at rms ~2 %, but per request a vLLM ran 0-12 % slower than its model from "
                                        "one start or minute to the next (fitted 12, 11, 22 / 26, what-if 1, 10, "
                                        "13 / 14 in three validations)")
@pytest.mark.parametrize("which", ["fitted", "what-if"])
def test_vllm_intervals_cover_the_measured_figures(validations, which):
    v = validations[0 if which == "fitted" else 1]
    assert v["inside"] >= v["min_inside"], table(v)
