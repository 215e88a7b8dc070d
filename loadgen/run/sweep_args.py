"""The sweep's own options (SPEC_OPTIONS: the flags of `loadgen sweep` beside the workload's, the keywords of
loadgen.sweep) -> a SweepSpec; every problem is an ArgError naming the flag (exit 2)."""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from loadgen.config.units import parse_rate_per_s
from loadgen.errors import ArgError

if TYPE_CHECKING:  # light at import: `loadgen sweep --help` builds its flags from SPEC_OPTIONS
    from loadgen.run.sweep import SweepSpec


# (flag, default as the flag's text, help); --max-goodput is a switch
SPEC_OPTIONS = (
    ("--rates", None, "rates to measure, e.g. 2,4,8/s (a unit on the last one applies to all)"),
    ("--start", None, "geometric series: first rate, e.g. 1/s (until saturation)"),
    ("--factor", "2", "geometric series: ratio between rates (default 2)"),
    ("--max-rate", None, "geometric series: never above this rate"),
    ("--max-points", "12", "at most this many points (default 12)"),
    ("--refine", "0", "bisection steps between the last good and first bad rate"),
    ("--max-goodput", False, "search the highest rate at which --attainment of requests meet every --slo"),
    ("--attainment", "0.9", "target share of requests meeting every SLO (0.9)"),
    ("--knee-tolerance", "5%", "completion rate may fall this far below the offered rate and still keep up "
                               "(default 5%)"),
    ("--ttft-factor", "3", "ttft knee: p99 TTFT within this factor of the lowest valid rate's (default 3)"),
    ("--tpot-factor", "2", "saturated when TPOT p50 exceeds this factor of the lowest valid rate's (default 2)"),
)


def spec_defaults() -> dict[str, Any]:
    """{dest: default} of SPEC_OPTIONS (argparse's names: --max-rate -> max_rate)."""
    return {flag[2:].replace("-", "_"): default for flag, default, _ in SPEC_OPTIONS}


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
    """args: argparse's Namespace of `loadgen sweep`, or any object with SPEC_OPTIONS' dests as attributes."""
    from loadgen.run.sweep import SweepSpec  # lazy: polars (a fast start)

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
