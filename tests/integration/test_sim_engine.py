"""`loadgen sim` engine mode through HTTP: the batching phenomena (a)-(d) of docs/design.md, truth, per-request
metrics, several tokens per chunk. Uses the `tiny` profile (dilated where many streams run)."""
from __future__ import annotations

import asyncio
import re
import statistics
import time

import aiohttp
import orjson
import pytest

from loadgen.sim.process import SimProcess
from loadgen.sim.truth import read_truth
from tests.integration.sim_helpers import stream_completion, token_events, worst_timer_lateness_ns


def words(n: int, salt: str = "w") -> str:
    return " ".join(f"{salt}{i}" for i in range(n))


def session() -> aiohttp.ClientSession:
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))


# Engine-side timings, from the simulator's truth rows. The engine runs on virtual time (each step starts at
# the previous step's due end), so a token's DUE time (token_ns - lateness_ns, monotonic ns) is what the engine
# model decided and does not move when the host parks the simulator or this process; the send/read stamps do.
def due_ns(row: dict) -> list[int]:
    return [t - late for t, late in zip(row["token_ns"], row["lateness_ns"], strict=True)]


def engine_ttft_ns(row: dict) -> int:
    # first scheduled (a step's start) -> first token due: prefill as the engine timed it. Queueing is left
    # out: arrival_ns is a wall-clock stamp, late by however long the host parked the simulator before it.
    return due_ns(row)[0] - row["scheduled_ns"]


def due_tpot_ns(row: dict) -> float:
    d = due_ns(row)
    return (d[-1] - d[0]) / (len(d) - 1)


def due_gaps_ns(row: dict) -> list[int]:
    d = due_ns(row)
    return [b - a for a, b in zip(d, d[1:])]


def truth_by_id(path) -> dict[str, dict]:
    return {r["request_id"]: r for r in read_truth(path)}


def test_a_ttft_grows_with_prompt_length_tpot_does_not(tmp_path):
    truth = tmp_path / "truth.jsonl"
    with SimProcess(args=["--profile", "tiny", "--speed", "0.25", "--truth", str(truth)]) as sim:
        async def go():
            async with session() as s:
                for rid, n in (("short", 200), ("long", 2000)):
                    res = await stream_completion(s, sim.url, {"prompt": words(n), "max_tokens": 48, "stream": True},
                                                  request_id=rid)
                    assert res["status"] == 200 and len(token_events(res)) == 48

        asyncio.run(go())
    rows = truth_by_id(truth)
    short, long = rows["short"], rows["long"]
    # one request at a time, so each prefill runs alone: a 10x longer prompt costs >= 5x the engine time
    # (the model's ~9x less the fixed step overhead) ...
    assert engine_ttft_ns(long) >= 5 * engine_ttft_ns(short), (engine_ttft_ns(long), engine_ttft_ns(short))
    # ... while a decode step is dominated by the weights read, not the context: TPOTs within 10 % (model ~2 %)
    assert abs(due_tpot_ns(long) - due_tpot_ns(short)) / due_tpot_ns(short) < 0.10


def test_b_batching_raises_total_throughput_10x_and_per_stream_itl(tmp_path):
    # 256 tokens a stream: decoding (~2.4 s for the batch of 32) dominates its one prefill step (~0.4 s) and
    # the up to ~0.5 s by which a parked client or simulator can spread the 32 arrivals
    truth, step_log = tmp_path / "truth.jsonl", tmp_path / "steps.jsonl"
    with SimProcess(args=["--profile", "tiny", "--speed", "0.2", "--truth", str(truth),
                          "--step-log", str(step_log)]) as sim:
        async def batch(n):
            async with session() as s:
                res = await asyncio.gather(*[stream_completion(
                    s, sim.url, {"prompt": words(128, f"b{n}x{i}-"), "max_tokens": 256, "stream": True},
                    request_id=f"b{n}-{i}") for i in range(n)])
            assert all(len(token_events(r)) == 256 for r in res)

        asyncio.run(batch(1))
        asyncio.run(batch(32))
    rows = read_truth(truth)
    steps = [orjson.loads(line) for line in step_log.read_bytes().splitlines()]

    def measure(n):
        # tokens per second of engine time: the summed durations (virtual ns) of the steps that served this
        # batch, idle time left out. A late arrival (the host parked the client or the simulator) leaves fewer
        # sequences in the earlier steps, which only lowers tps32, or the engine idle, which has nothing to do
        # with the engine model.
        mine = [r for r in rows if r["request_id"].startswith(f"b{n}-")]
        assert len(mine) == n
        lo, hi = min(r["scheduled_ns"] for r in mine), max(due_ns(r)[-1] for r in mine)
        busy = sum(st["end_ns"] - st["start_ns"] for st in steps if lo <= st["start_ns"] and st["end_ns"] <= hi)
        return sum(r["output_tokens"] for r in mine) * 1e9 / busy, sum(due_tpot_ns(r) for r in mine) / n

    tps1, itl1 = measure(1)
    tps32, itl32 = measure(32)
    assert tps32 >= 10 * tps1, (tps32, tps1)  # model: ~22x with all 32 arriving together
    assert itl32 > itl1, (itl32, itl1)  # a step with 32 sequences costs more than one with 1 (model: ~+25 %)


def _long_prompt_mid_stream(tmp_path, budget: int):
    # speed 0.1: the 4 streams decode for ~1.9 s, so the long prompt sent 0.5 s in still lands among them
    # even if the host parks this process or the simulator for 0.5 s (asserted below)
    truth = tmp_path / f"truth-{budget}.jsonl"
    with SimProcess(args=["--profile", "tiny", "--speed", "0.1", "--max-num-batched-tokens", str(budget),
                          "--truth", str(truth)]) as sim:
        async def go():
            async with session() as s:
                streams = [asyncio.create_task(stream_completion(
                    s, sim.url, {"prompt": words(64, f"s{i}-"), "max_tokens": 120, "stream": True},
                    request_id=f"s{i}")) for i in range(4)]
                await asyncio.sleep(0.5)  # the streams are decoding
                long = await stream_completion(s, sim.url,
                                               {"prompt": words(4000, "L"), "max_tokens": 4, "stream": True},
                                               request_id="long")
                return await asyncio.gather(*streams), long

        streams, long = asyncio.run(go())
    assert all(len(token_events(r)) == 120 for r in streams) and len(token_events(long)) == 4
    rows = truth_by_id(truth)
    streams = [rows[f"s{i}"] for i in range(4)]
    long = rows["long"]
    # precondition: every stream was still decoding when the long prompt's prefill began
    assert all(due_ns(r)[1] <= long["scheduled_ns"] < due_ns(r)[-1] for r in streams), budget
    return streams, long


def test_c_long_prompt_mid_stream_gap_and_chunked_prefill_tradeoff(tmp_path):
    streams_big, long_big = _long_prompt_mid_stream(tmp_path, 8192)
    streams_small, long_small = _long_prompt_mid_stream(tmp_path, 256)
    median_itl = statistics.median(g for r in streams_big for g in due_gaps_ns(r))
    gap_big = [max(due_gaps_ns(r)) for r in streams_big]
    gap_small = max(max(due_gaps_ns(r)) for r in streams_small)
    ttft_big, ttft_small = engine_ttft_ns(long_big), engine_ttft_ns(long_small)
    # model at speed 0.1: decode steps ~16 ms; the whole 4000-token prefill in one step ~0.9 s; in 256-token
    # chunks ~70 ms a step, over more steps (each also carrying the 4 decodes)
    assert all(g > 10 * median_itl for g in gap_big), (gap_big, median_itl)  # every stream saw the prefill
    assert gap_small < max(gap_big) / 4, (gap_small, gap_big)  # a small budget shrinks the gap ...
    assert ttft_small > ttft_big, (ttft_small, ttft_big)  # ... and raises the long prompt's TTFT


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


def test_prefix_caching_through_http(tmp_path):
    shared = words(1000, "sys")
    truth = tmp_path / "truth.jsonl"
    with SimProcess(args=["--profile", "tiny", "--speed", "0.5", "--prefix-caching", "--truth", str(truth)]) as sim:
        async def go():
            async with session() as s:
                body = {"prompt": shared + " first question", "max_tokens": 4, "stream": True,
                        "stream_options": {"include_usage": True}}
                a = await stream_completion(s, sim.url, body, request_id="a")
                body["prompt"] = shared + " another question here"
                b = await stream_completion(s, sim.url, body, request_id="b")
                return a, b

        a, b = asyncio.run(go())
    usage_a, usage_b = a["events"][-2][1]["usage"], b["events"][-2][1]["usage"]
    assert "prompt_tokens_details" not in usage_a
    assert usage_b["prompt_tokens_details"]["cached_tokens"] == 992  # 62 full blocks of 16
    rows = truth_by_id(truth)
    assert (rows["a"]["cached_tokens"], rows["b"]["cached_tokens"]) == (0, 992)
    # b computes only its ~12 uncached prompt tokens: its prefill takes well under half of a's engine time
    assert engine_ttft_ns(rows["b"]) < engine_ttft_ns(rows["a"]) / 2, (engine_ttft_ns(rows["b"]),
                                                                       engine_ttft_ns(rows["a"]))


def test_step_log_is_flushed_while_the_simulator_runs(tmp_path):
    # The periodic flush (app.py, every truth.FLUSH_EVERY_S): a simulator killed mid-run leaves its steps.
    from loadgen.sim.truth import FLUSH_EVERY_S

    step_log = tmp_path / "steps.jsonl"
    with SimProcess(args=["--profile", "tiny", "--speed", "0.5", "--step-log", str(step_log)]) as sim:
        async def one():
            async with session() as s:
                await stream_completion(s, sim.url, {"prompt": words(32), "max_tokens": 8, "stream": True},
                                        request_id="flush-0")

        asyncio.run(one())
        deadline = time.monotonic() + 10 * FLUSH_EVERY_S
        while time.monotonic() < deadline and not step_log.read_bytes():
            time.sleep(0.05)
        lines = step_log.read_bytes().splitlines()  # read before the simulator stops (stopping flushes too)
    assert lines and all("start_ns" in orjson.loads(line) for line in lines)
