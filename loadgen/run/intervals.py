"""Live HdrHistograms of a run: one `*.hlog` interval log per metric, one line per second, written as the
run goes (loadgen/results/hdr.py holds the format, the µs units and the out-of-range rule).

Contract:
- a request's samples (all its metrics) go into the interval in which the request FINISHED (its row was
  handed to the flusher); interval k covers [k s, (k+1) s) from t0; every interval is written, empty
  ones too, and the rows finished after the last full interval go into one last, shorter interval;
- the values are computed vectorized from the finished rows' buffers (one numpy pass per interval),
  never on the hot path;
- metrics, the rows each covers and the ITL rule come from loadgen/metrics.py, as for summary.json, so
  the histograms and the summary agree;
- warm-up rows are left out, as in the summary.
Called from a worker thread: it only reads rows that are finished (no longer touched by the loop).
"""
from __future__ import annotations

from collections.abc import Callable
from operator import attrgetter
from pathlib import Path

import numpy as np

from loadgen.results import hdr
from loadgen import metrics
from loadgen.client.recorder import OK, Row
from loadgen.results.folder import chunk_columns, no_pause
from loadgen.run.live import Tracker

INTERVAL_NS = 1_000_000_000


def metric_values_ns(rows: list[Row], pause: Callable[[], None] = no_pause) -> dict[str, np.ndarray]:
    """The samples (ns) of every metric over these finished rows (definitions: loadgen/metrics.py).
    Numpy, not a Polars frame: an interval holds a few rows, and Polars' fixed cost per query (~1.1 ms of the
    flush thread's CPU for a 5-row interval, against 54 µs now; docs/scale-out.md) was most of the work. Timestamps
    become float64: exact below 2**53 ns (104 days of uptime), within a few ns beyond, in µs histograms."""
    measured = [r for r in rows if not r.warmup]
    fields = {}
    for f, get in _GET.items():   # `pause` (run/pacing.py) between pieces: the flush thread holds the GIL
        fields[f] = np.array(list(map(get, measured)), dtype=np.float64)
        pause()
    values = metrics.values_ns(fields)
    ok = np.array([r.outcome == OK for r in measured], dtype=bool)
    pause()
    out = {}
    for m in _SCALAR:
        # a metric's nulls are dropped: a pooling answer (no first token, last_token_ns set) gives e2e only
        v = values[m]
        out[m] = v[~np.isnan(v) & ok] if metrics.ROWS[m] == "ok" else v[~np.isnan(v)]
    ok_rows = [r for r in measured if r.outcome == OK and r.first_token_ns is not None]
    pause()
    counts, t, k = chunk_columns(ok_rows)
    pause()
    if counts.sum():
        owner = np.repeat(np.arange(len(ok_rows)), counts)
        out["itl"] = metrics.itl_samples_ns(t, k, owner)  # each row's stamps are already in time order
        pause()
    else:
        out["itl"] = np.empty(0)
    return out


_SCALAR = tuple(m for m in hdr.METRICS if m != "itl")
_FIELDS = ("intended_ns", "dispatched_ns", "slot_wait_ns", "connected_ns", "first_token_ns", "last_token_ns",
           "output_tokens")
_GET = {f: attrgetter(f) for f in _FIELDS}


class LiveHistograms:
    def __init__(self, run_dir: str | Path, t0_ns: int, start_wall_s: float, tag: str | None = None,
                 worker: int | None = None):
        self.t0_ns = t0_ns
        self.writers = {m: hdr.IntervalLogWriter(hdr.log_path(run_dir, m, worker), start_wall_s=start_wall_s,
                                                 tag=tag)
                        for m in hdr.METRICS}
        self.totals = {m: hdr.Recorded(hdr.new_histogram(), 0) for m in hdr.METRICS}
        self._scratch = {m: hdr.new_histogram() for m in hdr.METRICS}  # one interval's, cleared and reused
        self.next_start_ns = 0   # from t0: where the next interval begins
        self.tracker: Tracker | None = None  # set when the run is watched live (live.py)

    def record_interval(self, rows: list[Row], end_ns: int, pause: Callable[[], None] = no_pause) -> None:
        """Write the interval [next_start, end_ns) (ns from t0) holding these rows' samples; `pause` is
        called between pieces of the work (run/pacing.py)."""
        start = self.next_start_ns
        end = max(end_ns, start)
        values = metric_values_ns(rows, pause) if rows else {}
        last = {}
        for m, w in self.writers.items():
            hist = self._scratch[m]
            hdr.clear(hist)
            rec = last[m] = hdr.Recorded(hist, hdr.record_ns(hist, values.get(m, np.empty(0, dtype=np.int64))))
            w.write_interval(start, end, rec)
            self.totals[m].add(rec)
            pause()
        self.next_start_ns = end
        if self.tracker is not None:
            self.tracker.interval(start, end, rows, values, last, self.totals)

    def close(self) -> dict[str, dict]:
        for w in self.writers.values():
            w.close(fsync=True)
        return self.summary()

    def summary(self) -> dict[str, dict]:
        """Every metric's totals over the intervals recorded so far (hdr.summary_ms)."""
        return {m: hdr.summary_ms(rec) for m, rec in self.totals.items()}
