"""End to end against a real vLLM (CPU build, tiny random Llama): the OpenAI Responses (`api = "responses"`,
POST /v1/responses) and Anthropic Messages (`api = "messages"`, POST /v1/messages) families, each a short
Poisson workload through the CLI; every row ok, and the counts checked against vLLM's own counters over the
run (`vllm:generation_tokens_total`, `vllm:prompt_tokens_total` from the scraped /metrics): loadgen's output
and prompt tokens are what vLLM says it generated and read, request by request summed; and every prompt is
exactly its planned length (the chat template's count plus the endpoint's own extra, probed before the run:
vLLM 0.32's /v1/responses reads one token more than its chat completions for the same messages).

A server of its own for the module (tests/e2e/vllm_server.py; VLLM_URL=http://... reuses a running one);
skipped when neither VLLM_URL nor VLLM_PYTHON is set (`make e2e` sets VLLM_PYTHON). ~40 s with a running
server.
"""
from __future__ import annotations


import polars as pl
import pytest

from loadgen import metrics
from tests.e2e.conftest import FIGURES
from tests.e2e.test_vllm import run, workload
from tests.e2e.vllm_server import serve
from tests.integration.conftest import counter_delta

N, OUT = 12, 16


@pytest.fixture(scope="module")
def vllm(tmp_path_factory):
    yield from serve(tmp_path_factory, "vllm-events")


@pytest.mark.parametrize("api", ["responses", "messages"])
def test_event_stream_api_counts_equal_vllms(vllm, tmp_path, api):
    wl = workload(tmp_path, api, api, """
        [arrivals]
        process = "poisson"
        rate = "4/s"
        [prompt]
        tokens = { dist = "uniform", min = 32, max = 256 }
        [output]
        tokens = 16
        """)
    out = tmp_path / "run"
    r, _ = run(vllm, wl, out, "--requests", str(N), "--no-calibrate", "--scrape-metrics", "--scrape-interval",
               "500ms")
    df = metrics.latency_columns(r.requests, suffix="_ms")
    assert df.height == N and df["request_id"].n_unique() == N
    assert df["outcome"].to_list() == ["ok"] * N, df.filter(pl.col("outcome") != "ok")[["error_kind", "error_detail"]]
    assert (df["output_tokens"] == OUT).all() and (df["n_chunks"] > 0).all()
    assert (df["ttft_ms"] > 0).all() and (df["first_answer_ns"] == df["first_token_ns"]).all()
    assert r.manifest["target"]["api"] == api and r.manifest["target"]["server"]["kind"] == "vllm"
    sm = pl.read_parquet(out / "server_metrics.parquet")
    assert counter_delta(sm, "vllm:request_success_total") == N      # the scrape window holds the run's requests
    assert counter_delta(sm, "vllm:generation_tokens_total") == df["output_tokens"].sum() == N * OUT
    assert counter_delta(sm, "vllm:prompt_tokens_total") == df["prompt_tokens"].sum()
    # planned lengths are exact: the chat template's count (vLLM's /tokenize with messages) plus what the
    # endpoint adds, probed once: /v1/messages nothing, vLLM 0.32's /v1/responses one token (a second BOS)
    tok = r.manifest["workload"]["tokenizer"]
    assert tok["shape"] == "vllm" and tok["endpoint_offset"] == {"responses": 1, "messages": 0}[api], tok
    assert (df["prompt_tokens"] == df["planned_prompt_tokens"]).all(), df[["planned_prompt_tokens", "prompt_tokens"]]
    lengths = r.manifest["workload"]["prompt_lengths"]
    assert lengths["exact"] and lengths["usage"] == {"compared": N, "equal": N, "max_abs_error": 0}, lengths
    FIGURES[f"vllm /v1/{api}: TTFT p50 ms, rows ok"] = (round(float(df["ttft_ms"].median()), 1), N)
