"""End to end against vLLM started with `--enable-auto-tool-choice --tool-call-parser hermes` (its own server
for the module, after the others: one vLLM at a time): a tool_choice "required" workload and a
response_format one. vLLM decodes the reply by the schema, so even its random weights answer valid JSON:
every ok response_format reply must be judged valid. Under tool_choice "required" vLLM 0.32 streams the
call's name as one piece (with id and type, content null), then argument pieces that the random weights
fill with text (seen: `"+decode Observ...` cut at max_tokens): those streams are timed like content (first
token, first answer, last token, chunks) and judged as calls, the count held to the rows' verdicts.
Skipped without VLLM_PYTHON / VLLM_MODEL (tests/e2e/build_vllm.sh; `make e2e` sets them).
"""
from __future__ import annotations

import os
import textwrap

import orjson
import polars as pl
import pytest

from loadgen.results.folder import read_run
from tests.e2e.conftest import FIGURES
from tests.e2e.test_vllm import Running, fresh_seed, report
from tests.e2e.vllm_server import MODEL_NAME, VllmServer
from tests.integration.conftest import loadgen

N = 8
# bounded values only (enum, boolean): a random-weight model cannot run a string or a number on to max_tokens
PARAMS = {"type": "object", "properties": {"unit": {"type": "string", "enum": ["c", "f"]},
                                           "precise": {"type": "boolean"}},
          "required": ["unit", "precise"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The weather.",
                                           "parameters": PARAMS}},
         {"type": "function", "function": {"name": "get_time", "description": "The time.", "parameters": PARAMS}}]


@pytest.fixture(scope="module")
def vllm(tmp_path_factory):
    if os.environ.get("VLLM_TOOLS_URL"):
        yield Running(os.environ["VLLM_TOOLS_URL"].rstrip("/"))
        return
    if not os.environ.get("VLLM_PYTHON"):
        pytest.skip("VLLM_PYTHON is not set (tests/e2e/build_vllm.sh; `make e2e` sets it)")
    srv = VllmServer(tmp_path_factory.mktemp("vllm-tools") / "vllm.log",
                     extra=("--enable-auto-tool-choice", "--tool-call-parser", "hermes"))
    srv.start()
    FIGURES["vllm --enable-auto-tool-choice: start to healthy, s"] = round(srv.ready_s or 0, 1)
    yield srv
    srv.stop()


def run(vllm, tmp_path, name: str, request: str):
    (tmp_path / "tools.json").write_text(orjson.dumps(TOOLS).decode())
    (tmp_path / "schema.json").write_text(orjson.dumps(PARAMS).decode())
    wl = tmp_path / f"{name}.toml"
    wl.write_text(textwrap.dedent(f"""
        model = "{MODEL_NAME}"
        api = "chat"
        [arrivals]
        rate = "2/s"
        [run]
        requests = {N}
        drain_timeout = "120s"
        max_send_lag_p99 = "10s"
        max_lag_share = 1
        max_rate_deviation = 10
        max_cv_deviation = 100
        [prompt]
        tokens = 48
        [output]
        tokens = 96
        [request]
        """) + request)
    out = tmp_path / name
    p = loadgen("run", str(wl), "--url", vllm.url, "--out", str(out), "--quiet", "--no-calibrate",
                "--seed", fresh_seed(), timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    r = read_run(out)
    rows = r.requests
    assert rows.height == N and (rows["outcome"] == "ok").all(), rows.filter(pl.col("outcome") != "ok")[
        ["error_kind", "error_detail"]]
    # the tools are in vLLM's count of the prompt too (/tokenize is sent them): lengths stay exact
    lengths = r.manifest["workload"]["prompt_lengths"]
    assert lengths["exact"] and (rows["prompt_tokens"] == rows["planned_prompt_tokens"]).all(), (
        lengths, rows[["planned_prompt_tokens", "prompt_tokens"]])
    return out, rows


def test_required_tool_calls_are_streamed_timed_and_valid(vllm, tmp_path):
    out, rows = run(vllm, tmp_path, "tools", 'tools = "tools.json"\ntool_choice = "required"\n')
    for col in ("first_token_ns", "first_answer_ns", "last_token_ns"):
        assert rows[col].is_not_null().all(), col
    assert (rows["first_answer_ns"] == rows["first_token_ns"]).all() and (rows["n_chunks"] >= 2).all()
    assert (rows["tool_calls"] >= 1).all(), rows["tool_calls"]
    s = report(out)
    rep = s["replies"]
    FIGURES["vllm tool_choice required: valid calls / ok"] = f"{rep['calls']['valid']}/{N}"
    FIGURES["vllm tool_choice required: problems"] = rep["problems"]
    # every reply judged as calls; the random weights may fill the arguments with whitespace up to
    # max_tokens (cut: not JSON), so the count is held to the rows' verdicts, not to N
    assert rep["calls"]["judged"] == N and rep["calls"]["tool_calls"] == int(rows["tool_calls"].sum()), rep
    assert rep["calls"]["valid"] == int(rows["reply_valid"].sum()), rep
    assert rep["calls"]["valid"] + sum(rep["problems"].values()) == N, rep
    assert set(rep["problems"]) <= {"arguments_not_json", "arguments_schema", "undeclared"}, rep["problems"]
    assert s["latency_ms"]["itl"]["p50"] is not None and s["latency_ms"]["ttfa"]["p50"] is not None


def test_response_format_replies_are_valid_json(vllm, tmp_path):
    out, rows = run(vllm, tmp_path, "json", 'response_format = "schema.json"\n')
    rep = report(out)["replies"]
    FIGURES["vllm response_format: valid JSON / ok"] = f"{rep['json']['valid']}/{N}"
    assert rows["tool_calls"].is_null().all()
    assert rep["json"]["judged"] == N and rep["json"]["valid"] == N and rep["valid"] == N, (
        rep, rows["reply_problem"].to_list())
