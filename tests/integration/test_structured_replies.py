"""Tools and response_format end to end: `loadgen run` against the simulator, which answers each request with
a declared tool call or JSON content of the schema and draws a share of them invalid (--invalid-json-share);
every row's verdict (reply_valid) equals the simulator's truth, and the summary's counts are the truth's."""
import orjson
import polars as pl

from loadgen.results.folder import read_run
from tests.integration.conftest import loadgen, report_json, workload

N = 40
SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}, "kind": {"enum": ["a", "b"]},
                                           "n": {"type": "integer", "minimum": 2}},
          "required": ["ok", "kind", "n"], "additionalProperties": False}


def run(tmp_path, request: str, max_tokens, sim_flags: str = ""):
    out = tmp_path / "run"
    (tmp_path / "schema.json").write_text(orjson.dumps(SCHEMA).decode())
    w = workload(tmp_path, api="chat", rate="20/s", requests=N, max_tokens=max_tokens, extra="[request]\n" + request)
    p = loadgen("run", w, "--out", str(out), "--quiet", "--no-calibrate",
                "--sim-args", f"--mode fixed --ttft 10ms --itl 1ms --invalid-json-share 0.3 {sim_flags}")
    assert p.returncode == 0, p.stderr
    r = read_run(out)
    truth = pl.read_parquet(out / "sim_truth.parquet").select("request_id", pl.col("reply_valid").alias("truth"))
    rows = r.requests.join(truth, on="request_id")
    assert rows.height == N and (rows["outcome"] == "ok").all()
    return out, rows


def test_tool_calls_are_counted_as_the_truth_says(tmp_path):
    out, rows = run(tmp_path, 'tools = { generate = 3, parameters = 5 }\ntool_choice = "required"\n', 96)
    assert (rows["reply_valid"] == rows["truth"]).all()
    n_valid = int(rows["truth"].sum())
    assert 0 < n_valid < N  # some drawn invalid: the count is a real check
    assert (rows["tool_calls"] == 1).all()
    # the call is timed like content: first answer, chunks and every timing column filled
    assert rows["first_answer_ns"].is_not_null().all() and (rows["n_chunks"] == 96).all()
    invalid = rows.filter(~pl.col("reply_valid"))
    kinds = set(invalid["reply_problem"].str.split(":").list.first())
    assert kinds <= {"undeclared", "arguments_not_json"} and kinds, kinds
    s = report_json(str(out))
    rep = s["replies"]
    assert rep["judged"] == N and rep["valid"] == n_valid and rep["calls"]["valid"] == n_valid
    assert rep["calls"]["judged"] == N and rep["json"]["judged"] == 0 and rep["calls"]["tool_calls"] == N
    assert sum(rep["problems"].values()) == N - n_valid
    assert s["latency_ms"]["ttfa"]["p50"] is not None and s["latency_ms"]["itl"]["p50"] is not None
    text = loadgen("report", str(out))
    assert f"tool calls {n_valid}/{N} valid" in text.stdout, text.stdout


def test_json_replies_are_counted_as_the_truth_says(tmp_path):
    # lengths from 4 to 24 tokens: the JSON text is 6 words, so the shortest replies are cut (invalid)
    out, rows = run(tmp_path, 'response_format = "schema.json"\n', '{ dist = "uniform", min = 4, max = 24 }',
                    "--reasoning-tokens 2")
    assert (rows["reply_valid"] == rows["truth"]).all()
    assert rows["tool_calls"].is_null().all()
    n_valid = int(rows["truth"].sum())
    cut = rows.filter(pl.col("output_tokens") - 2 < 6)
    assert cut.height and not cut["reply_valid"].any()   # too short to hold the JSON: the truth says invalid too
    assert 0 < n_valid < N
    rep = report_json(str(out))["replies"]
    not_json = int(rows["reply_problem"].str.starts_with("not_json").sum())
    assert rep["json"] == {"judged": N, "parsed": N - not_json, "valid": n_valid, "valid_share": n_valid / N}
    assert rep["calls"]["judged"] == 0 and rep["not_judged"] == 0


def test_a_run_without_structure_has_no_verdict(tmp_path):
    out = tmp_path / "plain"
    p = loadgen("run", workload(tmp_path, api="chat", requests=10), "--out", str(out), "--quiet", "--no-calibrate",
                "--sim-args", "--mode fixed --ttft 5ms --itl 1ms --invalid-json-share 0.5")
    assert p.returncode == 0, p.stderr
    rows = read_run(out).requests
    assert rows["reply_valid"].is_null().all() and rows["tool_calls"].is_null().all()
    assert pl.read_parquet(out / "sim_truth.parquet")["reply_valid"].is_null().all()
    assert report_json(str(out))["replies"] is None


def test_compare_names_a_different_structure_as_other_work(tmp_path):
    runs = []
    for name, request in (("plain", ""), ("json", "[request]\nresponse_format = { properties = 3 }\n")):
        (tmp_path / name).mkdir()
        out = tmp_path / name / "run"
        p = loadgen("run", workload(tmp_path / name, api="chat", requests=10, extra=request), "--out", str(out),
                    "--quiet", "--no-calibrate", "--sim-args", "--mode fixed --ttft 5ms --itl 1ms")
        assert p.returncode == 0, p.stderr
        runs.append(str(out))
    p = loadgen("compare", *runs)
    assert p.returncode == 0, p.stderr
    assert any(line.startswith("WARNING: NOT THE SAME WORK") and "structured differs" in line
               for line in p.stdout.splitlines()), p.stdout
