"""End to end: agentic sessions against vLLM started with `--enable-auto-tool-choice --tool-call-parser hermes`
(its own server for the module: one vLLM at a time). Under tool_choice "required" every reply is a call, so
each session of 3 requests is a user turn and 2 tool rounds: the second and third requests send back the
assistant's `tool_calls` as vLLM streamed them and one `role: tool` result per call. vLLM must accept
them (every row ok), its prompt count must equal the plan (the server tokenizer counted the same message
lists), grow by the reply and the drawn tool results every round, and its own prompt-token counter over the
run must equal the rows' sum. Skipped without VLLM_PYTHON / VLLM_MODEL (tests/e2e/build_vllm.sh; `make e2e`
sets them).
"""
from __future__ import annotations

import os
import textwrap

import orjson
import polars as pl
import pytest

from loadgen.results.folder import read_run
from tests.e2e.conftest import FIGURES
from tests.e2e.test_vllm import Running, counter_delta, fresh_seed
from tests.e2e.test_vllm_tools import TOOLS
from tests.e2e.vllm_server import MODEL_NAME, VllmServer
from tests.integration.conftest import loadgen

SESSIONS, TURNS, ROUNDS = 3, 3, 2


@pytest.fixture(scope="module")
def vllm(tmp_path_factory):
    if os.environ.get("VLLM_TOOLS_URL"):
        yield Running(os.environ["VLLM_TOOLS_URL"].rstrip("/"))
        return
    if not os.environ.get("VLLM_PYTHON"):
        pytest.skip("VLLM_PYTHON is not set (tests/e2e/build_vllm.sh; `make e2e` sets it)")
    srv = VllmServer(tmp_path_factory.mktemp("vllm-agentic") / "vllm.log",
                     extra=("--enable-auto-tool-choice", "--tool-call-parser", "hermes"))
    srv.start()
    yield srv
    srv.stop()


def test_tool_rounds_are_accepted_and_counted_by_vllm(vllm, tmp_path):
    (tmp_path / "tools.json").write_text(orjson.dumps(TOOLS).decode())
    wl = tmp_path / "agentic.toml"
    wl.write_text(textwrap.dedent(f"""
        model = "{MODEL_NAME}"
        api = "chat"
        [arrivals]
        rate = "1/s"
        [run]
        requests = {SESSIONS}
        drain_timeout = "180s"
        max_send_lag_p99 = "10s"
        max_lag_share = 1
        max_rate_deviation = 10
        max_cv_deviation = 100
        [prompt]
        tokens = 48
        [output]
        tokens = 64
        [request]
        tools = "tools.json"
        tool_choice = "required"
        [session]
        turns = {TURNS}
        think_ms = 100
        max_tool_rounds = {ROUNDS}
        tool_latency_ms = {{ dist = "uniform", min = 50, max = 300 }}
        tool_result_tokens = {{ dist = "uniform", min = 16, max = 64 }}
        """))
    out = tmp_path / "run"
    p = loadgen("run", str(wl), "--url", vllm.url, "--out", str(out), "--quiet", "--no-calibrate",
                "--seed", fresh_seed(), "--scrape-metrics", "--scrape-interval", "500ms", timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    counted = counter_delta(pl.read_parquet(out / "server_metrics.parquet"), "vllm:prompt_tokens_total")
    r = read_run(out)
    rows = r.requests.sort("idx")
    assert rows.height == SESSIONS * TURNS
    assert (rows["outcome"] == "ok").all(), rows.filter(pl.col("outcome") != "ok")[["error_kind", "error_detail"]]
    # required: every reply called, so each session is round 0, 1, 2 (and its calls went back)
    assert rows["tool_round"].to_list() == [0, 1, 2] * SESSIONS
    assert (rows["tool_calls"] >= 1).all()
    assert rows.filter(pl.col("tool_round") > 0)["tool_latency_ns"].is_not_null().all()
    # exact prompts: vLLM counted what the plan said, history with the calls and the tool results included
    assert r.manifest["workload"]["prompt_lengths"]["exact"]
    assert (rows["prompt_tokens"] == rows["planned_prompt_tokens"]).all()
    grow = rows.with_columns(prev=pl.col("prompt_tokens").shift(1).over("session")).filter(pl.col("turn") > 0)
    assert (grow["prompt_tokens"] > grow["prev"]).all()
    # vLLM's own counter over the run (the scrape window holds the run's requests) is the rows' sum
    assert counted == int(rows["prompt_tokens"].sum())
    FIGURES["vllm agentic: prompt tokens by round (session 0)"] = rows.filter(pl.col("session") == 0)[
        "prompt_tokens"].to_list()
    FIGURES["vllm agentic: vLLM prompt_tokens_total over the run / rows' sum"] = (
        f"{counted:.0f} / {int(rows['prompt_tokens'].sum())}")
