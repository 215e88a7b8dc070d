"""End to end against a real vLLM (CPU build, the tiny random Llama served as an embedding model:
`--runner pooling --convert embed`, tests/e2e/vllm_server.py POOLING_FLAGS): `api = "embeddings"` (POST
/v1/embeddings) and `api = "rerank"` (POST /v1/rerank, which vLLM 0.32 answers for an embedding model by
embedding similarity: the endpoint's shape and counts, not a cross-encoder's scores), each a short Poisson
workload through the CLI. Every row ok, with no token (no TTFT), an e2e; the prompt tokens loadgen records are
what vLLM says it read over the run (`vllm:prompt_tokens_total` from the scraped /metrics), and embeddings'
prompts are exactly their planned lengths (counted by vLLM's /tokenize as a raw prompt, BOS included). A
rerank's planned prompt counts the query once per document; vLLM's embedding-model rerank reads it once in
all, so rerank rows are compared with vLLM's counter only (and left out of the prompt-length verdict).

A server of its own for the module; skipped when neither VLLM_URL (a running pooling server) nor VLLM_PYTHON
is set (`make e2e` sets VLLM_PYTHON). ~60 s with the server's start.
"""
from __future__ import annotations

import textwrap

import polars as pl
import pytest

from tests.e2e.conftest import FIGURES
from tests.e2e.test_vllm import report, run
from tests.e2e.vllm_server import MODEL_NAME, POOLING_FLAGS, serve
from tests.integration.conftest import counter_delta

N = 12
HEAD = f"""
    model = "{MODEL_NAME}"
    seed = 7
    [run]
    drain_timeout = "120s"
    # data checks on a shared 2-core machine (vLLM holds one core): the self-check's rules are unit-tested
    max_send_lag_p99 = "10s"
    max_lag_share = 1
    max_rate_deviation = 10
    max_cv_deviation = 100
    [arrivals]
    process = "poisson"
    rate = "4/s"
    [prompt]
    tokens = {{ dist = "uniform", min = 32, max = 256 }}
    """
RERANK = """
    [rerank]
    documents = { dist = "uniform", min = 2, max = 6 }
    document_tokens = { dist = "uniform", min = 16, max = 128 }
    """


@pytest.fixture(scope="module")
def vllm(tmp_path_factory):
    yield from serve(tmp_path_factory, "vllm-pooling", extra=POOLING_FLAGS)


@pytest.mark.parametrize("api", ["embeddings", "rerank"])
def test_pooling_api_counts_equal_vllms(vllm, tmp_path, api):
    wl = tmp_path / f"{api}.toml"
    wl.write_text(f'api = "{api}"\n' + textwrap.dedent(HEAD) + (textwrap.dedent(RERANK) if api == "rerank" else ""))
    out = tmp_path / "run"
    r, _ = run(vllm, str(wl), out, "--requests", str(N), "--scrape-metrics", "--scrape-interval", "500ms")
    df = r.requests
    assert df.height == N and df["request_id"].n_unique() == N
    assert df["outcome"].to_list() == ["ok"] * N, df.filter(pl.col("outcome") != "ok")[["error_kind", "error_detail"]]
    assert df["first_token_ns"].is_null().all() and (df["output_tokens"] == 0).all()
    assert (df["last_token_ns"] > df["intended_ns"]).all()
    assert r.manifest["target"]["api"] == api and r.manifest["target"]["server"]["kind"] == "vllm"
    sm = pl.read_parquet(out / "server_metrics.parquet")
    # what vLLM read over the run, request by request summed (no calibration probes: never calibrated)
    assert counter_delta(sm, "vllm:prompt_tokens_total") == df["prompt_tokens"].sum()
    assert counter_delta(sm, "vllm:generation_tokens_total") == 0
    lengths = r.manifest["workload"]["prompt_lengths"]
    if api == "embeddings":
        assert counter_delta(sm, "vllm:request_success_total") == N
        assert (df["prompt_tokens"] == df["planned_prompt_tokens"]).all(), df[["planned_prompt_tokens",
                                                                              "prompt_tokens"]]
        assert lengths["exact"] and lengths["usage"] == {"compared": N, "equal": N, "max_abs_error": 0}, lengths
    else:   # the query read once, not once per document: fewer than planned, left out of the verdict
        assert (df["prompt_tokens"] < df["planned_prompt_tokens"]).all()
        assert lengths["usage"]["compared"] == 0
    s = report(out)
    assert s["valid"] is True and s["requests"]["ok"] == N
    assert s["latency_ms"]["ttft"]["p50"] is None and s["latency_ms"]["e2e"]["p50"] > 0
    FIGURES[f"vllm /v1/{api}: e2e p50 ms, prompt tok/s, rows ok"] = (
        round(s["latency_ms"]["e2e"]["p50"], 1), round(s["throughput"]["prompt_tokens_per_s"], 1), N)
