"""Runs the engine (engine.py) in real time: plan a step, sleep until its end (an absolute
deadline: the next step starts at the previous one's due end, so lateness never accumulates),
apply it, hand the produced tokens to their requests. Engine stalls (faults) delay the start of
the next step to the stall's end. Also feeds the engine's gauges and counters to /metrics."""
from __future__ import annotations

import asyncio
import time

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

    def submit(self, request_id: str, arrival_ns: int, prompt_ids: list[int], max_tokens: int) -> EngineGeneration:
        gen = EngineGeneration(request_id, arrival_ns, prompt_ids, max_tokens)
        self._seqs[id(gen)] = self.engine.add(gen)  # ValueError: too long for the model/KV pool
        self._wake.set()
        return gen

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
        for seq in [s for s in list(self.engine.running) + list(self.engine.waiting) if s.req.cancelled]:
            self.engine.drop(seq)
            self._seqs.pop(id(seq.req), None)

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
            start = self._after_stalls(start)
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
            prev_end = step.end_ns
            m = self.metrics
            if m is not None:
                m.counters["vllm:prompt_tokens"] += step.prefill_tokens
                m.counters["vllm:generation_tokens"] += len(produced)
                m.counters["vllm:num_preemptions"] = e.num_preemptions
                m.counters["vllm:prefix_cache_queries"] = e.prefix_queries
                m.counters["vllm:prefix_cache_hits"] = e.prefix_hits
                m.iteration_tokens.observe(step.prefill_tokens + step.decode_tokens)
                m.running, m.waiting, m.kv_usage = len(e.running), len(e.waiting), e.kv_usage()
