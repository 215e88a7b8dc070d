"""The target's context limit and model list, checked before anything is sent (plan/context.py,
probe/discover.py): against the built-in simulator given a small --max-model-len, and a vLLM-shaped
model list served by a test double."""
import http.server
import json
import textwrap
import threading

import orjson
import polars as pl
import pytest

from tests.integration.conftest import RELAXED_SELFCHECK, loadgen, workload

LIMIT = 512
# trace rows (intended_ns, prompt, output): row 2 (line 3) and row 4 (line 6, after a blank line) too long
ROWS = [(0, 100, 16), (20_000_000, 200, 16), (40_000_000, 900, 16), (60_000_000, 300, 16), None,
        (80_000_000, 500, 100)]


def _workload(tmp_path) -> str:
    trace = tmp_path / "trace.jsonl"
    trace.write_text("".join("\n" if r is None else json.dumps(
        {"intended_ns": r[0], "prompt_tokens": r[1], "max_tokens": r[2]}) + "\n" for r in ROWS))
    w = tmp_path / "w.toml"
    w.write_text(textwrap.dedent(f"""
        api = "completions"
        [arrivals]
        process = "trace"
        [trace]
        file = "{trace}"
        [run]
        drain_timeout = "20s"
        """))
    return str(w)


def _run(tmp_path, *flags: str):
    out = tmp_path / "run"
    p = loadgen("run", _workload(tmp_path), "--out", str(out), "--no-calibrate", "--quiet", *RELAXED_SELFCHECK,
                "--sim-args", f"--mode fixed --ttft 5ms --itl 1ms --max-model-len {LIMIT}", *flags)
    return p, out


def test_an_over_long_trace_row_is_named_before_anything_is_sent(tmp_path):
    p, out = _run(tmp_path)
    assert p.returncode == 2, p.stderr
    trace = tmp_path / "trace.jsonl"
    assert "2 of 5 planned requests do not fit the target's context of 512 tokens" in p.stderr
    assert "max_model_len of 'loadgen-sim-fixed'" in p.stderr and "/v1/models" in p.stderr
    assert f"request 2 ({trace}:3): prompt 900 + output 16 = 916 tokens" in p.stderr
    assert f"request 4 ({trace}:6): prompt 500 + output 100 = 600 tokens" in p.stderr
    assert "--over-context clip" in p.stderr and "Traceback" not in p.stderr
    assert not (out / "requests.parquet").exists() and not (out / "manifest.json").exists()


@pytest.mark.parametrize("policy", ["clip", "drop"])
def test_clip_and_drop_are_counted_and_every_request_sent_fits(tmp_path, policy):
    p, out = _run(tmp_path, "--over-context", policy)
    assert p.returncode == 0, p.stderr
    manifest = orjson.loads((out / "manifest.json").read_bytes())
    context = manifest["workload"]["context"]
    assert context["limit_tokens"] == LIMIT and context["policy"] == policy
    assert context["over"] == 2 and context["requests_before"] == 5 and context["longest_tokens"] == 916
    assert context["clipped" if policy == "clip" else "dropped"] == 2
    assert context["dropped" if policy == "clip" else "clipped"] == 0
    rows = pl.read_parquet(out / "requests.parquet")
    assert rows.height == manifest["schedule"]["requests"] == (5 if policy == "clip" else 3)
    assert rows["outcome"].to_list() == ["ok"] * rows.height
    # the simulator's own count of what it was sent: every prompt + max_tokens within its limit
    truth = pl.read_parquet(out / "sim_truth.parquet")
    assert truth.height == rows.height and truth["http_status"].to_list() == [200] * rows.height
    sent = rows.sort("idx")
    assert (sent["prompt_tokens"] + sent["max_tokens"]).max() <= LIMIT
    if policy == "clip":  # own text shortened first; the output kept
        assert sent["prompt_tokens"].to_list() == [100, 200, LIMIT - 16, 300, LIMIT - 100]
        assert sent["max_tokens"].to_list() == [16, 16, 16, 16, 100]
    else:
        assert sent["prompt_tokens"].to_list() == [100, 200, 300]


class _Models(http.server.BaseHTTPRequestHandler):
    """GET /v1/models as vLLM answers it (two models); everything else 404."""
    listing = {"object": "list", "data": [
        {"id": "llama-8b", "object": "model", "owned_by": "vllm", "max_model_len": 4096},
        {"id": "qwen-7b", "object": "model", "owned_by": "vllm", "max_model_len": 32768}]}
    seen: list[str] = []

    def do_GET(self):
        self.seen.append(self.path)
        body = orjson.dumps(self.listing) if self.path == "/v1/models" else b"{}"
        self.send_response(200 if self.path == "/v1/models" else 404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        self.seen.append("POST " + self.path)
        self.send_response(404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def vllm_models():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Models)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    _Models.seen = []
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_a_model_the_target_does_not_serve_is_exit_2_listing_what_it_serves(tmp_path, vllm_models):
    p = loadgen("run", _workload(tmp_path), "--url", vllm_models, "--model", "llama-70b", "--out",
                str(tmp_path / "run"), "--no-calibrate", "--quiet")
    assert p.returncode == 2, p.stderr
    assert "model: 'llama-70b' is not served by the target" in p.stderr
    assert f"{vllm_models}/v1/models lists llama-8b, qwen-7b" in p.stderr and "Traceback" not in p.stderr
    assert not any(s.startswith("POST /v1/") for s in _Models.seen)  # nothing was sent


def test_a_served_model_is_checked_against_its_own_limit(tmp_path, vllm_models):
    p = loadgen("run", workload(tmp_path, requests=5, max_tokens=4090), "--url", vllm_models, "--model", "llama-8b",
                "--out", str(tmp_path / "run"), "--no-calibrate", "--quiet")
    assert p.returncode == 2, p.stderr
    assert "5 of 5 planned requests do not fit the target's context of 4096 tokens" in p.stderr
    assert f"max_model_len of 'llama-8b' in {vllm_models}/v1/models" in p.stderr
    assert not any(s.startswith("POST /v1/") for s in _Models.seen)


def test_a_llamacpp_targets_per_slot_context_is_read_from_props(tmp_path):
    p = loadgen("run", _workload(tmp_path), "--out", str(tmp_path / "run"), "--no-calibrate", "--quiet",
                "--sim-args", f"--mode fixed --emulate llamacpp --max-model-len {LIMIT}")
    assert p.returncode == 2, p.stderr
    assert "2 of 5 planned requests do not fit the target's context of 512 tokens" in p.stderr
    assert "default_generation_settings.n_ctx (per slot) in http://127.0.0.1:" in p.stderr


class _Ollama(_Models):
    """Ollama's own model list (GET /api/tags); no OpenAI /v1/models."""

    def do_GET(self):
        self.seen.append(self.path)
        ok = self.path == "/api/tags"
        body = orjson.dumps({"models": [{"name": "llama3:latest"}, {"name": "qwen2:7b"}]}) if ok else b"{}"
        self.send_response(200 if ok else 404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def test_an_ollama_model_not_pulled_is_exit_2_listing_its_tags(tmp_path):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Ollama)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        p = loadgen("run", _workload(tmp_path), "--url", url, "--backend", "ollama", "--model", "mistral",
                    "--out", str(tmp_path / "run"), "--no-calibrate", "--quiet")
    finally:
        server.shutdown()
        server.server_close()
    assert p.returncode == 2, p.stderr
    assert f"model: 'mistral' is not served by the target: {url}/api/tags lists llama3:latest, qwen2:7b" in p.stderr


def test_every_worker_process_fits_the_plan_alike(tmp_path):
    # each worker rebuilds the plan from the config (workers.run_share): the limit travels in it
    p, out = _run(tmp_path, "--over-context", "drop", "--workers", "2")
    assert p.returncode == 0, p.stderr
    manifest = orjson.loads((out / "manifest.json").read_bytes())
    assert manifest["generator"]["workers"] == 2 and manifest["workload"]["context"]["dropped"] == 2
    rows = pl.read_parquet(out / "requests.parquet").sort("idx")
    assert rows["idx"].to_list() == [0, 1, 2] and rows["prompt_tokens"].to_list() == [100, 200, 300]
    assert rows["outcome"].to_list() == ["ok"] * 3


def test_the_quickstart_takes_the_model_the_target_serves(tmp_path):
    # one --url aims the quickstart at any single-model server: its model comes from /v1/models
    from pathlib import Path

    from loadgen.sim.process import SimProcess

    sim = SimProcess(args=["--mode", "fixed", "--ttft", "5ms", "--itl", "1ms", "--model", "some-served-name"])
    url = sim.start()
    try:
        quickstart = Path(__file__).resolve().parents[2] / "workloads" / "quickstart.toml"
        out = tmp_path / "run"
        p = loadgen("run", str(quickstart), "--url", url, "--requests", "6", "--out", str(out), "--quiet",
                    "--no-calibrate", *RELAXED_SELFCHECK)
    finally:
        sim.stop()
    assert p.returncode == 0, p.stderr
    manifest = orjson.loads((out / "manifest.json").read_bytes())
    assert manifest["config"]["model"] == "some-served-name"
    assert pl.read_parquet(out / "requests.parquet")["outcome"].to_list() == ["ok"] * 6
