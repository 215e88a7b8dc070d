"""The run as it goes: one Snapshot per second for whoever watches it live (the terminal view, `--metrics-port`).

Contract:
- a Snapshot is built in the flush thread right after the interval's histograms are recorded
  (inprocess.tick_work -> Tracker.interval), from what that thread already holds: the interval's samples
  (intervals.metric_values_ns, the same definitions as summary.json), the run's totals histograms, the
  rows finished in the interval, and counters the event loop keeps (ints read without a lock: a stale
  read is at most one tick old). Nothing is added to the event loop's path; without a watcher no
  Tracker exists and nothing is computed.
- its figures cover the measured rows (warm-up rows are left out, as in the summary), but the counts of
  finished rows (`outcomes`) count every row, warm-up included, as the progress line does;
- `Feed` holds the latest Snapshot; a watcher reads it from its own thread (`Feed.wait`). A Snapshot is
  immutable once published. `Feed.about` says which run it is (run_id, workload, target, model: the
  launcher sets it before the run's first Snapshot; {} until then and for runs that publish nothing).
- units: `_s` seconds, `_ms` milliseconds; histogram buckets are Prometheus-style cumulative counts with
  upper bounds in seconds (BUCKETS_S, the one owner of the bucket bounds).
"""
from __future__ import annotations

import threading
from array import array
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from loadgen import metrics
from loadgen.results import hdr

# Upper bounds (s) of the cumulative buckets kept per metric (`le` of a Prometheus histogram; +Inf implied).
_LATENCY_S = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 7.5,
              10.0, 20.0, 30.0, 60.0, 120.0)
_TOKEN_S = (0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5,
            0.75, 1.0, 2.5, 5.0)
_LAG_S = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
BUCKETS_S: dict[str, tuple[float, ...]] = {"send_lag": _LAG_S, "ttft": _LATENCY_S, "ttft_from_send": _LATENCY_S,
                                           "itl": _TOKEN_S, "tpot": _TOKEN_S, "e2e": _LATENCY_S}


@dataclass(frozen=True)
class Window:
    """One metric over a stretch of the run (ms); the quantiles are None when count is 0."""
    count: int
    p50_ms: float | None
    p99_ms: float | None
    max_ms: float | None

    @classmethod
    def of(cls, rec: hdr.Recorded) -> Window:
        # the summary's percentiles (hdr.percentiles_us, as summary_ms), without its mean: the mean walks
        # every bucket in Python (~2.4 ms a histogram, 12 of them a second in the flush thread, measured)
        hist = rec.hist
        count = hist.get_total_count()
        if not count:
            return cls(0, None, None, None)
        p = hdr.percentiles_us(hist, (50.0, 99.0))
        return cls(count, p[50.0] / 1000.0, p[99.0] / 1000.0, hist.get_max_value() / 1000.0)


@dataclass(frozen=True)
class Buckets:
    """A Prometheus histogram of one metric over the run so far: cumulative counts per upper bound."""
    upper_s: tuple[float, ...]
    cumulative: tuple[int, ...]    # samples <= upper_s[i]
    count: int                     # every sample (the +Inf bucket)
    sum_s: float


@dataclass(frozen=True)
class Snapshot:
    t_s: float                      # end of the interval, s from t0
    interval_s: float               # its length
    planned: int | None             # rows the run scheduled (None: a duration-bounded closed loop's pool)
    due: int                        # of them, those whose intended send time has passed by t_s
    sent: int                       # dispatched so far
    in_flight: int
    outcomes: dict[str, int]        # finished rows so far per outcome (warm-up included)
    output_tokens: int              # output tokens of the rows finished so far (measured rows)
    last: dict[str, Window]         # per metric (hdr.METRICS): the interval's samples
    run: dict[str, Window]          # per metric: the run's so far
    buckets: dict[str, Buckets]     # per metric: the run's so far
    loop_lateness_p99_ms: float | None  # the event loop's timer lateness over the interval
    server: dict[str, float] = field(default_factory=dict)  # the latest scraped gauges (probe/scrape.py)

    @property
    def finished(self) -> int:
        return sum(self.outcomes.values())

    @property
    def failed(self) -> int:
        return sum(n for o, n in self.outcomes.items() if o not in ("ok", "cancelled", "abandoned"))


class Feed:
    """The latest Snapshot of a run; published by the flush thread, read by watchers in their own threads."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self.latest: Snapshot | None = None
        self.closed = False
        self.about: dict[str, str] = {}   # the run's identity (run_id, workload, target, model); replaced whole

    def describe(self, **about: str) -> None:
        """Which run this feed is (set by the launcher once the target and the run id are known)."""
        self.about = dict(about)

    def publish(self, snap: Snapshot) -> None:
        with self._cond:
            self.latest = snap
            self._cond.notify_all()

    def close(self) -> None:
        """The run has ended: the last Snapshot is final; waiters return."""
        with self._cond:
            self.closed = True
            self._cond.notify_all()

    def wait(self, newer_than_s: float | None, timeout_s: float) -> Snapshot | None:
        """The latest Snapshot once one newer than `newer_than_s` exists (or the feed closed, or the timeout)."""
        with self._cond:
            self._cond.wait_for(lambda: self.closed or (self.latest is not None and (
                newer_than_s is None or self.latest.t_s > newer_than_s)), timeout=timeout_s)
            return self.latest


class Tracker:
    """Builds the Snapshots of one process's run (in the flush thread) and publishes them to a Feed.

    `counters()` returns (sent, in_flight) as the event loop keeps them; `due_ns` are the planned rows'
    intended send times (ns from t0, any order), None for a closed loop (a request is due when a user
    sends it: due = sent); `lateness_ns` is the loop probe's array (appended by the
    loop: only its length at the time of reading is used); `gauges()` the latest scraped server gauges."""

    def __init__(self, feed: Feed, planned: int | None, due_ns: np.ndarray | None,
                 counters: Callable[[], tuple[int, int]], lateness_ns: array,
                 gauges: Callable[[], dict[str, float]] = dict):
        self.feed, self.planned = feed, planned
        self.due_ns = None if due_ns is None else np.sort(np.asarray(due_ns, dtype=np.int64))
        self.counters, self.lateness_ns, self.gauges = counters, lateness_ns, gauges
        self.outcomes: Counter[str] = Counter()
        self.output_tokens = 0
        self._lateness_seen = 0
        self._below = {m: np.zeros(len(b), dtype=np.int64) for m, b in BUCKETS_S.items()}
        self._count = dict.fromkeys(BUCKETS_S, 0)
        self._sum_s = dict.fromkeys(BUCKETS_S, 0.0)

    def interval(self, start_ns: int, end_ns: int, rows: list, values_ns: dict[str, np.ndarray],
                 last: dict[str, hdr.Recorded], totals: dict[str, hdr.Recorded]) -> Snapshot:
        """The Snapshot at the end of the interval [start_ns, end_ns) (ns from t0), published."""
        for r in rows:
            self.outcomes[r.outcome] += 1
            if not r.warmup and r.output_tokens:
                self.output_tokens += r.output_tokens
        buckets = {}
        for m, upper_s in BUCKETS_S.items():
            v = values_ns.get(m)
            if v is not None and v.size:
                v_s = np.sort(v) / 1e9
                self._below[m] += np.searchsorted(v_s, np.asarray(upper_s), side="right")
                self._count[m] += int(v_s.size)
                self._sum_s[m] += float(v_s.sum())
            buckets[m] = Buckets(upper_s, tuple(int(c) for c in self._below[m]), self._count[m], self._sum_s[m])
        # a slice copies (under the GIL) what the loop has appended since the last interval; a buffer
        # view instead would make the loop's next append fail (an exported array cannot grow)
        n = len(self.lateness_ns)
        late = np.asarray(self.lateness_ns[self._lateness_seen:n], dtype=np.int64)
        self._lateness_seen = n
        sent, in_flight = self.counters()
        snap = Snapshot(
            t_s=end_ns / 1e9, interval_s=(end_ns - start_ns) / 1e9, planned=self.planned,
            due=sent if self.due_ns is None else int(np.searchsorted(self.due_ns, end_ns, side="right")),
            sent=sent, in_flight=in_flight,
            outcomes=dict(self.outcomes), output_tokens=self.output_tokens,
            last={m: Window.of(rec) for m, rec in last.items()}, run={m: Window.of(rec) for m, rec in totals.items()},
            buckets=buckets,
            loop_lateness_p99_ms=(float(metrics.quantiles(late, (0.99,))[0]) / 1e6
                                  if late.size else None),
            server=self.gauges())
        self.feed.publish(snap)
        return snap
