"""`loadgen sim` engine mode through HTTP: the batching phenomena (a)-(d) of docs/design.md, truth, per-request
metrics, several tokens per chunk. Uses the `tiny` profile (dilated where many streams run)."""
from __future__ import annotations

import asyncio
import time
import re

import aiohttp
import orjson
import pytest

from loadgen.sim.process import SimProcess
from loadgen.sim.truth import read_truth
from tests.integration.sim_helpers import stream_completion, token_events


def words(n: int, salt: str = "w") -> str:
    return " ".join(f"{salt}{i}" for i in range(n))


def session() -> aiohttp.ClientSession:
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))


def ttft_ns(res) -> int:
    return token_events(res)[0][0] - res["sent_ns"]


def tpot_ns(res) -> float:
    t = [s for s, _ in token_events(res)]
    return (t[-1] - t[0]) / (len(t) - 1)


def max_gap_ns(res) -> int:
    t = [s for s, _ in token_events(res)]
    return max(b - a for a, b in zip(t, t[1:]))


def test_a_ttft_grows_with_prompt_length_tpot_does_not(tmp_path):
    # dilated x4 so that the sim's and the client's scheduling noise on a shared 2-core machine
    # (up to a few ms) stays small against a TPOT of ~6 ms
    with SimProcess(args=["--profile", "tiny", "--speed", "0.25"]) as sim:
        async def go():
            async with session() as s:
                await stream_completion(s, sim.url, {"prompt": "warm", "max_tokens": 2, "stream": True})
                short = await stream_completion(s, sim.url, {"prompt": words(200), "max_tokens": 48, "stream": True})
                long = await stream_completion(s, sim.url, {"prompt": words(2000), "max_tokens": 48, "stream": True})
                return short, long

        short, long = asyncio.run(go())
    assert ttft_ns(long) >= 5 * ttft_ns(short)
    assert abs(tpot_ns(long) - tpot_ns(short)) / tpot_ns(short) < 0.10


def test_b_batching_raises_total_throughput_10x_and_per_stream_itl(tmp_path):
    with SimProcess(args=["--profile", "tiny", "--speed", "0.2"]) as sim:
        async def batch(n):
            async with session() as s:
                res = await asyncio.gather(*[stream_completion(
                    s, sim.url, {"prompt": words(128, f"b{n}x{i}-"), "max_tokens": 64, "stream": True})
                    for i in range(n)])
            first = min(token_events(r)[0][0] for r in res)
            last = max(token_events(r)[-1][0] for r in res)
            tokens = sum(len(token_events(r)) - 1 for r in res)
            return tokens / (last - first), sum(tpot_ns(r) for r in res) / n

        tps1, itl1 = asyncio.run(batch(1))
        tps32, itl32 = asyncio.run(batch(32))
    assert tps32 >= 10 * tps1
    assert itl32 > itl1


def _long_prompt_mid_stream(budget: int):
    # speed 0.1: the effects (a gap of ~0.9 s against ~70 ms; TTFTs ~80 ms apart) stand well clear of the
    # tens of ms a busy 2-core host can add to one stream's timings
    with SimProcess(args=["--profile", "tiny", "--speed", "0.1", "--max-num-batched-tokens", str(budget)]) as sim:
        async def go():
            async with session() as s:
                streams = [asyncio.create_task(stream_completion(
                    s, sim.url, {"prompt": words(64, f"s{i}-"), "max_tokens": 120, "stream": True}))
                    for i in range(4)]
                await asyncio.sleep(0.5)  # the streams are decoding
                long = await stream_completion(s, sim.url,
                                               {"prompt": words(4000, "L"), "max_tokens": 4, "stream": True})
                return await asyncio.gather(*streams), long

        streams, long = asyncio.run(go())
    return max(max_gap_ns(r) for r in streams), ttft_ns(long), streams


def test_c_long_prompt_mid_stream_gap_and_chunked_prefill_tradeoff():
    gap_big, ttft_big, streams = _long_prompt_mid_stream(8192)
    gap_small, ttft_small, _ = _long_prompt_mid_stream(256)
    typical = sorted(b - a for r in streams for (a, _), (b, _) in zip(token_events(r), token_events(r)[1:]))
    median_itl = typical[len(typical) // 2]
    assert gap_big > 10 * median_itl  # the running streams all saw the long prefill
    assert gap_small < gap_big / 4  # a small budget shrinks the gap ...
    assert ttft_small > ttft_big  # ... and raises the long prompt's TTFT


def _scrape(text: str, name: str) -> float:
    m = re.search(rf"^{re.escape(name)}{{[^}}]*}} (\S+)$", text, re.M)
    assert m, name
    return float(m.group(1))


def test_d_small_kv_pool_waiting_at_full_usage_and_preemptions_in_truth(tmp_path):
    truth, step_log = tmp_path / "truth.parquet", tmp_path / "steps.jsonl"
    with SimProcess(args=["--profile", "tiny", "--speed", "0.5", "--kv-capacity-tokens", "1024",
                          "--truth", str(truth), "--step-log", str(step_log)]) as sim:
        async def go():
            async with session() as s:
                tasks = [asyncio.create_task(stream_completion(
                    s, sim.url, {"prompt": words(200, f"k{i}-"), "max_tokens": 150, "stream": True},
                    request_id=f"kv-{i}")) for i in range(10)]
                samples = []
                while not all(t.done() for t in tasks):
                    async with s.get(sim.url + "/metrics") as r:
                        text = await r.text()
                    samples.append((_scrape(text, "vllm:num_requests_waiting"),
                                    _scrape(text, "vllm:kv_cache_usage_perc")))
                    await asyncio.sleep(0.01)
                results = await asyncio.gather(*tasks)
                async with s.get(sim.url + "/metrics") as r:
                    final = await r.text()
                return samples, results, final

        samples, results, final = asyncio.run(go())
    assert any(w > 0 and u >= 0.9 for w, u in samples)
    assert all(len(token_events(r)) == 150 for r in results)
    rows = read_truth(truth)
    assert len(rows) == 10 and sum(r["preemptions"] for r in rows) > 0
    assert _scrape(final, "vllm:num_preemptions_total") == sum(r["preemptions"] for r in rows)
    for r in rows:
        assert r["arrival_ns"] + r["queue_ns"] + r["prefill_ns"] + r["decode_ns"] == r["finish_ns"]
        if r["preemptions"]:
            assert r["stall_ns"] > 0
    steps = [orjson.loads(line) for line in step_log.read_bytes().splitlines()]
    assert sum(s["preempted"] for s in steps) == sum(r["preemptions"] for r in rows)
    assert all(s["kv_blocks_used"] <= s["kv_blocks_total"] == 64 for s in steps)
    assert all(a["end_ns"] <= b["start_ns"] for a, b in zip(steps, steps[1:]))


async def worst_timer_lateness_ns(stop: asyncio.Event) -> int:
    # the most a 1 ms timer of this event loop fired late until `stop`: how late the host let it run
    worst = 0
    while not stop.is_set():
        due = time.monotonic_ns() + 1_000_000
        await asyncio.sleep(0.001)
        worst = max(worst, time.monotonic_ns() - due)
    return worst


def test_truth_matches_client_and_per_request_metrics_and_chunks(tmp_path):
    truth = tmp_path / "truth.jsonl"
    with SimProcess(args=["--profile", "tiny", "--per-request-metrics", "--tokens-per-chunk", "3",
                          "--truth", str(truth)]) as sim:
        async def go():
            stop = asyncio.Event()
            probe = asyncio.create_task(worst_timer_lateness_ns(stop))
            async with session() as s:
                res = await asyncio.gather(*[stream_completion(
                    s, sim.url, {"prompt": words(50, f"t{i}-"), "max_tokens": 10, "stream": True,
                                 "stream_options": {"include_usage": True}}, request_id=f"id-{i}")
                    for i in range(3)])
            stop.set()
            return res, await probe

        results, late_ns = asyncio.run(go())
    rows = {r["request_id"]: r for r in read_truth(truth)}
    for res in results:
        row = rows[res["request_id"]]
        chunks = token_events(res)
        assert [t for _, t in chunks] == ["tok " * 3] * 3 + ["tok "]
        assert row["output_tokens"] == 10 and row["token_ns"][0] == row["token_ns"][2] == row["first_token_ns"]
        # every chunk reached the client after the server stamped it, within 5 ms plus however late this
        # process's loop ran meanwhile (a busy host delays the reads by that much)
        for (c, _), s in zip(chunks, row["token_ns"][::3]):
            assert 0 <= c - s < 5_000_000 + late_ns, (c - s, late_ns)
        assert row["arrival_ns"] + row["queue_ns"] + row["prefill_ns"] + row["decode_ns"] == row["finish_ns"]
        usage = res["events"][-2][1]
        m = usage["metrics"]
        assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 10
        assert m["queue_time_ms"] == pytest.approx(row["queue_ns"] / 1e6)
        assert m["time_to_first_token_ms"] == pytest.approx(row["prefill_ns"] / 1e6)
        assert m["generation_time_ms"] == pytest.approx(row["decode_ns"] / 1e6)
        assert m["mean_itl_ms"] == pytest.approx(row["decode_ns"] / 1e6 / 9)
        assert m["tokens_per_second"] == pytest.approx(9 / (row["decode_ns"] / 1e9))


def test_prefix_caching_through_http():
    shared = words(1000, "sys")
    with SimProcess(args=["--profile", "tiny", "--speed", "0.5", "--prefix-caching"]) as sim:
        async def go():
            async with session() as s:
                body = {"prompt": shared + " first question", "max_tokens": 4, "stream": True,
                        "stream_options": {"include_usage": True}}
                a = await stream_completion(s, sim.url, body)
                body["prompt"] = shared + " another question here"
                b = await stream_completion(s, sim.url, body)
                return a, b

        a, b = asyncio.run(go())
    usage_a, usage_b = a["events"][-2][1]["usage"], b["events"][-2][1]["usage"]
    assert "prompt_tokens_details" not in usage_a
    assert usage_b["prompt_tokens_details"]["cached_tokens"] == 992  # 62 full blocks of 16
    assert ttft_ns(b) < ttft_ns(a) / 2
