"""End to end against vLLM started with `--enable-auto-tool-choice --tool-call-parser hermes` (its own server for
the module, after the others: one vLLM at a time): a tool_choice "required" workload and a response_format
one. vLLM decodes the reply by the schema, so even its random weights answer valid JSON when they stop: every
ok response_format reply that ended before max_tokens must be judged valid (the schema does not bound
whitespace, which may run on to max_tokens: such a reply is cut, and judged not JSON). Under tool_choice
"required" vLLM 0.32 streams the call's name as one piece (with id and type, content null), then argument
pieces that the random weights fill with text (seen: `"+decode Observ...` cut at max_tokens): those streams
are timed like content (first token, first answer, last token, chunks) and judged as calls, the count held to
the rows' verdicts. Agentic sessions on the same server: under tool_choice "required" every reply is a call,
so each session of 3 requests is a user turn and 2 tool rounds: the second and third requests send back the
assistant's `tool_calls` as vLLM streamed them and one `role: tool` result per call. vLLM must accept them
(every row ok), its prompt count must equal the plan (the server tokenizer counted the same message lists),
grow by the reply and the drawn tool results every round, and its own prompt-token counter over the run must
equal the rows' sum.
Skipped without VLLM_PYTHON / VLLM_MODEL (tests/e2e/build_vllm.sh; `make e2e` sets them).
"""
from __future__ import annotations

import textwrap

import orjson
import polars as pl
import pytest

from loadgen.results.folder import read_run
from tests.e2e.conftest import FIGURES
from tests.e2e.test_vllm import fresh_seed, report
from tests.e2e.vllm_server import MODEL_NAME, serve
from tests.integration.conftest import counter_delta, host_starved, loadgen

N = 8
SESSIONS, TURNS, ROUNDS = 3, 3, 2   # agentic: sessions of a user turn and 2 tool rounds
TOOL_FLAGS = ("--enable-auto-tool-choice", "--tool-call-parser", "hermes")
# bounded values only (enum, boolean): a random-weight model cannot run a string or a number on to max_tokens
PARAMS = {"type": "object", "properties": {"unit": {"type": "string", "enum": ["c", "f"]},
                                           "precise": {"type": "boolean"}},
          "required": ["unit", "precise"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The weather.",
                                           "parameters": PARAMS}},
         {"type": "function", "function": {"name": "get_time", "description": "The time.", "parameters": PARAMS}}]


@pytest.fixture(scope="module")
def vllm(tmp_path_factory):
    yield from serve(tmp_path_factory, "vllm-tools", extra=TOOL_FLAGS, url_env="VLLM_TOOLS_URL",
                     figure="vllm --enable-auto-tool-choice: start to healthy, s")


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
    assert s["latency_ms"]["ttfa"]["p50"] is not None
    # ITL: a row whose tokens all came in one read has no gap: the check needs a client that read on time
    # (loadgen's self-check says whether the host starved it) and a vLLM that streamed the arguments in pieces
    tok = pl.read_parquet(out / "tokens.parquet").filter(pl.col("n_tokens") > 0)
    reads = tok.group_by("request_id").agg(pl.col("t_ns").n_unique())["t_ns"]
    manifest = orjson.loads((out / "manifest.json").read_bytes())
    if (reads <= 1).all() and host_starved(manifest):
        pytest.skip(f"every row's tokens came in one read while loadgen's self-check says "
                    f"{manifest['generator']['cause']!r}: no ITL gap")
    assert s["latency_ms"]["itl"]["p50"] is not None, (manifest["generator"].get("cause"), reads)


def test_response_format_replies_are_valid_json(vllm, tmp_path):
    out, rows = run(vllm, tmp_path, "json", 'response_format = "schema.json"\n')
    rep = report(out)["replies"]
    FIGURES["vllm response_format: valid JSON / ok"] = f"{rep['json']['valid']}/{N}"
    assert rows["tool_calls"].is_null().all()
    # The schema bounds the values (enum, boolean), not the whitespace between them: the random weights may
    # emit newlines until max_tokens (a fresh clone's run: 2 of 8 cut at "line 15 column 28"). So every reply
    # that ended before max_tokens is valid JSON, and a cut one is judged not JSON, never valid by luck.
    assert rep["json"]["judged"] == N and rep["json"]["valid"] == int(rows["reply_valid"].sum()), rep
    cut = rows["output_tokens"] >= rows["max_tokens"]
    for r in rows.select("output_tokens", "max_tokens", "reply_valid", "reply_problem").to_dicts():
        if r["output_tokens"] < r["max_tokens"]:
            assert r["reply_valid"], (r, rep)
        else:
            assert r["reply_valid"] or (r["reply_problem"] or "").startswith("not_json"), (r, rep)
    assert rep["json"]["valid"] >= N - int(cut.sum()) and rep["json"]["valid"] > 0, (rep, cut.to_list())
    FIGURES["vllm response_format: replies cut at max_tokens"] = f"{int(cut.sum())}/{N}"


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
