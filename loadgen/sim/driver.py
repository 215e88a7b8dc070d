"""Runs the engine (engine.py) in real time: plan a step, sleep until its end (an absolute
deadline: the next step starts at the previous one's due end, so lateness never accumulates),
apply it, hand the produced tokens to their requests. Engine stalls (faults) delay the start of
the next step to the stall's end. Also feeds the engine's gauges and counters to /metrics, and
with --step-log FILE writes one JSON line per step: start_ns, end_ns (monotonic ns),
prefill_tokens, decode_seqs, seqs, kv_blocks_used, kv_blocks_total, running, waiting (after the
step), preempted (sequences preempted to make room for it)."""
from __future__ import annotations

import asyncio
import time
from typing import BinaryIO

import orjson

from loadgen.sim.clock import sleep_until_ns
from loadgen.sim.engine import Engine, EngineConfig, Seq
from loadgen.sim.faults import Stall
from loadgen.sim.generation import EngineGeneration
from loadgen.sim.profiles import Profile


class EngineBackend:
    def __init__(self, profile: Profile, cfg: EngineConfig, speed: float, stalls: list[Stall], sim_t0_ns: int):
        self.engine = Engine(profile, cfg, speed)
        self.stalls = sorted(stalls, key=lambda s: s.start_ns)
        self.sim_t0_ns = sim_t0_ns
        self.metrics = None  # SimMetrics, set by the caller
        self._seqs: dict[int, Seq] = {}
        self._wake = asyncio.Event()
        self.step_log: BinaryIO | None = None
        self._cancelled: list[EngineGeneration] = []  # client gone before the end: drop at the next step

    def close(self) -> None:
        if self.step_log is not None:
            self.step_log.close()
            self.step_log = None

    def submit(self, request_id: str, arrival_ns: int, prompt: list, max_tokens: int,
               priority: int = 0) -> EngineGeneration:
        gen = EngineGeneration(request_id, arrival_ns, prompt, max_tokens)
        gen.priority = priority  # ordered by under --scheduling-policy priority (engine.py)
        self.engine.check(gen)  # ValueError: too long for the model/KV pool
        gen.on_cancel = self._cancelled.append
        delay_s = self.engine.profile.request_overhead_us * 1e-6 / self.engine.speed
        if delay_s > 0:  # host time before the engine sees it (profiles.py); truth keeps the real arrival
            asyncio.get_running_loop().call_later(delay_s, self._admit, gen)
        else:
            self._admit(gen)
        return gen

    def _admit(self, gen: EngineGeneration) -> None:
        if gen.cancelled:
            return
        self._seqs[id(gen)] = self.engine.add(gen)
        self._wake.set()

    def state(self) -> dict:
        e = self.engine
        return {"running": len(e.running), "waiting": len(e.waiting), "kv_usage": e.kv_usage()}

    def _after_stalls(self, t_ns: int) -> int:
        for s in self.stalls:
            a = self.sim_t0_ns + s.start_ns
            if a <= t_ns < a + s.duration_ns:
                t_ns = a + s.duration_ns
        return t_ns

    def _drop_cancelled(self) -> None:
        while self._cancelled:
            seq = self._seqs.pop(id(self._cancelled.pop()), None)
            if seq is not None:
                self.engine.drop(seq)

    async def run(self) -> None:
        e = self.engine
        prev_end: int | None = None
        while True:
            self._drop_cancelled()
            if not e.has_work():
                prev_end = None
                self._wake.clear()
                await self._wake.wait()
                continue
            now = time.monotonic_ns()
            start = prev_end if prev_end is not None else now
            stalled_start = self._after_stalls(start)
            if stalled_start != start:
                for seq in list(e.running) + list(e.waiting):
                    seq.req.stalled = True
                start = stalled_start
            step = e.schedule(start)
            if step is None:  # only requests that arrive after `start` (we are running behind)
                prev_end = None
                await asyncio.sleep(0)
                continue
            await sleep_until_ns(step.end_ns)
            produced = e.complete(step)
            for seq, done in produced:
                seq.req.produced(step.end_ns)
                if done:
                    self._seqs.pop(id(seq.req), None)
            await asyncio.sleep(0)  # let the woken streams write before any bookkeeping
            prev_end = step.end_ns
            if self.step_log is not None:
                self.step_log.write(orjson.dumps({
                    "start_ns": step.start_ns, "end_ns": step.end_ns, "prefill_tokens": step.prefill_tokens,
                    "decode_seqs": step.decode_tokens, "seqs": len(step.items),
                    "kv_blocks_used": e.cfg.kv_blocks - e.free_blocks, "kv_blocks_total": e.cfg.kv_blocks,
                    "running": len(e.running), "waiting": len(e.waiting), "preempted": len(step.preempted)}) + b"\n")
            m = self.metrics
            if m is not None:
                # vLLM's rule (v1/metrics/stats.py IterationStats): a request's whole prompt, cached part
                # included, once, at its first output; never the recompute of a preempted one
                m.counters["vllm:prompt_tokens"] += sum(len(seq.req.prompt) for seq, _ in produced
                                                        if len(seq.req.due_ns) == 1)
                # a pooling request's prefill end is no generated token (pooling_apis.py)
                m.counters["vllm:generation_tokens"] += sum(1 for seq, _ in produced
                                                            if not getattr(seq.req, "pooling", False))
                m.counters["vllm:num_preemptions"] = e.num_preemptions
                m.counters["vllm:prefix_cache_queries"] = e.prefix_queries
                m.counters["vllm:prefix_cache_hits"] = e.prefix_hits
                m.iteration_tokens.observe(step.prefill_tokens + step.decode_tokens)
                m.running, m.waiting, m.kv_usage = len(e.running), len(e.waiting), e.kv_usage()
