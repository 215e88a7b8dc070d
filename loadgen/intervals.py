"""Live HdrHistograms of a run: one `*.hlog` interval log per metric, one line per second, written as the
run goes (loadgen/hdr.py holds the format, the µs units and the out-of-range rule).

Contract:
- a request's samples (all its metrics) go into the interval in which the request FINISHED (its row was
  handed to the flusher); interval k covers [k s, (k+1) s) from t0; every interval is written, empty
  ones too, and the rows finished after the last full interval go into one last, shorter interval;
- the values are computed vectorized from the finished rows' buffers (one numpy pass per interval),
  never on the hot path;
- metrics and rows as in analysis/summary.py: send_lag over every dispatched row, the others over ok
  rows; itl by the per-token rule (itl_samples_ns below) so histograms and summary.json agree;
- warm-up rows are left out, as in the summary.
Called from a worker thread: it only reads rows that are finished (no longer touched by the loop).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from loadgen import hdr
from loadgen.itl import itl_samples_ns
from loadgen.recorder import OK, Row

INTERVAL_NS = 1_000_000_000


def metric_values_ns(rows: list[Row]) -> dict[str, np.ndarray]:
    """The samples (ns) of every metric over these finished rows."""
    measured = [r for r in rows if not r.warmup]
    sent = [r for r in measured if r.dispatched_ns is not None]
    ok = [r for r in measured if r.outcome == OK and r.first_token_ns is not None]
    i64 = np.int64
    out = {"send_lag": np.fromiter((r.dispatched_ns - r.intended_ns for r in sent), i64, len(sent))}
    intended = np.fromiter((r.intended_ns for r in ok), i64, len(ok))
    dispatched = np.fromiter((r.dispatched_ns for r in ok), i64, len(ok))
    first = np.fromiter((r.first_token_ns for r in ok), i64, len(ok))
    last = np.fromiter((r.last_token_ns for r in ok), i64, len(ok))
    n_out = np.fromiter((r.output_tokens or 0 for r in ok), i64, len(ok))
    out["ttft"], out["ttft_from_send"], out["e2e"] = first - intended, first - dispatched, last - intended
    multi = n_out > 1
    out["tpot"] = (last - first)[multi] / (n_out[multi] - 1)
    counts = np.fromiter((len(r.chunk_t_ns) for r in ok), i64, len(ok))
    if counts.sum():
        t = np.concatenate([np.frombuffer(r.chunk_t_ns, dtype=np.int64) for r in ok])
        k = np.concatenate([np.asarray(r.chunk_tokens, dtype=np.int64) for r in ok])
        owner = np.repeat(np.arange(len(ok)), counts)
        out["itl"] = itl_samples_ns(t, k, owner)  # each row's stamps are already in time order
    else:
        out["itl"] = np.empty(0)
    return out


class LiveHistograms:
    def __init__(self, run_dir: str | Path, t0_ns: int, start_wall_s: float, tag: str | None = None):
        self.t0_ns = t0_ns
        self.writers = {m: hdr.IntervalLogWriter(hdr.log_path(run_dir, m), start_wall_s=start_wall_s, tag=tag)
                        for m in hdr.METRICS}
        self.totals = {m: hdr.Recorded(hdr.new_histogram(), 0) for m in hdr.METRICS}
        self.next_start_ns = 0   # from t0: where the next interval begins

    def record_interval(self, rows: list[Row], end_ns: int) -> None:
        """Write the interval [next_start, end_ns) (ns from t0) holding these rows' samples."""
        start = self.next_start_ns
        end = max(end_ns, start)
        values = metric_values_ns(rows) if rows else {}
        for m, w in self.writers.items():
            rec = hdr.record(values.get(m, np.empty(0, dtype=np.int64)))
            w.write_interval(start, end, rec)
            self.totals[m].add(rec)
        self.next_start_ns = end

    def close(self) -> dict[str, dict]:
        for w in self.writers.values():
            w.close(fsync=True)
        return {m: hdr.summary_ms(rec) for m, rec in self.totals.items()}
