"""The one clock: int64 ns of CLOCK_MONOTONIC (`time.monotonic_ns()`; the simulator stamps with it too).

Clock.sleep_until waits for an ABSOLUTE deadline, so waiting for request i never adds up the errors of
requests 0..i-1 (a chain of relative sleeps drifts). libuv (uvloop) rounds timers to whole ms, so the
real clock sleeps on the loop until `spin_ns` before the deadline, then yields to the loop in a tight
loop (other streams are still served) until the deadline passes.
LoopClock reads the event loop's own time: under the tests' virtual-time loop, time only moves when
every task waits, so schedules are exercised exactly with no real sleeping.
"""
from __future__ import annotations

import asyncio
import time


class Clock:
    def __init__(self, spin_ns: int = 1_000_000):
        self.spin_ns = spin_ns
        self.now_ns = time.monotonic_ns

    async def sleep_until(self, deadline_ns: int) -> None:
        now = time.monotonic_ns
        delay = deadline_ns - now() - self.spin_ns
        if delay > 0:
            await asyncio.sleep(delay / 1e9)
        while now() < deadline_ns:
            await asyncio.sleep(0)


class LoopClock:
    def __init__(self, loop: asyncio.AbstractEventLoop | None = None):
        self._loop = loop

    def now_ns(self) -> int:
        loop = self._loop or asyncio.get_running_loop()
        return round(loop.time() * 1e9)

    async def sleep_until(self, deadline_ns: int) -> None:
        delay = deadline_ns - self.now_ns()
        if delay > 0:
            await asyncio.sleep(delay / 1e9)
