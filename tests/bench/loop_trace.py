"""Where the client's tail comes from (issue 29): loadgen's event-loop iterations and GIL holds during a run.

    python -m tests.bench.loop_trace                  rates 100, 400, 800 req/s x 64 tokens, 10 s each
    LOOP_TRACE_RATES=800 LOOP_TRACE_S=5 python -m tests.bench.loop_trace

Runs `loadgen run` in this process (pinned to BENCH_CLIENT_CORE, default 0) against a fresh server of fixed
timing (TTFT 20 ms, ITL 5 ms: bench_fast.server(), fastmock where gcc builds it) pinned to BENCH_SIM_CORE
(default 1), as bench_fast does,
with three instruments that exist only here (they perturb what they measure, a little, and say by how much):

- Loop iterations: every SAMPLE_EVERY_MS the loop runs, for CHAIN_MS, a chain of `call_soon` callbacks,
  each scheduling the next; a callback runs once per iteration, so the time between two hops is one whole
  iteration (the ready callbacks, a poll that does not block because the next hop is ready, the I/O
  callbacks and timers). Its histogram is the iteration durations of the loop, not its idle waits (an
  iteration with nothing to do takes ~1 µs: the median). The chains keep the loop polling instead of
  sleeping for CHAIN_MS of every SAMPLE_EVERY_MS (the duty printed).
- GIL holds: a thread that sleeps MONITOR_MS and records how late it wakes. It needs the GIL to wake, so a
  wake later than the sleep is the time some thread (the loop's, the flush thread) held the GIL plus the
  kernel's wake-up; wakes later than STACK_MS keep every other thread's innermost frame (what ran).
- The flush thread's ticks (run/inprocess.tick_work: the second's histograms, every 2 s a Parquet part):
  their wall time and their own CPU time.

Each run also prints the send lag p99 of the requests due while a flush tick ran and of all the others:
where the client's tail comes from (run/pacing.py says why it is no longer the ticks).

The numbers are what the issue asks for: the iteration histogram and the longest GIL hold bound the time
heavy work can hold the loop off. See tests/bench/README.md for the figures.
"""
from __future__ import annotations

import asyncio
import collections
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import orjson
import polars as pl

from loadgen.client.runner import Runner
from loadgen.cli.main import main as loadgen_main
from loadgen.run import inprocess
from tests.bench.bench_fast import start_sim, tokenizer_args, workload

SAMPLE_EVERY_MS = 10.0
CHAIN_MS = 1.0
MONITOR_MS = 0.5
STACK_MS = 2.0
LONG_MS = 1.0       # iterations longer than this are told apart: during a flush tick or not
BOUNDS_MS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0)   # histogram bucket upper bounds; the last is open


class Trace:
    def __init__(self, chains: bool):
        self.chains = chains                   # this run samples loop iterations (else: GIL holds only)
        self.iterations_ns: list[int] = []
        self.chain_ns = 0                      # time the chains kept the loop polling
        self.late_ns: list[int] = []           # monitor wake lateness
        self.stacks: list[tuple[float, float, dict[str, str]]] = []   # (s since t0, late ms, thread -> stack)
        self.ticks: list[tuple[int, int, int]] = []  # per flush tick: start, end (perf_counter ns), own CPU ns
        self.long: list[tuple[int, int]] = []        # (start perf_counter ns, ns) of iterations over LONG_MS
        self.t0_ns = 0
        self.running = False

    async def iterations(self) -> None:
        while True:
            await asyncio.sleep(SAMPLE_EVERY_MS / 1e3)
            stamps = await chain(asyncio.get_running_loop(), CHAIN_MS * 1e6)
            self.iterations_ns.extend(np.diff(stamps).tolist())
            self.long.extend((a, b - a) for a, b in zip(stamps, stamps[1:]) if b - a > LONG_MS * 1e6)
            self.chain_ns += stamps[-1] - stamps[0]

    def monitor(self) -> None:
        me = threading.get_ident()
        period_ns = int(MONITOR_MS * 1e6)
        while self.running:
            t = time.perf_counter_ns()
            time.sleep(MONITOR_MS / 1e3)
            late = time.perf_counter_ns() - t - period_ns
            self.late_ns.append(late)
            if late > STACK_MS * 1e6:
                # each other thread's innermost frame, without reading source files (that would be slow)
                names = {th.ident: th.name for th in threading.enumerate()}
                tops = {names.get(i, str(i)): f"{Path(f.f_code.co_filename).name}:{f.f_lineno} {f.f_code.co_name}"
                        for i, f in sys._current_frames().items() if i != me}
                self.stacks.append(((t - self.t0_ns) / 1e9, late / 1e6, tops))


def chain(loop: asyncio.AbstractEventLoop, span_ns: float) -> asyncio.Future:
    """call_soon hops, each scheduling the next, for span_ns: a future of their stamps (one per iteration)."""
    done: asyncio.Future = loop.create_future()
    stamps: list[int] = []

    def hop() -> None:
        stamps.append(time.perf_counter_ns())
        if stamps[-1] - stamps[0] < span_ns:
            loop.call_soon(hop)
        elif not done.done():   # (cancelled when the run ended)
            done.set_result(stamps)
    loop.call_soon(hop)
    return done


def install() -> list[Trace]:
    """Wrap Runner.run (the measured part of a run) and tick_work (the flush thread's tick), once; each run
    traces into the last Trace of the list returned."""
    run, tick, traces = Runner.run, inprocess.tick_work, [Trace(chains=False)]

    async def traced_run(self, *a, **k):
        trace = traces[-1]
        trace.t0_ns, trace.running = time.perf_counter_ns(), True
        task = asyncio.create_task(trace.iterations()) if trace.chains else None
        if not trace.chains:
            threading.Thread(target=trace.monitor, name="monitor", daemon=True).start()
        try:
            return await run(self, *a, **k)
        finally:
            trace.running = False
            if task is not None:
                task.cancel()

    def traced_tick(*a, **k):
        trace = traces[-1]
        w, c = time.perf_counter_ns(), time.thread_time_ns()
        try:
            return tick(*a, **k)
        finally:
            trace.ticks.append((w, time.perf_counter_ns(), time.thread_time_ns() - c))

    Runner.run, inprocess.tick_work = traced_run, traced_tick
    return traces


def histogram(values_ns: list[int]) -> str:
    ms = np.asarray(values_ns, dtype=np.float64) / 1e6
    edges = [0.0, *BOUNDS_MS, np.inf]
    counts = np.histogram(ms, bins=edges)[0]
    return "  ".join(f"<={b:g}:{c}" if np.isfinite(b) else f">{edges[-2]:g}:{c}" for b, c in zip(edges[1:], counts))


def quantiles(values_ns: list[int]) -> str:
    ms = np.asarray(values_ns, dtype=np.float64) / 1e6
    if not ms.size:
        return "none"
    p50, p99, p999 = np.quantile(ms, (0.5, 0.99, 0.999))
    return f"n {ms.size}  p50 {p50:.3f}  p99 {p99:.3f}  p99.9 {p999:.3f}  max {ms.max():.3f} ms"


def send_lag_by_tick(run: Path, trace: Trace) -> str:
    """Send lag (dispatched - intended) p99 of the requests due while the flush thread worked, and of the
    rest: where the tail comes from. perf_counter and CLOCK_MONOTONIC are one clock on Linux."""
    m = orjson.loads((run / "manifest.json").read_bytes())
    req = pl.read_parquet(run / "requests.parquet").filter(pl.col("dispatched_ns").is_not_null())
    due = req["intended_ns"].to_numpy() + m["t0"]["monotonic_ns"]
    lag_ms = (req["dispatched_ns"] - req["intended_ns"]).to_numpy() / 1e6
    ticks = np.array([(a, b) for a, b, _ in trace.ticks], dtype=np.int64).reshape(-1, 2)
    inside = ((due[:, None] >= ticks[:, 0]) & (due[:, None] <= ticks[:, 1])).any(axis=1)
    parts = [f"{np.quantile(lag_ms[sel], 0.99):.3f} ms (n {sel.sum()})" if sel.any() else "none"
             for sel in (inside, ~inside)]
    return " / ".join(parts)


def one_rate(trace: Trace, rate: float, seconds: float, tokens: int) -> None:
    with tempfile.TemporaryDirectory(prefix="looptrace-") as d:
        tmp = Path(d)
        sim = start_sim(tmp / "truth.jsonl", os.environ.get("BENCH_SIM_CORE", "1"))
        try:
            w = workload(tmp / "w.toml", rate, seconds, tokens)
            rc = loadgen_main(["run", str(w), "--url", sim.url, "--out", str(tmp / "run"), "--quiet",
                               *tokenizer_args()])
        finally:
            sim.stop()
        lag = send_lag_by_tick(tmp / "run", trace)
    print(f"\n{rate:g} req/s x {tokens} tokens, {seconds:g} s (loadgen exit {rc})")
    print(f"  send lag p99, requests due during a flush tick / all others: {lag}")
    if trace.chains:
        print(f"  loop iterations (sampled {CHAIN_MS:g} ms of every {SAMPLE_EVERY_MS:g} ms: the loop kept polling "
              f"{trace.chain_ns / 1e9 / seconds:.1%} of the run): {quantiles(trace.iterations_ns)}")
        print(f"    ms buckets: {histogram(trace.iterations_ns)}")
        during = sum(any(a < end and a + d > start for start, end, _ in trace.ticks) for a, d in trace.long)
        at = [(round((a - trace.t0_ns) / 1e9, 3), round(d / 1e6, 2)) for a, d in trace.long]
        print(f"    over {LONG_MS:g} ms: {len(trace.long)}, of which during a flush tick: {during}; "
              f"(s since the run began, ms): {at}")
    else:
        print(f"  GIL holds (a {MONITOR_MS:g}-ms sleeper's lateness; no iteration sampling in this run): "
              f"{quantiles(trace.late_ns)}")
        print(f"    ms buckets: {histogram(trace.late_ns)}")
        print(f"  wakes later than {STACK_MS:g} ms (s since the run began, ms): "
              f"{[(round(at, 3), round(late, 1)) for at, late, _ in trace.stacks][:30]}")
        held = collections.Counter(f"{name}: {top}" for _, _, tops in trace.stacks for name, top in tops.items()
                                   if not name.startswith("Thread-"))   # the simulator's stderr relays: idle
        for where, n in held.most_common(10):
            print(f"    {n}x {where}")
    if trace.ticks:
        start, end, cpu_ns = np.array(trace.ticks, dtype=np.float64).T
        wall, cpu = (end - start) / 1e6, cpu_ns / 1e6
        print(f"  flush ticks: {len(wall)}, wall median {np.median(wall):.2f} max {wall.max():.2f} ms, own CPU "
              f"median {np.median(cpu):.2f} max {cpu.max():.2f} ms")


def main() -> None:
    os.sched_setaffinity(0, {int(os.environ.get("BENCH_CLIENT_CORE", "0"))})
    rates = [float(x) for x in os.environ.get("LOOP_TRACE_RATES", "100,400,800").split(",") if x]
    seconds = float(os.environ.get("LOOP_TRACE_S", "10"))
    tokens = int(os.environ.get("LOOP_TRACE_TOKENS", "64"))
    traces = install()
    for rate in rates:
        for chains in (True, False):
            traces.append(Trace(chains))
            one_rate(traces[-1], rate, seconds, tokens)


if __name__ == "__main__":
    main()
