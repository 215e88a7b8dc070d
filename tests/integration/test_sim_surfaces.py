"""The sim's other surfaces through HTTP: Ollama, llama.cpp, /v1/models, /health, /metrics,
non-streaming engine responses, refusals, and a client that goes away mid-stream."""
from __future__ import annotations

import asyncio
import re

import aiohttp
import orjson
import pytest

from loadgen.sim.process import SimProcess
from loadgen.sim.truth import read_truth


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    truth = tmp_path_factory.mktemp("surfaces") / "truth.jsonl"
    with SimProcess(args=["--profile", "tiny", "--truth", str(truth), "--kv-capacity-tokens", "4096"]) as s:
        yield s, truth


def call(coro_fn):
    async def go():
        async with aiohttp.ClientSession() as s:
            return await coro_fn(s)
    return asyncio.run(go())


def test_ollama_generate_and_chat_ndjson_with_durations(sim):
    s_, truth = sim

    async def go(s):
        out = []
        for path, body in (("/api/generate", {"model": "m", "prompt": "a b c", "options": {"num_predict": 4}}),
                           ("/api/chat", {"model": "m", "messages": [{"role": "user", "content": "a b"}],
                                          "options": {"num_predict": 4}})):
            async with s.post(s_.url + path, json=body, headers={"X-Request-Id": f"ol{path}"}) as r:
                assert r.headers["Content-Type"].startswith("application/x-ndjson")
                out.append([orjson.loads(line) for line in (await r.read()).splitlines()])
        return out

    gen, chat = call(go)
    rows = {r["request_id"]: r for r in read_truth(truth)}
    for lines, key, rid, prompt_n in ((gen, "response", "ol/api/generate", 3), (chat, "message", "ol/api/chat", 2)):
        assert len(lines) == 5 and all(not x["done"] for x in lines[:4]) and lines[4]["done"]
        texts = [x[key] if key == "response" else x[key]["content"] for x in lines[:4]]
        assert texts == ["tok "] * 4
        final, row = lines[4], rows[rid]
        assert final["eval_count"] == 4 and final["prompt_eval_count"] == prompt_n
        assert final["prompt_eval_duration"] == row["prefill_ns"] and final["eval_duration"] == row["decode_ns"]
        assert final["total_duration"] == row["finish_ns"] - row["arrival_ns"]
        assert final["total_duration"] - final["prompt_eval_duration"] - final["eval_duration"] == row["queue_ns"]


def test_llamacpp_completion_stream_and_whole(sim):
    s_, _ = sim

    async def go(s):
        async with s.post(s_.url + "/completion", json={"prompt": "x y", "n_predict": 3, "stream": True}) as r:
            events = [orjson.loads(e[6:]) for e in (await r.read()).split(b"\n\n") if e]
        async with s.post(s_.url + "/completion", json={"prompt": [1, 2, 3, 4], "n_predict": 2}) as r:
            whole = await r.json()
        return events, whole

    events, whole = call(go)
    assert [e["content"] for e in events] == ["tok ", "tok ", "tok ", ""] and events[-1]["stop"]
    t = events[-1]["timings"]
    assert t["prompt_n"] == 2 and t["predicted_n"] == 3 and t["prompt_ms"] > 0 and t["predicted_ms"] > 0
    assert whole["content"] == "tok tok " and whole["tokens_evaluated"] == 4 and whole["timings"]["predicted_n"] == 2


def test_models_health_metrics_and_engine_non_streaming(sim):
    s_, _ = sim

    async def go(s):
        async with s.get(s_.url + "/health") as r:
            health = r.status
        async with s.get(s_.url + "/v1/models") as r:
            models = await r.json()
        async with s.get(s_.url + "/api/tags") as r:
            assert (await r.json())["models"][0]["name"] == "tiny-1b"
        async with s.post(s_.url + "/v1/chat/completions",
                          json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}) as r:
            chat = (r.status, r.headers.get("X-Request-Id"), await r.json())
        async with s.get(s_.url + "/metrics") as r:
            metrics = await r.text()
        return health, models, chat, metrics

    health, models, (st, rid, chat), metrics = call(go)
    assert health == 200 and models["data"][0]["id"] == "tiny-1b"
    assert st == 200 and rid.startswith("sim-") and chat["choices"][0]["message"]["content"] == "tok " * 5
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                 "vllm:num_preemptions_total", "vllm:prompt_tokens_total", "vllm:generation_tokens_total"):
        assert re.search(rf"^{name}{{", metrics, re.M), name
    for name in ("vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds",
                 "vllm:e2e_request_latency_seconds", "vllm:request_queue_time_seconds",
                 "vllm:request_prefill_time_seconds", "vllm:request_decode_time_seconds",
                 "loadgen_sim_emit_lateness_seconds"):
        assert re.search(rf'^{name}_bucket{{.*le="\+Inf"}} [1-9]', metrics, re.M), name
    assert 'vllm:time_to_first_token_seconds_bucket{engine="0",model_name="tiny-1b",le="0.001"}' in metrics
    assert re.search(r'^vllm:request_success_total\{.*finished_reason="length"\} [1-9]', metrics, re.MULTILINE)


def test_continuous_usage_stats(sim):
    s_, _ = sim

    async def go(s):
        body = {"prompt": "a b", "max_tokens": 3, "stream": True,
                "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
        async with s.post(s_.url + "/v1/completions", json=body) as r:
            return [orjson.loads(e[6:]) for e in (await r.read()).split(b"\n\n") if e and e != b"data: [DONE]"]

    events = call(go)
    assert [e["usage"]["completion_tokens"] for e in events] == [1, 2, 3, 3]
    assert events[-1]["choices"] == [] and events[0]["usage"]["prompt_tokens"] == 2


def test_too_long_request_is_a_400(sim):
    s_, _ = sim

    async def go(s):
        async with s.post(s_.url + "/v1/completions", json={"prompt": "a " * 4000, "max_tokens": 200}) as r:
            return r.status, await r.json()

    status, body = call(go)
    assert status == 400 and "exceeds" in body["message"]


def test_client_going_away_frees_its_sequence(sim):
    s_, truth = sim

    async def go(s):
        async with s.post(s_.url + "/v1/completions", json={"prompt": "a b", "max_tokens": 3000, "stream": True},
                          headers={"X-Request-Id": "leaver"}) as r:
            await r.content.readuntil(b"\n\n")
        r.close()
        for _ in range(100):  # the simulator frees the sequence when it notices: poll for 10 s at most
            await asyncio.sleep(0.1)
            async with s.get(s_.url + "/metrics") as r:
                metrics = await r.text()
            if re.search(r"^vllm:num_requests_running\{.*\} 0$", metrics, re.M):
                break
        return metrics

    metrics = call(go)
    assert re.search(r"^vllm:num_requests_running\{.*\} 0$", metrics, re.M)
    row = {r["request_id"]: r for r in read_truth(truth)}["leaver"]
    assert row["outcome"] == "client_gone" and 1 <= len(row["token_ns"]) < 3000


def test_sigterm_mid_stream_exits_0_promptly_with_the_in_flight_row(tmp_path):
    import time

    truth = tmp_path / "truth.parquet"
    sim = SimProcess(args=["--profile", "tiny", "--truth", str(truth)])
    sim.start()

    async def go(s):
        async with s.post(sim.url + "/v1/completions", json={"prompt": "a", "max_tokens": 5000, "stream": True},
                          headers={"X-Request-Id": "cut"}) as r:
            await r.content.readuntil(b"\n\n")
            await r.content.readuntil(b"\n\n")
            t0 = time.monotonic()
            code = await asyncio.get_running_loop().run_in_executor(None, sim.stop)
            return code, time.monotonic() - t0

    code, took_s = call(go)
    assert code == 0 and took_s < 5  # promptly: the 5,000-token stream would last ~7.5 s more
    row = {r["request_id"]: r for r in read_truth(truth)}["cut"]
    assert row["outcome"] == "interrupted" and row["finish_ns"] is None and len(row["token_ns"]) >= 2
