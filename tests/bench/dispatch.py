"""Dispatch mechanisms compared: send lag and CPU per request of each clock, no I/O.

    python -m tests.bench.dispatch [RATE ...]      (env BENCH_DISPATCH_S: seconds per case, default 4)

Each case runs a Poisson schedule on a uvloop loop, stamping `now - deadline` after each wait, while a
background task wakes every 1 ms (standing in for stream reads, so the loop is not idle). CPU is the
process's user+sys time over the case, per request, minus nothing: compare cases with each other.
"""
from __future__ import annotations

import asyncio
import os
import sys
import time

import numpy as np
import uvloop

from loadgen.client.clock import SpinClock, TimerfdClock


class PlainClock:
    now_ns = staticmethod(time.monotonic_ns)

    async def sleep_until(self, deadline_ns: int) -> None:
        d = deadline_ns - time.monotonic_ns()
        if d > 0:
            await asyncio.sleep(d / 1e9)

    def close(self) -> None:
        pass


CLOCKS = {
    "asyncio.sleep (libuv ms timer)": PlainClock,
    "spin 1 ms + sleep(0)": lambda: SpinClock(1_000_000),
    "spin 200 us + sleep(0)": lambda: SpinClock(200_000),
    "timerfd, no spin": lambda: TimerfdClock(0),
    "timerfd + 20 us spin": lambda: TimerfdClock(20_000),
    "timerfd + 100 us spin": lambda: TimerfdClock(100_000),
}


async def _case(clock, rate: float, seconds: float) -> dict:
    n = int(rate * seconds)
    gaps = np.random.default_rng(1).exponential(1e9 / rate, n).astype(np.int64)
    t0 = time.monotonic_ns() + 50_000_000
    deadlines = t0 + np.cumsum(gaps)
    lag = np.empty(n, dtype=np.int64)
    stop = False

    async def background():
        while not stop:
            await asyncio.sleep(0.001)

    bg = asyncio.create_task(background())
    c0 = os.times()
    now = time.monotonic_ns
    for i, d in enumerate(deadlines.tolist()):
        await clock.sleep_until(d)
        lag[i] = now() - d
    c1 = os.times()
    stop = True
    await bg
    clock.close()
    cpu_s = (c1.user - c0.user) + (c1.system - c0.system)
    return {"rate": rate, "n": n, "lag_p50_us": float(np.percentile(lag, 50)) / 1e3,
            "lag_p99_us": float(np.percentile(lag, 99)) / 1e3, "lag_max_us": float(lag.max()) / 1e3,
            "cpu_us_per_req": cpu_s * 1e6 / n, "cpu_pct": 100 * cpu_s / (seconds)}


def measure(rates: list[float], seconds: float) -> list[dict]:
    out = []
    for name, make in CLOCKS.items():
        for rate in rates:
            r = asyncio.Runner(loop_factory=uvloop.new_event_loop).run(_case(make(), rate, seconds))
            r["clock"] = name
            out.append(r)
            print(f"{name:<32} {rate:>6.0f}/s  lag p50 {r['lag_p50_us']:8.1f} us  p99 {r['lag_p99_us']:8.1f} us"
                  f"  max {r['lag_max_us']:8.1f} us  cpu {r['cpu_us_per_req']:7.1f} us/req ({r['cpu_pct']:.0f}%)",
                  flush=True)
    return out


if __name__ == "__main__":
    rates = [float(a) for a in sys.argv[1:]] or [200.0, 1000.0]
    measure(rates, float(os.environ.get("BENCH_DISPATCH_S", "4")))
