"""Pacing the flush thread, so that the run's own bookkeeping never holds the event loop off for long.

The flush thread (inprocess.tick_work: the second's histograms, every 2 s a Parquet part) shares the GIL
with the event loop and, when the client is on one core, the core too. Done in one go, a part at 2,000
req/s is ~25 ms of CPU, during which the loop gets about half of the core in 50-µs turns (the GIL
switch interval): its backlog grows and sends go out milliseconds late. Measured against fastmock at
800 and 2,000 req/s x 16 tokens, one core: send lag p99 3.5 and 4.8 ms for requests due during a tick,
0.08 and 0.12 ms for all others (docs/scale-out.md).

A Pacer is called between small pieces of that work (a column, a metric, a few hundred rows): once the
thread has run SLICE_NS since its last pause, it sleeps PAUSE_S, leaving the GIL and the core to the loop.
So a tick keeps the loop at no less than ~PAUSE/(SLICE+PAUSE) of the core and holds it off for at most
about a slice plus one piece of work; the tick takes longer in wall time (it has a second). The longest
piece left is a part's Parquet encoding (Polars' own threads, without the GIL: a few ms at 2,000 req/s).
"""
from __future__ import annotations

import time

SLICE_NS = 200_000     # wall time the flush thread may run between pauses
PAUSE_S = 0.0008       # then it sleeps this long: <= 20 % of the core while it works


class Pacer:
    def __init__(self, slice_ns: int = SLICE_NS, pause_s: float = PAUSE_S):
        self.slice_ns, self.pause_s = slice_ns, pause_s
        self.pauses = 0
        self._since = time.perf_counter_ns()

    def __call__(self) -> None:
        """A point between two pieces of work: pause if this thread has run a slice since the last one."""
        if time.perf_counter_ns() - self._since >= self.slice_ns:
            time.sleep(self.pause_s)
            self.pauses += 1
            self._since = time.perf_counter_ns()

