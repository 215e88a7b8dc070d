"""Closed-loop load: N virtual users, each sending its next request when its previous reply
has ended (plus an optional think time), and the description of a run's load model for every report.

`--concurrency N` (run.concurrency): the rows are handed out in plan order; the first N are due at t0,
each later one is due when a user becomes free (its previous request done) + think_ns, and that due
time becomes the row's intended_ns. So ttft = first_token - intended measures from the moment the user
asked, and send_lag stays the generator's own lateness. Every row still yields exactly one outcome: a
failed request frees its user like a successful one.

`--rate inf` is the open-loop plan with every request due at t0; with `--max-concurrency N` requests
leave as fast as the cap allows (their slot wait is recorded and is part of ttft, which then measures
from t0). Both are closed loops in effect: the server's replies set the rate. Latency of a closed loop
is not comparable to an open-loop run's: a slow server receives less load instead of a growing queue.
"""
from __future__ import annotations

import asyncio
import math
from typing import Any

from loadgen.client.runner import Runner
from loadgen.config.workload import RunConfig

NOT_COMPARABLE = ("closed loop: the send rate follows the server's replies, so latency is not comparable "
                  "to an open-loop run at the same throughput (a slower server is offered less load)")


def load_model(config: RunConfig) -> dict[str, Any]:
    """The manifest's and the summary's `load` section."""
    if config.concurrency:
        return {"loop": "closed", "concurrency": config.concurrency, "think_ms": config.think_ns / 1e6,
                "note": NOT_COMPARABLE}
    if math.isinf(config.arrivals.rate_per_s):
        return {"loop": "closed", "rate": "inf", "max_concurrency": config.max_concurrency or None,
                "note": NOT_COMPARABLE + "; every request was due at t0, so ttft includes its wait for a slot"}
    return {"loop": "open", "max_concurrency": config.max_concurrency or None}


class ClosedLoopRunner(Runner):
    def __init__(self, *args: Any, users: int, think_ns: int = 0, **kw: Any):  # Runner's, and the users
        super().__init__(*args, **kw)
        self.users, self.think_ns = users, think_ns
        self._next = 0                       # next row to hand to a free user
        self._all_started = asyncio.Event()

    async def _dispatch(self) -> None:
        if not self.rows:
            self._all_started.set()
        else:
            await self.clock.sleep_until(self.rows[0].intended_ns)  # t0
            for _ in range(min(self.users, len(self.rows))):
                self._release(None)  # the first N: due at t0, as planned
        await self._all_started.wait()
        self._dispatch_done = True
        self._check_idle()

    def _on_done(self, task: asyncio.Task[None]) -> None:
        super()._on_done(task)
        if not self._idle.is_set():
            self._release(self.think_ns)

    def _release(self, think_ns: int | None) -> None:
        # A user is free: its next row is due think_ns from now (None: keep the row's planned time).
        if self._next >= len(self.rows):
            return
        i, self._next = self._next, self._next + 1
        if think_ns is not None:
            self.rows[i].intended_ns = self.clock.now_ns() + think_ns
        if not think_ns:
            self._start_last(i)
        else:
            timer = asyncio.create_task(self._start_after(i))
            self._turn_timers.add(timer)
            timer.add_done_callback(self._turn_timers.discard)

    async def _start_after(self, i: int) -> None:
        await self.clock.sleep_until(self.rows[i].intended_ns)
        self._start_last(i)

    def _start_last(self, i: int) -> None:
        self._start(i, 0)
        if self.dispatched == len(self.rows):  # counted by Runner._start
            self._all_started.set()
