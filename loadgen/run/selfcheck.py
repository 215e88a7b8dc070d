"""The generator checks itself: was the schedule kept? A pure function of the plan and the dispatch times.

The invalid-run rule (any one makes the run `invalid`, exit 3, reasons in manifest.json and the report):
1. proportional (docs/metrics.md): latencies are measured from the intended time, so a request's send lag
   is inside its TTFT and e2e. For each reported percentile (TTFT and e2e, p50 and p99, over the measured
   ok rows) the shift the lag made is measured exactly: quantile(latency) - quantile(latency - send_lag).
   The run is invalid when a shift exceeds max(max_lag_share x the percentile, lag_floor) (defaults 5 %,
   2 ms; `--max-lag-share`, `--lag-floor`): one late request of 76 moves nothing unless it was the one
   at that rank. The figures beyond their tolerance are `affected` (the report names them).
   A ceiling stays: send_lag p99 > max_send_lag_p99_ns (default 50 ms; `--max-send-lag-p99`) is invalid
   whatever the latencies. send_lag and the percentile rule are metrics.py's (a wait for a
   --max-concurrency slot is the user's cap, recorded as slot_wait, not the generator falling behind).
2. achieved rate departs from the offered rate by more than `rate_tolerance` (default 2 %, relative;
   `run.max_rate_deviation`, `--max-rate-deviation`): rate = (n - 1) / span, over release times vs
   intended times. A request's release time is when the generator let it go: dispatched - slot_wait.
   A --max-concurrency cap that binds delays dispatches by design (the user's cap, its waits recorded
   as slot_wait and in ttft), so it never marks the run invalid by itself.
3. arrival shape: the coefficient of variation (CV) of the release gaps departs from the CV of the
   planned gaps by more than `cv_tolerance` (default 0.1, absolute; `run.max_cv_deviation`,
   `--max-cv-deviation`; Poisson must stay ~1, constant ~0).
The remedy names the cause (cause(), from hostload.py's kernel counters): `starved` when the event loop
waited on a run queue for >= STARVED_SHARE of the run, or for >= STARVED_MIN_SHARE of it and >=
STARVED_READY of the time it was ready to run (wait / (wait + CPU): a mostly idle loop that, woken, finds
its CPU taken), or steal was >= STARVED_SHARE (other work had the CPU: pin loadgen to a free core, stop
other work), `saturated` when the loop used >= SATURATED_SHARE of a
core (add --workers or lower the rate); both can hold; `unknown` without the counters or when neither does.
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
MAX_LAG_SHARE = default("max_lag_share")
LAG_FLOOR_NS = default("lag_floor_ns")
MIN_GAPS = 50
STARVED_SHARE = 0.05
STARVED_MIN_SHARE = 0.01
STARVED_READY = 0.2
SATURATED_SHARE = 0.85
FIGURES = (("ttft", 0.5, "p50"), ("ttft", 0.99, "p99"), ("e2e", 0.5, "p50"), ("e2e", 0.99, "p99"))


@dataclass(frozen=True)
class Limits:
    max_send_lag_p99_ns: int = MAX_SEND_LAG_P99_NS
    rate_tolerance: float = RATE_TOLERANCE
    cv_tolerance: float = CV_TOLERANCE
    min_gaps: int = MIN_GAPS
    max_lag_share: float = MAX_LAG_SHARE
    lag_floor_ns: int = LAG_FLOOR_NS


def limits_of(config) -> Limits:
    return Limits(config.max_send_lag_p99_ns, config.max_rate_deviation, config.max_cv_deviation,
                  max_lag_share=config.max_lag_share, lag_floor_ns=config.lag_floor_ns)


def cause(host: dict | None) -> dict:
    """{"cause": starved | saturated | starved and saturated | unknown, "advice": text}, from the kernel's
    counters over the run (hostload.delta; None: not measured)."""
    h = host or {}
    rq, steal, loop = h.get("loop_runqueue_share"), h.get("steal_share"), h.get("loop_cpu_share")
    # of the time the loop was ready to run, the share it spent waiting for a CPU
    ready = None if rq is None or loop is None or rq + loop <= 0 else rq / (rq + loop)
    starved = ((rq is not None and rq >= STARVED_SHARE) or (steal is not None and steal >= STARVED_SHARE)
               or (rq is not None and rq >= STARVED_MIN_SHARE and ready is not None and ready >= STARVED_READY))
    saturated = loop is not None and loop >= SATURATED_SHARE
    others = h.get("others_cpu_cores")
    seen = (f"the event loop waited for a CPU {100 * (rq or 0):.1f} % of the run"
            + (f", {100 * ready:.0f} % of the time it was ready to run" if ready is not None else "")
            + f", steal {100 * (steal or 0):.0f} %"
            + (f", other processes used {others:.1f} of the host's {h.get('host_cpus') or h.get('cpus')} cores"
               if others is not None else ""))
    starve = ("pin loadgen to a free core (taskset -c N loadgen run ...) and stop other work on this host")
    saturate = "add --workers N or lower the rate"
    if starved and saturated:
        return {"cause": "starved and saturated", "advice": f"the client was starved ({seen}) and its loop "
                f"used {100 * (loop or 0):.0f} % of a core: {starve}; {saturate}"}
    if starved:
        return {"cause": "starved", "advice": f"the client was starved: other work had the CPU ({seen}): {starve}"}
    if saturated:
        return {"cause": "saturated", "advice": f"the client was saturated: its event loop used "
                f"{100 * (loop or 0):.0f} % of a core: {saturate}"}
    if not h:
        return {"cause": "unknown", "advice": f"{saturate}, or if other work shares this host, {starve}"}
    return {"cause": "unknown", "advice": f"neither starved nor saturated by the kernel's counts ({seen}, loop "
            f"CPU {100 * (loop or 0):.0f} % of a core): look for pauses (GC, swapping); {saturate}"}


def percentile_shifts(lag_ns: np.ndarray, latency_ns: dict[str, np.ndarray], limits: Limits) -> list[dict]:
    """Per reported figure (FIGURES), how far the send lag moved it (module docstring, rule 1). latency_ns:
    {metric: ns} aligned with lag_ns; NaN where the row has no such latency (not ok)."""
    out = []
    for metric, q, label in FIGURES:
        lat = np.asarray(latency_ns.get(metric, []), dtype=np.float64)
        if lat.size != lag_ns.size:
            continue
        keep = ~np.isnan(lat)
        if not keep.any():
            continue
        value = float(metrics.quantiles(lat[keep], (q,))[0])
        shift = value - float(metrics.quantiles(lat[keep] - lag_ns[keep], (q,))[0])
        tolerance = max(limits.max_lag_share * value, limits.lag_floor_ns)
        out.append({"figure": f"{metric} {label}", "value_ms": value / 1e6, "shift_ms": shift / 1e6,
                    "tolerance_ms": tolerance / 1e6, "affected": shift > tolerance})
    return out


def check(intended_ns: np.ndarray, dispatched_ns: np.ndarray, slot_wait_ns: np.ndarray | None = None,
          limits: Limits = Limits(), measured: np.ndarray | None = None,
          open_loop: bool = True, latency_ns: dict[str, np.ndarray] | None = None,
          host: dict | None = None) -> tuple[list[str], dict]:
    """intended/dispatched: int64 ns of the dispatched rows (same order); slot_wait: 0 where none;
    measured: False for warm-up rows (left out of the send-lag figures, as in the summary);
    latency_ns: {"ttft", "e2e": ns, NaN where not ok} of the same rows (rule 1; None: no ok rows);
    host: hostload.delta's figures (the cause). Returns (reasons, stats); reasons is empty when the
    schedule was kept."""
    intended = np.asarray(intended_ns, dtype=np.int64)
    dispatched = np.asarray(dispatched_ns, dtype=np.int64)
    wait = np.zeros_like(intended) if slot_wait_ns is None else np.asarray(slot_wait_ns, dtype=np.int64)
    why = cause(host)
    stats: dict = {"dispatched": int(intended.size), "host": host, "cause": why["cause"]}
    reasons: list[str] = []
    keep = np.ones(intended.size, dtype=bool) if measured is None else np.asarray(measured, dtype=bool)
    frame = pl.DataFrame({"intended_ns": intended, "dispatched_ns": dispatched, "slot_wait_ns": wait}).filter(
        pl.Series(keep))
    if frame.height == 0:
        return reasons, stats
    lag = metrics.latency_columns(frame, unit_ns=1, names=("send_lag",))["send_lag"].to_numpy()
    p50, p99 = metrics.quantiles(lag, (0.5, 0.99))
    stats.update(send_lag_p50_ms=p50 / 1e6, send_lag_p99_ms=p99 / 1e6, send_lag_max_ms=float(lag.max()) / 1e6,
                 overdue=int(np.count_nonzero(lag > limits.lag_floor_ns)))
    shifts = percentile_shifts(lag.astype(np.float64), {m: np.asarray(v, dtype=np.float64)[keep]
                                                        for m, v in (latency_ns or {}).items()}, limits)
    stats.update(lag_shift=shifts, affected=[s["figure"] for s in shifts if s["affected"]])
    if p99 > limits.max_send_lag_p99_ns:
        reasons.append(f"send_lag p99 is {p99 / 1e6:.2f} ms (> {limits.max_send_lag_p99_ns / 1e6:g} ms): the "
                       f"generator could not keep the schedule, so latencies describe the client, not the "
                       f"server; {why['advice']}")
    if stats["affected"]:
        moved = ", ".join(f"{s['figure']} by {s['shift_ms']:.2f} ms ({100 * s['shift_ms'] / s['value_ms']:.0f} % "
                          f"of {s['value_ms']:.2f} ms)" for s in shifts if s["affected"])
        reasons.append(f"the client's send lag moved {moved}, beyond the tolerance (the larger of "
                       f"{100 * limits.max_lag_share:g} % and {limits.lag_floor_ns / 1e6:g} ms; send_lag p99 "
                       f"{p99 / 1e6:.2f} ms, {stats['overdue']} requests later than "
                       f"{limits.lag_floor_ns / 1e6:g} ms): those figures describe the client; {why['advice']}")
    released = dispatched - wait
    offered, achieved = metrics.rate_per_s(intended), metrics.rate_per_s(released)
    cv_plan, cv_sent = metrics.gap_cv(intended), metrics.gap_cv(released)
    stats.update(offered_per_s=offered, achieved_per_s=achieved, cv_plan=cv_plan, cv_dispatch=cv_sent)
    if intended.size - 1 < limits.min_gaps or not open_loop:
        return reasons, stats
    if offered and achieved and abs(achieved / offered - 1) > limits.rate_tolerance:
        reasons.append(f"achieved rate {achieved:.1f}/s departs from the offered {offered:.1f}/s by "
                       f"{100 * (achieved / offered - 1):+.1f} % (> ±{100 * limits.rate_tolerance:g} %); "
                       f"{why['advice']}")
    if cv_plan is not None and cv_sent is not None and abs(cv_sent - cv_plan) > limits.cv_tolerance:
        reasons.append(f"arrival shape departs from the plan: CV of dispatch gaps {cv_sent:.2f} vs "
                       f"{cv_plan:.2f} planned (> ±{limits.cv_tolerance:g}); requests left in bursts; "
                       f"{why['advice']}")
    return reasons, stats
