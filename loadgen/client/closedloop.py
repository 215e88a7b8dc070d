"""Closed-loop load: N virtual users, each sending its next request when its previous reply
has ended (plus an optional think time), and the description of a run's load model for every report.

`--concurrency N` (run.concurrency): the rows are handed out in plan order; the first N are due at t0,
each later one is due when a user becomes free (its previous request done) + think_ns, and that due
time becomes the row's intended_ns. So ttft = first_token - intended measures from the moment the user
asked, and send_lag stays the generator's own lateness. Every row still yields exactly one outcome: a
failed request frees its user like a successful one.

Bounded by a duration (`--duration D`, k6's constant-vus): the rows are a pool (plan/pool.py) and the
run ends at deadline_ns = t0 + D: a user whose next request would be due after it stops, and so does one
whose timer (think time) wakes after it; no request is dispatched after the deadline (the start is judged
by the dispatch stamp itself). Requests in flight at the deadline finish, bounded by the drain timeout.
The rows a user took and started are the run's; the rest of the pool (never taken, or taken but caught
by the deadline before their start) is not: `unreached()` lists them and they yield no row. After
SIGINT/SIGTERM a taken row still waiting for its think time is `cancelled`, as any unstarted row. A user
that finds the pool empty before the deadline stops too: `exhausted_ns` records when the first one did
(the run then ends early, and says so).

`--rate inf` is the open-loop plan with every request due at t0; with `--max-concurrency N` requests
leave as fast as the cap allows (their slot wait is recorded and is part of ttft, which then measures
from t0). Both are closed loops in effect: the server's replies set the rate. Latency of a closed loop
is not comparable to an open-loop run's: a slow server receives less load instead of a growing queue.
"""
from __future__ import annotations

import asyncio
import math
from typing import Any

from loadgen.client.recorder import Row
from loadgen.client.runner import Runner
from loadgen.config.workload import RunConfig
from loadgen.plan.pool import is_pooled

NOT_COMPARABLE = ("closed loop: the send rate follows the server's replies, so latency is not comparable "
                  "to an open-loop run at the same throughput (a slower server is offered less load)")


def load_model(config: RunConfig) -> dict[str, Any]:
    """The manifest's and the summary's `load` section; a closed loop's says its bound: `bound` "requests"
    (with `requests`) or "duration" (with `duration_s`: no request started after t0 + duration_s)."""
    if config.concurrency:
        bound: dict[str, Any] = ({"bound": "duration", "duration_s": config.duration_ns / 1e9}
                                 if is_pooled(config) and config.duration_ns is not None
                                 else {"bound": "requests", "requests": config.requests})
        return {"loop": "closed", "concurrency": config.concurrency, "think_ms": config.think_ns / 1e6,
                **bound, "note": NOT_COMPARABLE}
    if math.isinf(config.arrivals.rate_per_s):
        return {"loop": "closed", "rate": "inf", "max_concurrency": config.max_concurrency or None,
                "bound": "requests", "requests": config.requests,
                "note": NOT_COMPARABLE + "; every request was due at t0, so ttft includes its wait for a slot"}
    return {"loop": "open", "max_concurrency": config.max_concurrency or None}


class ClosedLoopRunner(Runner):
    def __init__(self, *args: Any, users: int, think_ns: int = 0, deadline_ns: int | None = None,
                 **kw: Any):  # Runner's, the users, and the deadline of a duration-bounded loop (absolute ns)
        super().__init__(*args, **kw)
        self.users, self.think_ns, self.deadline_ns = users, think_ns, deadline_ns
        self._next = 0                       # next row to hand to a free user
        self._all_started = asyncio.Event()  # requests: every row dispatched; duration: every user stopped
        self._active = 0                     # users still sending
        self._closed = False                 # the deadline has passed: no user starts another request
        self._thinking: dict[asyncio.Task[None], int] = {}  # think-time timer -> its row, until it starts
        self._refused: set[int] = set()      # rows taken but caught by the deadline before their start
        self.exhausted_ns: int | None = None  # when a user first found the pool empty before the deadline

    async def _dispatch(self) -> None:
        if not self.rows:
            self._all_started.set()
        else:
            await self.clock.sleep_until(self.rows[0].intended_ns)  # t0
            self._active = min(self.users, len(self.rows))
            for _ in range(self._active):
                self._release(None)  # the first N: due at t0, as planned
        if self.deadline_ns is not None:
            await self._until_deadline(self.deadline_ns)
        await self._all_started.wait()
        self._dispatch_done = True
        self._check_idle()

    async def _until_deadline(self, deadline_ns: int) -> None:
        # The deadline, or every user stopped before it (the pool used up), whichever comes first.
        waits = {asyncio.create_task(self.clock.sleep_until(deadline_ns)),
                 asyncio.create_task(self._all_started.wait())}
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()
            await asyncio.gather(*waits, return_exceptions=True)
        self._closed = True
        for timer, i in list(self._thinking.items()):  # still thinking at the deadline: not started in time
            timer.cancel()
            self._refused.add(i)
        self._thinking.clear()
        self._all_started.set()

    def _on_done(self, task: asyncio.Task[None]) -> None:
        super()._on_done(task)
        if not self._idle.is_set():
            self._release(self.think_ns)

    def _release(self, think_ns: int | None) -> None:
        # A user is free: its next row is due think_ns from now (None: keep the row's planned time, t0).
        now_ns = self.clock.now_ns()
        due_ns = now_ns + (think_ns or 0)
        if self._closed or (self.deadline_ns is not None and due_ns > self.deadline_ns):
            self._user_stopped()
            return
        if self._next >= len(self.rows):
            if self.deadline_ns is not None and self.exhausted_ns is None:
                self.exhausted_ns = now_ns
            self._user_stopped()
            return
        i, self._next = self._next, self._next + 1
        if think_ns is not None:
            self.rows[i].intended_ns = due_ns
        if not think_ns:
            self._start_last(i, now_ns)
        else:
            timer = asyncio.create_task(self._start_after(i))
            self._thinking[timer] = i
            self._turn_timers.add(timer)
            timer.add_done_callback(self._turn_timers.discard)

    async def _start_after(self, i: int) -> None:
        await self.clock.sleep_until(self.rows[i].intended_ns)
        del self._thinking[asyncio.current_task()]  # type: ignore[arg-type]  # always in its task
        now_ns = self.clock.now_ns()
        if self.deadline_ns is not None and now_ns > self.deadline_ns:  # woken too late to start in time
            self._refused.add(i)
            self._user_stopped()
            return
        self._start_last(i, now_ns)

    def _start_last(self, i: int, now_ns: int) -> None:
        self._start(i, 0, now_ns)
        if self.deadline_ns is None and self.dispatched == len(self.rows):  # counted by Runner._start
            self._all_started.set()

    def _user_stopped(self) -> None:
        self._active -= 1
        if self._active <= 0:
            self._all_started.set()

    def _in_run(self, i: int) -> bool:
        # bounded by requests, every row is the run's (one not yet taken at a stop is cancelled)
        return self.deadline_ns is None or (i < self._next and i not in self._refused)

    def unreached(self) -> list[Row]:
        """The pool's rows that are not the run's (module docstring): never taken, or caught by the deadline."""
        if self.deadline_ns is None:
            return []
        return [self.rows[i] for i in (*sorted(self._refused), *range(self._next, len(self.rows)))]
