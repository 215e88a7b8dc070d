"""The sweep's verdicts over its points: whether a point is saturated (and by what), whether it meets an
SLO attainment target, and where the knee is (loadgen/run/sweep.py runs the points; loadgen/twin/predict.py
applies the same rules to predicted points). A point is a dict with rate_per_s, valid, offered_per_s,
completed_per_s (metrics.steady_rates over its steady-state window; predict: fitted_rate_per_s),
latency_ms ({metric: {p50, p99, ...}}), goodput and, when the server was scraped, server_mean_waiting.

A valid point is *saturated* (docs/sweep-and-compare.md, "Knee") when any of these holds, each against the
lowest-rate valid point (the base):
  completions  completed_per_s < (1 - tolerance) x offered_per_s (the backlog grows: the server falls behind)
  queueing     TTFT p50 - the base's TTFT p50 > the base's e2e p50 (the median request waits longer for its
               first token than a whole request took at low load: a queue, not merely slower steps); for
               answers without a token (embeddings, rerank: no TTFT at either point) the answer is the first
               output, so e2e p50 - the base's e2e p50 > the base's e2e p50
  tpot         TPOT p50 > tpot_factor x the base's (the batch grows and every step slows: with vLLM's
               defaults overload shows here, not as a queue)
  server_waiting  the server's own waiting gauge (vllm:num_requests_waiting) averages >= waiting_mean
               over the point's steady-state window
An invalid point (its run did not measure the server) is excluded, with its reasons, never a verdict.
"""
from __future__ import annotations

KNEE_TOLERANCE = 0.05
TTFT_FACTOR = 3.0
TPOT_FACTOR = 2.0
WAITING_MEAN = 1.0
# A sweep stops escalating past a point that is one of these (run/sweep.py): error-dominated when more
# than this share of its requests failed, over-saturated when it completes under this share of its offers.
ERROR_DOMINATED = 0.5
OVER_SATURATED = 0.5
REASONS = ("completions", "queueing", "tpot", "server_waiting")


def _lat(p: dict, metric: str, stat: str = "p50") -> float | None:
    v = ((p.get("latency_ms") or {}).get(metric) or {}).get(stat)
    return v if isinstance(v, (int, float)) else None


def keeps_up(p: dict, tolerance: float = KNEE_TOLERANCE) -> bool:
    """The completions rule alone: valid, and completes within `tolerance` of its offered rate."""
    off, done = p.get("offered_per_s"), p.get("completed_per_s")
    return bool(p.get("valid")) and off is not None and done is not None and done >= (1 - tolerance) * off


def base_point(points: list[dict]) -> dict | None:
    """The lowest-rate valid point: the reference of the latency rules."""
    return min((p for p in points if p.get("valid")), key=lambda p: p["rate_per_s"], default=None)


def saturation(p: dict, base: dict | None, tolerance: float = KNEE_TOLERANCE, tpot_factor: float = TPOT_FACTOR,
               waiting_mean: float = WAITING_MEAN) -> list[str]:
    """The rules (REASONS) a valid point breaks; [] when it keeps up. Not for invalid points."""
    out = []
    if not keeps_up(p | {"valid": True}, tolerance):
        out.append("completions")
    ttft = _lat(p, "ttft")
    base_ttft, base_e2e = (_lat(base, "ttft"), _lat(base, "e2e")) if base else (None, None)
    if ttft is None and base_ttft is None:   # no token at either point (a pooling API): the whole answer
        ttft, base_ttft = _lat(p, "e2e"), base_e2e
    if ttft is not None and base_ttft is not None and base_e2e is not None and ttft - base_ttft > base_e2e:
        out.append("queueing")
    tpot, base_tpot = _lat(p, "tpot"), _lat(base, "tpot") if base else None
    if tpot is not None and base_tpot and tpot > tpot_factor * base_tpot:
        out.append("tpot")
    w = p.get("server_mean_waiting")
    if w is not None and w >= waiting_mean:
        out.append("server_waiting")
    return out


def stop_reason(p: dict) -> str | None:
    """Why a sweep must not escalate past this point (error-dominated or over-saturated), or None."""
    req = p.get("requests") or {}
    sched, ok = req.get("scheduled"), req.get("ok")
    if sched and ok is not None and (sched - ok) / sched > ERROR_DOMINATED:
        return f"error-dominated ({sched - ok} of {sched} requests did not complete ok)"
    off, done = p.get("offered_per_s"), p.get("completed_per_s")
    if p.get("valid") and off and done is not None and done < OVER_SATURATED * off:
        return f"over-saturated (completes {done:.3g}/s of {off:.3g}/s offered)"
    return None


def meets_attainment(p: dict, target: float) -> bool:
    a = (p.get("goodput") or {}).get("attainment")
    return bool(p.get("valid")) and a is not None and a >= target


def knee(points: list[dict], tolerance: float = KNEE_TOLERANCE, ttft_factor: float = TTFT_FACTOR,
         tpot_factor: float = TPOT_FACTOR, waiting_mean: float = WAITING_MEAN) -> dict:
    """The highest rate at which this valid point and every lower valid one are unsaturated; invalid points
    are excluded (listed with their reasons), so one bad low point does not wipe the knee."""
    pts = sorted(points, key=lambda p: p["rate_per_s"])
    base = base_point(pts)
    excluded = [{"rate_per_s": p["rate_per_s"], "reasons": list(p.get("invalid_reasons") or ["invalid"])}
                for p in pts if not p.get("valid")]
    at, first_bad, why = None, None, []
    for p in (q for q in pts if q.get("valid")):
        why = saturation(p, base, tolerance, tpot_factor, waiting_mean)
        if why:
            first_bad = p
            break
        at = p
    ttft_knee, base_ttft = None, _lat(base, "ttft", "p99") if base else None
    for p in (q for q in pts if q.get("valid")):
        v = _lat(p, "ttft", "p99")
        if base_ttft is None or v is None or v > ttft_factor * base_ttft:
            break
        ttft_knee = p["rate_per_s"]
    return {"rate_per_s": at and at["rate_per_s"], "offered_per_s": at and at.get("offered_per_s"),
            "first_saturated_per_s": first_bad and first_bad["rate_per_s"],
            "first_saturated_offered_per_s": first_bad and first_bad.get("offered_per_s"),
            "completed_per_s_past_knee": first_bad and first_bad.get("completed_per_s"),
            "saturated": first_bad is not None, "saturated_by": why if first_bad else [],
            "excluded": excluded, "base_rate_per_s": base and base["rate_per_s"],
            "ttft_knee_per_s": ttft_knee, "low_load_ttft_p99_ms": base_ttft,
            "rule": f"highest rate at which this and every lower valid point keep up: completions within "
                    f"{tolerance:.0%} of the offered rate over the steady-state window, TTFT p50 no more than the "
                    f"lowest valid point's e2e p50 above its TTFT p50, TPOT p50 <= {tpot_factor:g}x the lowest valid "
                    f"point's, the server's mean waiting < {waiting_mean:g} when scraped; invalid points excluded; "
                    f"ttft_knee: p99 TTFT <= {ttft_factor:g}x the lowest valid point's"}
