"""Waiters for absolute deadlines (int64 ns of CLOCK_MONOTONIC), released in deadline order.

One heap serves every clock that wakes tasks at absolute times: the client's TimerfdClock (armed for the
earliest deadline) and the simulator's ticker (sleeps, then spins to it). Both add a waiter, learn
whether it became the earliest (re-arm / re-plan), and release every waiter that is due. A cancelled
waiter stays in the heap until it reaches the top, then is dropped.

A waiter is a future (a task awaits it: it resumes in a later loop pass) or a Call (a callback run by
release() itself, in the pass the clock fired in: the runner's dispatch, which must write before the loop
handles any other socket).
"""
from __future__ import annotations

import asyncio
import heapq
from collections.abc import Callable


class Call:
    """A callback as a heap waiter: release() runs it (set_result); cancel() before then drops it."""
    __slots__ = ("fn", "cancelled")

    def __init__(self, fn: Callable[[], None]):
        self.fn, self.cancelled = fn, False

    def done(self) -> bool:
        return self.cancelled

    def set_result(self, _: None) -> None:
        self.cancelled = True  # run once
        self.fn()

    def cancel(self) -> None:
        self.cancelled = True


class DeadlineHeap:
    def __init__(self) -> None:
        self._heap: list[tuple[int, int, asyncio.Future | Call]] = []   # (deadline ns, seq, waiter)
        self._seq = 0

    def add_call(self, deadline_ns: int, fn: Callable[[], None]) -> tuple[Call, bool]:
        """A Call that release() runs at deadline_ns, and whether it is now the earliest."""
        call = Call(fn)
        self._seq += 1
        heapq.heappush(self._heap, (deadline_ns, self._seq, call))
        return call, self._heap[0][2] is call

    def add(self, loop: asyncio.AbstractEventLoop, deadline_ns: int) -> tuple[asyncio.Future, bool]:
        """A future that release() completes at deadline_ns, and whether it is now the earliest."""
        fut = loop.create_future()
        self._seq += 1
        heapq.heappush(self._heap, (deadline_ns, self._seq, fut))
        return fut, self._heap[0][2] is fut

    def earliest(self) -> int | None:
        heap = self._heap
        while heap and heap[0][2].done():  # cancelled waiters
            heapq.heappop(heap)
        return heap[0][0] if heap else None

    def release(self, now_ns: int) -> int | None:
        """Complete every waiter due by now_ns (a Call runs here, and may add waiters: one due by now_ns runs
        too); return the next deadline (None when none is left)."""
        heap = self._heap
        while heap and heap[0][0] <= now_ns:
            fut = heapq.heappop(heap)[2]
            if not fut.done():
                fut.set_result(None)
        return self.earliest()
