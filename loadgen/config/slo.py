"""The SLO spec: `--slo ttft=500ms,tpot=50ms[,ttfa=2s,e2e=2s,itl_p99=80ms]`, upper bounds in ms on per-request
values (their definitions and the goodput they give: loadgen/analysis/goodput.py).

A bound may be given for one [[mix]] class: `METRIC=BOUND@CLASS` (e.g. `ttft=200ms@interactive`). A request
of that class is held to it instead of the plain `METRIC=BOUND` (which then holds for the other classes);
a metric bounded only for some classes does not bound the others. The parsed spec is one dict
{key: ms}, key `METRIC` or `METRIC@CLASS`; recorded (manifest.slo, summary.slo) as `METRIC_ms` and
`METRIC_ms@CLASS`."""
from __future__ import annotations

from loadgen.config.units import parse_duration_ns

SLO_METRICS = ("ttft", "ttfa", "tpot", "e2e", "itl_p99")


def split_slo_key(key: str) -> tuple[str, str | None]:
    """`ttft@interactive` -> ("ttft", "interactive"); `ttft` -> ("ttft", None)."""
    metric, sep, cls = key.partition("@")
    return metric, (cls if sep else None)


def parse_slo(text: str) -> dict[str, float]:
    """`ttft=500ms,tpot=50ms,ttft=200ms@chat` -> {"ttft": 500.0, "tpot": 50.0, "ttft@chat": 200.0} (ms).
    ValueError names the bad part."""
    out: dict[str, float] = {}
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts:
        raise ValueError(f"empty SLO {text!r}: expected e.g. 'ttft=500ms,tpot=50ms' (or 'ttft=200ms@CLASS')")
    for part in parts:
        name, sep, value = part.partition("=")
        name = name.strip().lower()
        if not sep:
            raise ValueError(f"{part!r}: expected METRIC=DURATION[@CLASS], e.g. ttft=500ms or ttft=200ms@chat")
        if name not in SLO_METRICS:
            raise ValueError(f"{part!r}: unknown metric {name!r} (one of: {', '.join(SLO_METRICS)})")
        value, at, cls = value.partition("@")
        cls = cls.strip()
        if at and not cls:
            raise ValueError(f"{part!r}: a class name must follow '@' (a [[mix]] class's name)")
        key = f"{name}@{cls}" if at else name
        if key in out:
            raise ValueError(f"{part!r}: {name}{f' for class {cls}' if at else ''} given twice")
        try:
            ns = parse_duration_ns(value.strip())
        except ValueError as e:
            raise ValueError(f"{part!r}: {e}") from None
        if ns <= 0:
            raise ValueError(f"{part!r}: the bound must be > 0")
        out[key] = ns / 1e6
    return out


def slo_keys(slo_ms: dict[str, float]) -> dict[str, float]:
    out = {}
    for key, v in slo_ms.items():
        metric, cls = split_slo_key(key)
        out[f"{metric}_ms" + (f"@{cls}" if cls is not None else "")] = v
    return out


def from_keys(recorded: dict) -> dict[str, float]:
    # The inverse of slo_keys (an SLO recorded in a manifest or summary).
    out = {}
    for k, v in recorded.items():
        name, cls = split_slo_key(k)
        if name.endswith("_ms") and name[:-3] in SLO_METRICS:
            out[name[:-3] + (f"@{cls}" if cls is not None else "")] = float(v)
    return out


def bounds_for(slo_ms: dict[str, float], cls: str | None) -> dict[str, float]:
    """The bounds a request of class `cls` is held to: {metric: ms}, a class's own bound over the plain one."""
    out = {k: v for k, v in slo_ms.items() if "@" not in k}
    for key, v in slo_ms.items():
        metric, c = split_slo_key(key)
        if c is not None and c == cls:
            out[metric] = v
    return out


def classes_named(slo_ms: dict[str, float]) -> set[str]:
    return {c for c in (split_slo_key(k)[1] for k in slo_ms) if c is not None}
