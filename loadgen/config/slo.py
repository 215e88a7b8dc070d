"""The SLO spec: `--slo ttft=500ms,tpot=50ms[,ttfa=2s,e2e=2s,itl_p99=80ms]`, upper bounds in ms on per-request
values (their definitions and the goodput they give: loadgen/analysis/goodput.py)."""
from __future__ import annotations

from loadgen.config.units import parse_duration_ns

SLO_METRICS = ("ttft", "ttfa", "tpot", "e2e", "itl_p99")


def parse_slo(text: str) -> dict[str, float]:
    """`ttft=500ms,tpot=50ms` -> {"ttft": 500.0, "tpot": 50.0} (ms). ValueError names the bad part."""
    out: dict[str, float] = {}
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts:
        raise ValueError(f"empty SLO {text!r}: expected e.g. 'ttft=500ms,tpot=50ms'")
    for part in parts:
        name, sep, value = part.partition("=")
        name = name.strip().lower()
        if not sep:
            raise ValueError(f"{part!r}: expected METRIC=DURATION, e.g. ttft=500ms")
        if name not in SLO_METRICS:
            raise ValueError(f"{part!r}: unknown metric {name!r} (one of: {', '.join(SLO_METRICS)})")
        if name in out:
            raise ValueError(f"{part!r}: {name} given twice")
        try:
            ns = parse_duration_ns(value.strip())
        except ValueError as e:
            raise ValueError(f"{part!r}: {e}") from None
        if ns <= 0:
            raise ValueError(f"{part!r}: the bound must be > 0")
        out[name] = ns / 1e6
    return out


def slo_keys(slo_ms: dict[str, float]) -> dict[str, float]:
    return {f"{m}_ms": v for m, v in slo_ms.items()}


def from_keys(recorded: dict) -> dict[str, float]:
    # The inverse of slo_keys (an SLO recorded in a manifest or summary).
    return {k[:-3]: float(v) for k, v in recorded.items() if k.endswith("_ms") and k[:-3] in SLO_METRICS}
