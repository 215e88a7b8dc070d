"""The sim's deadline sleeper (never early, all waiters served) and its Prometheus rendering."""
from __future__ import annotations

import asyncio
import random
import time

from loadgen.sim.clock import new_event_loop, sleep_until_ns, stop_ticker
from loadgen.sim.metrics import Histogram, SimMetrics, build_1_2_5_buckets


def test_sleep_until_never_returns_early_and_serves_every_waiter():
    rng = random.Random(3)

    async def main():
        t0 = time.monotonic_ns()
        dues = [t0 + rng.randrange(0, 30_000_000) for _ in range(60)] + [t0 - 1]  # one already past

        async def one(due):
            await sleep_until_ns(due)
            return time.monotonic_ns()

        woke = await asyncio.gather(*[one(d) for d in dues])
        await stop_ticker()
        return dues, woke

    loop = new_event_loop()
    try:
        dues, woke = loop.run_until_complete(main())
    finally:
        loop.close()
    assert all(w >= d for d, w in zip(dues, woke))


def test_histogram_buckets_are_cumulative_with_inf_and_sum():
    h = Histogram("x_seconds", "doc", [0.1, 1.0])
    for v in (0.05, 0.1, 0.5, 2.0):
        h.observe(v)
    out: list[str] = []
    h.render('a="1"', out)
    assert 'x_seconds_bucket{a="1",le="0.1"} 2' in out  # le is inclusive
    assert 'x_seconds_bucket{a="1",le="1.0"} 3' in out
    assert 'x_seconds_bucket{a="1",le="+Inf"} 4' in out
    assert 'x_seconds_count{a="1"} 4' in out and 'x_seconds_sum{a="1"} 2.65' in out


def test_vllm_names_and_token_buckets():
    assert build_1_2_5_buckets(100) == [1, 2, 5, 10, 20, 50, 100]
    m = SimMetrics("m", 0.5)
    text = m.render()
    for name in ("vllm:num_requests_running{", "vllm:num_requests_waiting{", "vllm:kv_cache_usage_perc{",
                 "vllm:num_preemptions_total{", "vllm:prompt_tokens_total{", "vllm:generation_tokens_total{",
                 "vllm:time_to_first_token_seconds_bucket{", "vllm:inter_token_latency_seconds_bucket{",
                 "vllm:e2e_request_latency_seconds_bucket{", "vllm:request_queue_time_seconds_bucket{",
                 "vllm:request_prefill_time_seconds_bucket{", "vllm:request_decode_time_seconds_bucket{",
                 "loadgen_sim_emit_lateness_seconds_bucket{", 'loadgen_sim_speed{engine="0",model_name="m"} 0.5'):
        assert name in text, name
