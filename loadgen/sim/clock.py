"""The simulator's event loop and its precise absolute-deadline sleep.

All times are `time.monotonic_ns()` (CLOCK_MONOTONIC), the clock the client uses too.

epoll_wait (asyncio's default selector, and libuv under uvloop) takes its timeout in whole
milliseconds, so a timer fires up to ~1-2 ms late (uvloop also sometimes early). The simulator
must emit tokens at their due times to well under a millisecond, so it runs a plain asyncio loop
whose selector first waits on the epoll fd with select(2) (microsecond timeout), then collects
the ready events with a zero-timeout epoll_wait. `sleep_until_ns` wakes SPIN_NS before the due
time and spins the rest, so its lateness is the spin-loop granularity (a few microseconds) unless
the process is descheduled. The lateness actually achieved is measured at every emit and
exported (`loadgen_sim_emit_lateness_seconds`, truth column `lateness_ns`).
"""
from __future__ import annotations

import asyncio
import ctypes
import select
import selectors
import time

SPIN_NS = 300_000  # wake this early and spin the rest; bounds CPU cost to ~SPIN_NS per wake-up


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


async def sleep_until_ns(due_ns: int) -> None:
    """Return at (never before) monotonic time due_ns; an absolute deadline, so no drift."""
    now = time.monotonic_ns()
    if due_ns - now > SPIN_NS:
        await asyncio.sleep((due_ns - SPIN_NS - now) / 1e9)
    while time.monotonic_ns() < due_ns:
        pass
