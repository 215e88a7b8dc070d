"""The sweep's verdicts over its points: whether a point keeps up with its offered rate, meets an SLO
attainment target, and where the knee is (loadgen/run/sweep.py runs the points; loadgen/twin/predict.py
applies the same rules to predicted points). A point is a dict with rate_per_s, valid, offered_per_s,
completed_per_s (metrics.fitted_rate_per_s of its intended sends and completions), latency_ms and goodput."""
from __future__ import annotations

KNEE_TOLERANCE = 0.05
TTFT_FACTOR = 3.0


def keeps_up(p: dict, tolerance: float = KNEE_TOLERANCE) -> bool:
    off, done = p.get("offered_per_s"), p.get("completed_per_s")
    return bool(p.get("valid")) and off is not None and done is not None and done >= (1 - tolerance) * off


def meets_attainment(p: dict, target: float) -> bool:
    a = (p.get("goodput") or {}).get("attainment")
    return bool(p.get("valid")) and a is not None and a >= target


def knee(points: list[dict], tolerance: float = KNEE_TOLERANCE, ttft_factor: float = TTFT_FACTOR) -> dict:
    """points: dicts with rate_per_s, valid, offered_per_s, completed_per_s, latency_ms.ttft.p99."""
    pts = sorted(points, key=lambda p: p["rate_per_s"])
    at, first_bad = None, None
    for p in pts:
        if not keeps_up(p, tolerance):
            first_bad = p
            break
        at = p
    ttft_knee, base = None, None
    if pts:
        base = ((pts[0].get("latency_ms") or {}).get("ttft") or {}).get("p99")
    for p in pts:
        v = ((p.get("latency_ms") or {}).get("ttft") or {}).get("p99")
        if base is None or v is None or v > ttft_factor * base:
            break
        ttft_knee = p["rate_per_s"]
    return {"rate_per_s": at and at["rate_per_s"], "offered_per_s": at and at.get("offered_per_s"),
            "first_saturated_per_s": first_bad and first_bad["rate_per_s"],
            "first_saturated_offered_per_s": first_bad and first_bad.get("offered_per_s"),
            "completed_per_s_past_knee": first_bad and first_bad.get("completed_per_s"),
            "saturated": first_bad is not None,
            "ttft_knee_per_s": ttft_knee, "low_load_ttft_p99_ms": base,
            "rule": f"highest rate at which this and every lower point are valid and complete requests within "
                    f"{tolerance:.0%} of the offered rate; ttft_knee: p99 TTFT <= {ttft_factor:g}x the "
                    f"lowest-rate point's"}
