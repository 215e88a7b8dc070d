"""End to end against vLLM with `--scheduling-policy priority`: a two-class [[mix]] whose classes send their
own `priority` and their own model name (two `--served-model-name` aliases of the one model, the way LoRA
adapters are named beside a base model: CPU vLLM builds here have no adapter files to load).

One server of its own for the module (after the other vLLM modules' have stopped: one vLLM at a time), two
seats (`--max-num-seqs 2`) and `--enable-per-request-metrics`, so that each response carries vLLM's own
`queue_time_ms`. Checked: every request accepted (200, ok) under its class's model; rows record class,
model and priority; the report breaks the run down per class and per model. The ordering is judged only on
vLLM's own queue times, and only when they show queueing (the premise: a burst into two seats queues).
"""
from __future__ import annotations


import numpy as np
import polars as pl
import pytest

from tests.e2e.conftest import FIGURES
from tests.e2e.test_vllm import check_rows, fresh_seed, report, run, workload
from tests.e2e.vllm_server import MODEL_NAME, serve

ALIAS = f"{MODEL_NAME}-b"
N = 24
OUT_TOKENS = 24
MIX = f"""
    [arrivals]
    process = "constant"
    rate = "inf"
    [[mix]]
    name = "interactive"
    weight = 0.5
    priority = 0
    prompt = 64
    output = {OUT_TOKENS}
    [[mix]]
    name = "batch"
    weight = 0.5
    priority = 5
    model = "{ALIAS}"
    prompt = 64
    output = {OUT_TOKENS}
"""


@pytest.fixture(scope="module")
def vllm(tmp_path_factory):
    yield from serve(tmp_path_factory, "vllm-priority", url_env=None,
                     extra=("--served-model-name", MODEL_NAME, ALIAS, "--scheduling-policy", "priority",
                            "--max-num-seqs", "2", "--enable-per-request-metrics"))


def test_two_priority_classes_against_vllm(vllm, tmp_path):
    run_, _ = run(vllm, workload(tmp_path, "mix", "completions", MIX), tmp_path / "run", "--no-calibrate",
                  "--requests", str(N), seed=fresh_seed())
    df = check_rows(run_, N, OUT_TOKENS)   # every request accepted and answered in full
    classes = {"interactive": (MODEL_NAME, 0), "batch": (ALIAS, 5)}
    for r in df.iter_rows(named=True):
        assert (r["model"], r["priority"]) == classes[r["class"]], r
    assert set(df["class"]) == set(classes)
    summary = report(tmp_path / "run")
    by_class, by_model = summary["breakdown"]["by_class"], summary["breakdown"]["by_model"]
    assert set(by_class) == set(classes) and set(by_model) == {MODEL_NAME, ALIAS}
    for c, (model, prio) in classes.items():
        g = by_class[c]
        assert g["requests"] == g["ok"] == df.filter(pl.col("class") == c).height
        assert g["priority"] == [prio] and g["model"] == [model]
        assert g["latency_ms"]["ttft"]["p99"] > 0 and g["latency_ms"]["e2e"]["p99"] > 0
        FIGURES[f"vllm priority: {c} (priority {prio}) ttft p50/p99 ms"] = (
            round(g["latency_ms"]["ttft"]["p50"], 1), round(g["latency_ms"]["ttft"]["p99"], 1))
    # vLLM's own queue times (per-request metrics): the premise, then the order they show
    q = {c: df.filter(pl.col("class") == c)["server_queue_ms"].to_numpy() for c in classes}
    assert all(np.isfinite(v).all() for v in q.values()), "vLLM sent no per-request queue_time_ms"
    FIGURES["vllm priority: server queue p50 ms interactive/batch"] = (
        round(float(np.median(q["interactive"])), 1), round(float(np.median(q["batch"])), 1))
    if np.median(q["batch"]) < 50:
        pytest.skip(f"vLLM queued too little to judge the order (batch queue p50 {np.median(q['batch']):.0f} ms)")
    assert np.median(q["interactive"]) < np.median(q["batch"])
