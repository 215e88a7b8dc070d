"""`loadgen sweep`'s flags -> a SweepSpec; every problem is an ArgError naming the flag (exit 2)."""
from __future__ import annotations

import math

from loadgen.run.sweep import SweepSpec
from loadgen.config.units import parse_rate_per_s


class ArgError(Exception):
    pass


def parse_rates(text: str) -> tuple[float, ...]:
    """`2,4,8/s` -> (2.0, 4.0, 8.0): a unit on any item applies to the bare numbers (per s without one)."""
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not items:
        raise ArgError(f"--rates: expected e.g. 2,4,8/s, got {text!r}")
    unit = next((t[t.index("/"):] for t in reversed(items) if "/" in t), "/s")
    out = []
    for t in items:
        try:
            out.append(parse_rate_per_s(t if "/" in t else t + unit))
        except ValueError as e:
            raise ArgError(f"--rates: {e}") from None
    if len(set(out)) != len(out):
        raise ArgError(f"--rates: a rate is listed twice in {text!r}")
    return tuple(sorted(out))


def fraction(flag: str, text: str, lo: float, hi: float) -> float:
    """`5%` or `0.05` -> 0.05, within [lo, hi]."""
    t = str(text).strip()
    try:
        v = float(t[:-1]) / 100 if t.endswith("%") else float(t)
    except ValueError:
        raise ArgError(f"{flag}: expected a number or a percentage, got {text!r}") from None
    if not lo <= v <= hi:
        raise ArgError(f"{flag}: must be within [{lo:g}, {hi:g}], got {text!r}")
    return v


def _number(flag: str, text: str, minimum: float, integer: bool = False) -> float:
    try:
        v = int(text) if integer else float(text)
    except ValueError:
        raise ArgError(f"{flag}: expected a{'n integer' if integer else ' number'}, got {text!r}") from None
    if not v >= minimum or math.isinf(v):
        raise ArgError(f"{flag}: must be >= {minimum:g}, got {text!r}")
    return v


def _rate(flag: str, text: str | None) -> float | None:
    if text is None:
        return None
    try:
        return parse_rate_per_s(text)
    except ValueError as e:
        raise ArgError(f"{flag}: {e}") from None


def spec_from_args(args, slo_ms: dict[str, float] | None) -> SweepSpec:
    if getattr(args, "rate", None):
        raise ArgError("--rate: a sweep sets the rate of each point; give --rates LIST or --start RATE")
    if bool(args.rates) == bool(args.start):
        raise ArgError("give exactly one of --rates LIST (e.g. 2,4,8/s) or --start RATE (a geometric series)")
    if args.max_goodput and not slo_ms:
        raise ArgError("--max-goodput needs --slo (e.g. --slo ttft=500ms,tpot=50ms)")
    factor = _number("--factor", args.factor, 1.0)
    if factor <= 1:
        raise ArgError(f"--factor: must be > 1, got {args.factor!r}")
    return SweepSpec(
        rates=parse_rates(args.rates) if args.rates else (),
        start_per_s=_rate("--start", args.start),
        factor=factor,
        max_rate_per_s=_rate("--max-rate", args.max_rate),
        max_points=int(_number("--max-points", args.max_points, 1, integer=True)),
        refine=int(_number("--refine", args.refine, 0, integer=True)),
        max_goodput=bool(args.max_goodput),
        attainment=fraction("--attainment", args.attainment, 0.0, 1.0),
        slo_ms=dict(slo_ms or {}),
        tolerance=fraction("--knee-tolerance", args.knee_tolerance, 0.0, 0.9),
        ttft_factor=_number("--ttft-factor", args.ttft_factor, 1.0),
        tpot_factor=_number("--tpot-factor", args.tpot_factor, 1.0),
    )
