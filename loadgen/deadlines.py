"""Waiters for absolute deadlines (int64 ns of CLOCK_MONOTONIC), released in deadline order.

One heap serves every clock that wakes tasks at absolute times: the client's TimerfdClock (armed for the
earliest deadline) and the simulator's ticker (sleeps, then spins to it). Both add a waiter, learn
whether it became the earliest (re-arm / re-plan), and release every waiter that is due. A cancelled
waiter stays in the heap until it reaches the top, then is dropped.
"""
from __future__ import annotations

import asyncio
import heapq


class DeadlineHeap:
    def __init__(self) -> None:
        self._heap: list[tuple[int, int, asyncio.Future]] = []   # (deadline ns, seq, future)
        self._seq = 0

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
        """Complete every waiter due by now_ns; return the next deadline (None when none is left)."""
        heap = self._heap
        while heap and heap[0][0] <= now_ns:
            fut = heapq.heappop(heap)[2]
            if not fut.done():
                fut.set_result(None)
        return self.earliest()
