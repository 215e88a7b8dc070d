"""The generator checks itself: was the schedule kept? A pure function of the plan and the dispatch times.

The invalid-run rule (any one makes the run `invalid`, exit 3, reasons in manifest.json and the report):
1. send_lag p99 > max_send_lag_p99_ns (default 5 ms; `run.max_send_lag_p99`, `--max-send-lag-p99`).
   send_lag and the percentile rule are metrics.py's (a wait for a --max-concurrency slot is the user's
   cap, recorded as slot_wait, not the generator falling behind), over the measured (non-warm-up) rows,
   so the figure equals the summary's send_lag p99.
2. achieved rate departs from the offered rate by more than `rate_tolerance` (default 2 %, relative;
   `run.max_rate_deviation`, `--max-rate-deviation`): rate = (n - 1) / span, over release times vs
   intended times. A request's release time is when the generator let it go: dispatched - slot_wait.
   A --max-concurrency cap that binds delays dispatches by design (the user's cap, its waits recorded
   as slot_wait and in ttft), so it never marks the run invalid by itself.
3. arrival shape: the coefficient of variation (CV) of the release gaps departs from the CV of the
   planned gaps by more than `cv_tolerance` (default 0.1, absolute; `run.max_cv_deviation`,
   `--max-cv-deviation`; Poisson must stay ~1, constant ~0).
Rules 2 and 3 need at least MIN_GAPS gaps (fewer say nothing about a rate or a shape), include warm-up
rows (the generator must keep the whole schedule, measured or not), and apply only to an open loop: in
a closed loop (closedloop.py) the rate is what the server's replies make it.

Overdue requests: the dispatcher never skips or reshuffles the plan. A request whose deadline has passed
(the loop was busy) is sent at once, in plan order, with its lag recorded; several overdue requests
therefore leave back to back. That burst is not hidden: it shows as send_lag, as `overdue` counts
(requests later than the threshold) and as a departure of the dispatch-gap CV, which make the run invalid.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from loadgen import metrics
from loadgen.config.options import default

# The defaults are the option table's (config/options.py), the one place they are written.
MAX_SEND_LAG_P99_NS = default("max_send_lag_p99_ns")
RATE_TOLERANCE = default("max_rate_deviation")
CV_TOLERANCE = default("max_cv_deviation")
MIN_GAPS = 50
ADVICE = "add workers or lower the rate"


@dataclass(frozen=True)
class Limits:
    max_send_lag_p99_ns: int = MAX_SEND_LAG_P99_NS
    rate_tolerance: float = RATE_TOLERANCE
    cv_tolerance: float = CV_TOLERANCE
    min_gaps: int = MIN_GAPS


def limits_of(config) -> Limits:
    return Limits(config.max_send_lag_p99_ns, config.max_rate_deviation, config.max_cv_deviation)


def check(intended_ns: np.ndarray, dispatched_ns: np.ndarray, slot_wait_ns: np.ndarray | None = None,
          limits: Limits = Limits(), measured: np.ndarray | None = None,
          open_loop: bool = True) -> tuple[list[str], dict]:
    """intended/dispatched: int64 ns of the dispatched rows (same order); slot_wait: 0 where none;
    measured: False for warm-up rows (left out of the send-lag figures, as in the summary).
    Returns (reasons, stats); reasons is empty when the schedule was kept."""
    intended = np.asarray(intended_ns, dtype=np.int64)
    dispatched = np.asarray(dispatched_ns, dtype=np.int64)
    wait = np.zeros_like(intended) if slot_wait_ns is None else np.asarray(slot_wait_ns, dtype=np.int64)
    stats: dict = {"dispatched": int(intended.size)}
    reasons: list[str] = []
    frame = pl.DataFrame({"intended_ns": intended, "dispatched_ns": dispatched, "slot_wait_ns": wait})
    if measured is not None:
        frame = frame.filter(pl.Series(np.asarray(measured, dtype=bool)))
    if frame.height == 0:
        return reasons, stats
    lag = metrics.latency_columns(frame, unit_ns=1, names=("send_lag",))["send_lag"].to_numpy()
    p50, p99 = metrics.quantiles(lag, (0.5, 0.99))
    stats.update(send_lag_p50_ms=p50 / 1e6, send_lag_p99_ms=p99 / 1e6, send_lag_max_ms=float(lag.max()) / 1e6,
                 overdue=int(np.count_nonzero(lag > limits.max_send_lag_p99_ns)))
    if p99 > limits.max_send_lag_p99_ns:
        reasons.append(f"send_lag p99 is {p99 / 1e6:.2f} ms (> {limits.max_send_lag_p99_ns / 1e6:g} ms; "
                       f"{stats['overdue']} requests later than that): the generator could not keep the "
                       f"schedule, so latencies describe the client, not the server; {ADVICE}")
    released = dispatched - wait
    offered, achieved = metrics.rate_per_s(intended), metrics.rate_per_s(released)
    cv_plan, cv_sent = metrics.gap_cv(intended), metrics.gap_cv(released)
    stats.update(offered_per_s=offered, achieved_per_s=achieved, cv_plan=cv_plan, cv_dispatch=cv_sent)
    if intended.size - 1 < limits.min_gaps or not open_loop:
        return reasons, stats
    if offered and achieved and abs(achieved / offered - 1) > limits.rate_tolerance:
        reasons.append(f"achieved rate {achieved:.1f}/s departs from the offered {offered:.1f}/s by "
                       f"{100 * (achieved / offered - 1):+.1f} % (> ±{100 * limits.rate_tolerance:g} %); {ADVICE}")
    if cv_plan is not None and cv_sent is not None and abs(cv_sent - cv_plan) > limits.cv_tolerance:
        reasons.append(f"arrival shape departs from the plan: CV of dispatch gaps {cv_sent:.2f} vs "
                       f"{cv_plan:.2f} planned (> ±{limits.cv_tolerance:g}); requests left in bursts; {ADVICE}")
    return reasons, stats
