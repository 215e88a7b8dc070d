"""The simulator's event loop and its precise absolute-deadline sleep.

All times are `time.monotonic_ns()` (CLOCK_MONOTONIC), the clock the client uses too.

epoll_wait (asyncio's default selector, and libuv under uvloop) takes its timeout in whole
milliseconds, so a timer fires up to ~1-2 ms late (uvloop also sometimes early). The simulator
must emit tokens at their due times to well under a millisecond, so it runs a plain asyncio loop
whose selector first waits on the epoll fd with select(2) (microsecond timeout), then collects
the ready events with a zero-timeout epoll_wait. `sleep_until_ns` wakes SPIN_NS before the due
time and spins the rest, so its lateness is the spin-loop granularity (a few microseconds) unless
the process is descheduled. The lateness actually achieved is measured at every emit and
exported (`loadgen_sim_emit_lateness_seconds`, truth column `lateness_ns`). One ticker task per
loop does the sleeping and spinning for all waiters (see _Ticker).
"""
from __future__ import annotations

import asyncio
import ctypes
import os
import select
import selectors
import time

from loadgen.deadlines import DeadlineHeap

# wake this early and spin the rest; costs up to ~SPIN_NS of CPU per wake-up
SPIN_NS = int(float(os.environ.get("LOADGEN_SIM_SPIN_US", "300")) * 1000)


class PreciseEpollSelector(selectors.EpollSelector):
    def select(self, timeout: float | None = None):  # timeout in seconds, as selectors expects
        if timeout is not None and timeout > 0:
            select.select([self._selector.fileno()], [], [], timeout)
            return super().select(0)
        return super().select(timeout)


def _reduce_timer_slack() -> None:
    # Linux adds 50 us of "timer slack" to every sleep of a normal thread; ask for 1 us.
    try:
        ctypes.CDLL(None).prctl(29, 1000, 0, 0, 0)  # PR_SET_TIMERSLACK, ns
    except (OSError, AttributeError):
        pass


def new_event_loop() -> asyncio.AbstractEventLoop:
    _reduce_timer_slack()
    return asyncio.SelectorEventLoop(PreciseEpollSelector())


class _Ticker:
    # One task serves every sleep_until_ns of a loop: it sleeps (precise select) until SPIN_NS
    # before the earliest due time, spins to it, releases every waiter whose time has come, then
    # yields so they run (stamp and write) before it spins for the next. One spinner, not one
    # per stream: waiters never queue behind each other's spins.
    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self.waiters = DeadlineHeap()   # the client's deadline machinery (loadgen/deadlines.py)
        self.wake: asyncio.Future | None = None
        self.task = loop.create_task(self.run())

    def add(self, due_ns: int) -> asyncio.Future:
        fut, earliest = self.waiters.add(self.loop, due_ns)
        if earliest and self.wake is not None and not self.wake.done():
            self.wake.set_result(None)  # a new earliest deadline: re-plan
        return fut

    async def run(self) -> None:
        while True:
            due = self.waiters.earliest()
            if due is None:
                self.wake = self.loop.create_future()
                await self.wake
                continue
            now = time.monotonic_ns()
            if due - now > SPIN_NS:
                self.wake = self.loop.create_future()
                handle = self.loop.call_at((due - SPIN_NS) / 1e9, _set_once, self.wake)
                await self.wake
                handle.cancel()
                continue
            while time.monotonic_ns() < due:
                pass
            self.waiters.release(time.monotonic_ns())
            await asyncio.sleep(0)


def _set_once(fut: asyncio.Future) -> None:
    if not fut.done():
        fut.set_result(None)


_tickers: dict[asyncio.AbstractEventLoop, _Ticker] = {}


async def sleep_until_ns(due_ns: int) -> None:
    """Return at (never before) monotonic time due_ns; an absolute deadline, so no drift."""
    if time.monotonic_ns() >= due_ns:
        return
    loop = asyncio.get_running_loop()
    ticker = _tickers.get(loop)
    if ticker is None or ticker.task.done():
        ticker = _tickers[loop] = _Ticker(loop)
    await ticker.add(due_ns)


async def stop_ticker() -> None:
    ticker = _tickers.pop(asyncio.get_running_loop(), None)
    if ticker is not None:
        ticker.task.cancel()
        try:
            await ticker.task
        except asyncio.CancelledError:
            pass
