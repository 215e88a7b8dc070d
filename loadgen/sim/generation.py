"""One request inside the simulator, as the HTTP surfaces see it: a source of output tokens,
each with the monotonic time (ns) at which it is due to be sent.

Producers: `FixedGeneration` (fixed TTFT/ITL, unlimited concurrency) computes due times itself;
the engine driver (driver.py) appends due times to an `EngineGeneration` at each step's end.
Consumers (server.py) call `await wait_for(n)`, which returns once the first n tokens are due
(or the generation ended early), then stamp and write.
"""
from __future__ import annotations

import asyncio
import time

from loadgen.sim.clock import sleep_until_ns
from loadgen.sim.faults import Stall, stall_overlap_ns


class Generation:
    def __init__(self, request_id: str, arrival_ns: int, prompt: list, max_tokens: int):
        self.request_id = request_id
        self.arrival_ns = arrival_ns
        self.prompt = prompt  # its tokens: words (tokenizer.words), or ids if the client sent ids
        self.prompt_tokens = len(prompt)
        self.max_tokens = max_tokens
        self.scheduled_ns: int | None = None  # first time the engine scheduled it
        self.preemptions = 0
        self.stall_ns = 0  # see truth.py: time lost to others' prefills, preemption, engine stalls
        self.cached_tokens = 0  # prompt tokens served from the prefix cache
        self.due_ns: list[int] = []  # due send time of each produced token
        self.stalled = False  # an engine stall (fault) delayed it
        self.priority = 0  # the body's `priority` (engine.py reads it under --scheduling-policy priority)
        self.model = ""    # the model it asked for (the truth's `model`)
        self.pooling = False  # embeddings / rerank: its one "token" is the prefill's end, never sent (driver.py)

    async def wait_for(self, n: int) -> None:
        raise NotImplementedError

    def cancel(self) -> None:
        """The client went away (or a fault cut it): stop producing."""


class FixedGeneration(Generation):
    def __init__(self, request_id: str, arrival_ns: int, prompt: list, max_tokens: int, *,
                 ttft_ns: int, itl_ns: int, stalls: list[Stall], sim_t0_ns: int):
        super().__init__(request_id, arrival_ns, prompt, max_tokens)
        self.scheduled_ns = arrival_ns
        self.ttft_ns, self.itl_ns = ttft_ns, itl_ns
        self.stalls, self.sim_t0_ns = stalls, sim_t0_ns

    cancelled = False

    def cancel(self) -> None:
        self.cancelled = True

    def due_of(self, i: int) -> int:
        # absolute: arrival + ttft + i * itl, never a chain of relative sleeps
        due = self.arrival_ns + self.ttft_ns + i * self.itl_ns
        if self.stalls:
            shift = stall_overlap_ns(self.stalls, self.sim_t0_ns, self.arrival_ns, due)
            if shift and i > 0:
                self.stall_ns = shift - stall_overlap_ns(self.stalls, self.sim_t0_ns, self.arrival_ns,
                                                         self.arrival_ns + self.ttft_ns)
            due += shift
            self.stalled = self.stalled or shift > 0
        return due

    async def wait_for(self, n: int) -> None:
        n = min(n, self.max_tokens)
        while len(self.due_ns) < n:
            self.due_ns.append(self.due_of(len(self.due_ns)))
        if n:
            await sleep_until_ns(self.due_ns[n - 1])


class EngineGeneration(Generation):
    def __init__(self, request_id: str, arrival_ns: int, prompt: list, max_tokens: int):
        super().__init__(request_id, arrival_ns, prompt, max_tokens)
        self.finished = False
        self.cancelled = False
        self.on_cancel = None  # set by the driver: called once if cancelled before finishing
        self._waiter: asyncio.Future | None = None

    def produced(self, due_ns: int, n: int = 1) -> None:
        # called by the driver at a step's end (its due time has been reached)
        self.due_ns.extend([due_ns] * n)
        if len(self.due_ns) >= self.max_tokens:
            self.finished = True
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def wait_for(self, n: int) -> None:
        n = min(n, self.max_tokens)
        while len(self.due_ns) < n and not self.finished and not self.cancelled:
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter
            self._waiter = None

    def cancel(self) -> None:
        if not self.cancelled and not self.finished and self.on_cancel is not None:
            self.on_cancel(self)
        self.cancelled = True


class FixedBackend:
    # --mode fixed: TTFT and ITL fixed (real time = given / speed), unlimited concurrency
    def __init__(self, ttft_ns: int, itl_ns: int, speed: float, stalls: list[Stall], sim_t0_ns: int):
        self.ttft_ns, self.itl_ns = round(ttft_ns / speed), round(itl_ns / speed)
        self.stalls, self.sim_t0_ns = stalls, sim_t0_ns
        self.max_model_len: int | None = None  # --max-model-len: prompt + max_tokens above it is a 400
        self.live: set[FixedGeneration] = set()  # for /metrics' running gauge (state())

    def submit(self, request_id: str, arrival_ns: int, prompt: list, max_tokens: int, priority: int = 0) -> Generation:
        # priority: accepted and ignored (fixed mode has no queue to order)
        if self.max_model_len is not None and len(prompt) + max_tokens > self.max_model_len:
            raise ValueError(f"prompt ({len(prompt)} tokens) + max_tokens ({max_tokens}) exceeds the model "
                             f"length ({self.max_model_len} tokens)")
        gen = FixedGeneration(request_id, arrival_ns, prompt, max_tokens, ttft_ns=self.ttft_ns,
                              itl_ns=self.itl_ns, stalls=self.stalls, sim_t0_ns=self.sim_t0_ns)
        self.live.add(gen)
        return gen

    metrics = None

    def state(self) -> dict:
        # Requests "running" (unlimited concurrency: none waits): submitted, not cancelled, their last token
        # not yet due; a request whose client went away counts until its end unless it was cancelled
        now = time.monotonic_ns()
        self.live = {g for g in self.live if not g.cancelled and g.due_of(max(0, g.max_tokens - 1)) > now}
        return {"running": len(self.live)}

    async def run(self) -> None:  # nothing to drive
        return None

    def close(self) -> None:
        pass
