"""The sim's continuous-batching engine, stepped in virtual time."""
from __future__ import annotations

import pytest

from loadgen.sim.profiles import BLOCK_SIZE
from tests.unit.sim_virtual import Req, engine, prompt, simulate, tpot, ttft


def test_one_request_prefill_then_one_token_per_decode_step():
    e = engine()
    r = Req("a", 1000, prompt(100), 5)
    steps = simulate(e, [r])
    p = e.profile
    assert r.scheduled_ns == 1000 and len(r.token_ns) == 5
    assert ttft(r) == p.step_ns(100, 1, 100, 100 * 101 // 2, True)
    for i, (a, b) in enumerate(zip(r.token_ns, r.token_ns[1:])):
        ctx = 100 + i + 1  # KV read by the decode step that makes token i+1
        assert b - a == p.step_ns(1, 1, ctx, ctx, False)
    assert len(steps) == 5 and e.free_blocks == e.cfg.kv_blocks and not e.has_work()


def test_speed_dilates_every_step():
    r1, r2 = Req("a", 0, prompt(300), 8), Req("a", 0, prompt(300), 8)
    simulate(engine(speed=1.0), [r1])
    simulate(engine(speed=0.1), [r2])
    assert all(abs(b - 10 * a) <= 10 for a, b in zip(r1.token_ns, r2.token_ns))


def test_a_ttft_grows_with_prompt_tpot_does_not():
    short, long = Req("s", 0, prompt(200), 64), Req("l", 0, prompt(2000), 64)
    simulate(engine(), [short])
    simulate(engine(), [long])
    assert ttft(long) >= 5 * ttft(short)
    assert abs(tpot(long) - tpot(short)) / tpot(short) < 0.10


def test_b_batching_raises_throughput_and_itl():
    def run(batch):
        reqs = [Req(f"r{i}", 0, prompt(128, i), 128) for i in range(batch)]
        simulate(engine(), reqs)
        span = max(r.token_ns[-1] for r in reqs) - min(r.token_ns[0] for r in reqs)
        return sum(len(r.token_ns) - 1 for r in reqs) / span, sum(tpot(r) for r in reqs) / batch

    tps1, itl1 = run(1)
    tps32, itl32 = run(32)
    assert tps32 >= 10 * tps1
    assert itl32 > itl1


def _long_prompt_mid_stream(budget):
    e = engine(max_num_batched_tokens=budget)
    streams = [Req(f"s{i}", 0, prompt(64, i), 200) for i in range(4)]
    long = Req("long", 50_000_000, prompt(4000, 99), 4)
    simulate(e, streams + [long])
    gap = max(b - a for r in streams for a, b in zip(r.token_ns, r.token_ns[1:]))
    return gap, ttft(long), streams, long


def test_c_long_prefill_stalls_running_streams_and_chunking_trades_itl_for_ttft():
    gap_big, ttft_big, streams, long = _long_prompt_mid_stream(8192)
    gap_small, ttft_small, _, _ = _long_prompt_mid_stream(256)
    normal_itl = tpot(Req("x", 0, [], 0, token_ns=streams[0].token_ns[:10]))
    assert gap_big > 10 * normal_itl  # the whole 4000-token prefill in one step
    assert gap_small < gap_big / 5
    assert ttft_small > ttft_big
    # the stall is in the truth of the running streams
    assert all(s.stall_ns >= gap_big - 2 * normal_itl for s in streams)


def test_d_small_kv_pool_queues_and_preempts_and_everyone_finishes():
    cap = 64 * BLOCK_SIZE
    e = engine(kv_capacity_tokens=cap)
    reqs = [Req(f"r{i}", i * 1_000_000, prompt(200, i), 300) for i in range(12)]
    seen = {"waiting_full": 0, "max_used": 0}

    def watch(eng, step):
        used = eng.cfg.kv_blocks - eng.free_blocks
        seen["max_used"] = max(seen["max_used"], used)
        if eng.waiting and eng.kv_usage() > 0.9:
            seen["waiting_full"] += 1
        assert eng.free_blocks >= 0

    simulate(e, reqs, watch)
    assert seen["waiting_full"] > 0 and seen["max_used"] <= e.cfg.kv_blocks
    assert e.num_preemptions > 0 and sum(r.preemptions for r in reqs) == e.num_preemptions
    assert all(len(r.token_ns) == 300 for r in reqs)
    preempted = [r for r in reqs if r.preemptions]
    assert all(r.stall_ns > 0 for r in preempted)
    assert e.free_blocks == e.cfg.kv_blocks


def test_max_num_seqs_caps_the_batch():
    e = engine(max_num_seqs=3)
    reqs = [Req(f"r{i}", 0, prompt(16, i), 20) for i in range(7)]
    sizes = []
    simulate(e, reqs, lambda eng, step: sizes.append(len(step.items)))
    assert max(sizes) == 3
    assert sorted(r.scheduled_ns for r in reqs)[3] > 0  # the 4th waited


def test_prefix_caching_skips_cached_blocks():
    shared = prompt(1000, 5)
    a, b = Req("a", 0, shared, 4), Req("b", 100_000_000, shared + prompt(10, 6), 4)
    e = engine(prefix_caching=True)
    simulate(e, [a, b])
    assert b.cached_tokens == 1000 - 1000 % BLOCK_SIZE and a.cached_tokens == 0
    assert ttft(b) < ttft(a) / 3
    c = Req("c", 0, shared + prompt(10, 6), 4)
    simulate(engine(prefix_caching=False), [c])
    assert c.cached_tokens == 0 and ttft(c) > ttft(b)


def test_too_long_request_is_refused():
    e = engine(kv_capacity_tokens=1024)
    with pytest.raises(ValueError, match="exceeds"):
        e.add(Req("x", 0, prompt(1000), 100))
    with pytest.raises(ValueError, match="empty"):
        e.add(Req("y", 0, [], 1))
