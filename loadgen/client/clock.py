"""The one clock: int64 ns of CLOCK_MONOTONIC (`time.monotonic_ns()`; the simulator stamps with it too).

Every wait is for an ABSOLUTE deadline, so waiting for request i never adds up the errors of
requests 0..i-1 (a chain of relative sleeps drifts).

libuv (uvloop) rounds timers to whole ms, so `asyncio.sleep` alone is up to ~1-2 ms late. Measured
alternatives (tests/bench/dispatch.py, numbers in tests/bench/README.md):
- SpinClock: sleep on the loop to `spin_ns` before the deadline, then yield to the loop in a tight
  loop (`asyncio.sleep(0)`) until it passes. Precise, but each request burns up to spin_ns of CPU.
- TimerfdClock (the default on Linux): one timerfd armed with the earliest absolute CLOCK_MONOTONIC deadline
  (TFD_TIMER_ABSTIME) and registered with the loop through `add_reader`: the kernel wakes the loop
  at the deadline (timer slack set to 1 µs), then a short spin (`spin_ns`, default 100 µs) absorbs the
  wake-up latency. One settime syscall and one read per request instead of ~1 ms of spinning.
call_at(deadline_ns, fn) runs fn at the deadline from the clock's own wake-up, for the runner's dispatch: on
the timerfd, in the loop pass the timer fires in (no spin: ABSTIME never fires early, and the wake-up
latency, ~10-60 µs, is the request's send lag), so the request is written before the loop handles any
other ready socket; a task woken there resumes only a pass later, after every ready read (at 2,000 req/s
x 16 tokens that pass cost the Poisson shape its tail: docs/scale-out.md).
LoopClock reads the event loop's own time: under the tests' virtual-time loop, time only moves when
every task waits, so schedules are exercised exactly with no real sleeping.
"""
from __future__ import annotations

import asyncio
import ctypes
import os
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from loadgen.deadlines import DeadlineHeap


class Cancellable(Protocol):
    def cancel(self) -> object: ...


async def _call_after(clock: "Clock", deadline_ns: int, fn: Callable[[], None]) -> None:
    await clock.sleep_until(deadline_ns)
    fn()

CLOCK_MONOTONIC = 1
TFD_NONBLOCK = 0o4000
TFD_CLOEXEC = 0o2000000
TFD_TIMER_ABSTIME = 1
PR_SET_TIMERSLACK = 29


class SpinClock:
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

    def call_at(self, deadline_ns: int, fn: Callable[[], None]) -> Cancellable:
        return asyncio.ensure_future(_call_after(self, deadline_ns, fn))

    def close(self) -> None:
        pass


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


class TimerfdClock:
    """One timerfd for all waiters of a run (the dispatch loop and, with sessions, each next-turn timer):
    a heap of wake-up times; the timerfd is always armed for the earliest one."""

    def __init__(self, spin_ns: int = 100_000):
        self.spin_ns = spin_ns
        self.now_ns = time.monotonic_ns
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_TIMERSLACK, 1000, 0, 0, 0)  # Linux adds 50 µs of slack to sleeps by default
        self._settime = libc.timerfd_settime
        self._fd = libc.timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC)
        if self._fd < 0:
            raise OSError(ctypes.get_errno(), "timerfd_create failed")
        self._spec = _Itimerspec()
        self._spec_ref = ctypes.byref(self._spec)
        self._waiters = DeadlineHeap()
        self._armed_ns = 0
        self._loop: asyncio.AbstractEventLoop | None = None

    def _arm(self, wake_ns: int) -> None:
        self._armed_ns = wake_ns
        self._spec.it_value.tv_sec, self._spec.it_value.tv_nsec = divmod(wake_ns, 1_000_000_000)
        self._settime(self._fd, TFD_TIMER_ABSTIME, self._spec_ref, None)

    def _fired(self) -> None:
        try:
            os.read(self._fd, 8)
        except BlockingIOError:
            pass
        nxt = self._waiters.release(time.monotonic_ns())
        if nxt is not None:
            self._arm(nxt)
        else:
            self._armed_ns = 0

    async def sleep_until(self, deadline_ns: int) -> None:
        now = time.monotonic_ns
        wake_ns = deadline_ns - self.spin_ns
        if wake_ns - now() > 0:
            loop = asyncio.get_running_loop()
            if self._loop is not loop:
                loop.add_reader(self._fd, self._fired)
                self._loop = loop
            fut, earliest = self._waiters.add(loop, wake_ns)
            if earliest:  # (re-)arm for it
                self._arm(wake_ns)
            await fut
        while now() < deadline_ns:
            await asyncio.sleep(0)

    def call_at(self, deadline_ns: int, fn: Callable[[], None]) -> Cancellable:
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            loop.add_reader(self._fd, self._fired)
            self._loop = loop
        call, earliest = self._waiters.add_call(deadline_ns, fn)
        if earliest:
            self._arm(deadline_ns)
        return call

    def close(self) -> None:
        if self._fd >= 0:
            if self._loop is not None and not self._loop.is_closed():
                self._loop.remove_reader(self._fd)
            os.close(self._fd)
            self._fd = -1


class Clock(Protocol):
    """What the runner, the transports and run/inprocess.py take: now in int64 ns, and waits for absolute
    deadlines. TimerfdClock and SpinClock are real; LoopClock follows the (virtual-time) event loop."""

    def now_ns(self) -> int: ...

    async def sleep_until(self, deadline_ns: int) -> None: ...

    def call_at(self, deadline_ns: int, fn: Callable[[], None]) -> Cancellable:
        """Run fn() at (or just after) deadline_ns, from the clock's own wake-up; cancel() before then drops it."""

    def close(self) -> None: ...


def make_clock(kind: str = "timerfd") -> Clock:
    # The real clock for runs: timerfd where the kernel has it, else the spin clock.
    if kind == "timerfd" and sys.platform.startswith("linux"):
        try:
            return TimerfdClock()
        except (OSError, AttributeError):
            pass
    return SpinClock()


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

    def call_at(self, deadline_ns: int, fn: Callable[[], None]) -> Cancellable:
        return asyncio.ensure_future(_call_after(self, deadline_ns, fn))

    def close(self) -> None:
        pass


if TYPE_CHECKING:  # the type checker holds every clock to the contract (no runtime cost)
    def _is_clock(c: SpinClock | TimerfdClock | LoopClock) -> Clock:
        return c
