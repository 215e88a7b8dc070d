"""Token-length distributions for prompts and outputs: the spec, as the workload file writes it, and its
parser (the seeded sampler is loadgen/plan/lengths.py).

Forms of `prompt.tokens` / `output.tokens` (every one clipped to [min, max] after rounding; clipping
piles the cut tails onto the bounds rather than resampling, so say min/max where it matters):

    128                                                  fixed
    { dist = "uniform", min = 64, max = 512 }            integers, both ends inclusive
    { dist = "normal", mean = 300, sd = 80, min = 1, max = 1024 }
    { dist = "lognormal", median = 200, sigma = 0.8, min = 1, max = 8192 }   sigma: sd of ln(length)
    { dist = "empirical", values = [12, 40, 40, 900] }   resampled with replacement
    { dist = "cycle", values = [200, 2000] }             request i gets values[i % len]: alternation
    { dist = "empirical", trace = "traces/x.csv", format = "burstgpt" }      the trace's prompt (for
                                                         prompt.tokens) or output (output.tokens) lengths
    { dist = "mixture", components = [ { weight = 0.7, dist = "normal", ... }, { weight = 0.3, ... } ] }

Joint prompt/output: either `[[mix]]` classes in the workload (each request picks a class by weight, then
draws its prompt and output length from that class's two distributions), or empirical prompt and output
naming the same trace file, which then sample the same rows (a long prompt keeps its own output length).
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loadgen.config.kinds import is_file


DISTS = ("fixed", "uniform", "normal", "lognormal", "empirical", "mixture", "cycle")
DEFAULT_MAX = 1_000_000
# Every number of a length table is finite and at most MAX_VALUE: far above any plan's limit
# (plan/limits.py names the real one), and low enough that the sampler's int64 arithmetic cannot overflow.
MAX_VALUE = 2**62
_KEYS = {
    "fixed": {"value"}, "uniform": {"min", "max"}, "normal": {"mean", "sd", "min", "max"},
    "lognormal": {"median", "sigma", "min", "max"}, "empirical": {"values", "trace", "format", "min", "max"},
    "mixture": {"components", "min", "max"}, "cycle": {"values"},
}


@dataclass(frozen=True)
class Lengths:
    dist: str = "fixed"
    value: int = 0                   # fixed
    min: int = 0                     # uniform (inclusive); a clip bound for the others
    max: int = 0                     # uniform (inclusive); a clip bound for the others (0 = none)
    mean: float = 0.0                # normal
    sd: float = 0.0                  # normal
    median: float = 0.0              # lognormal: exp(mu)
    sigma: float = 0.0               # lognormal: sd of ln(length)
    values: tuple[int, ...] = ()     # empirical, inline
    trace: str = ""                  # empirical, from a trace file (resolved path)
    trace_format: str = ""           # "" = sniffed
    weights: tuple[float, ...] = ()  # mixture, normalized to sum 1
    components: tuple[Lengths, ...] = ()


Bad = Callable[[str, str], None]   # bad(key, message): records one problem, parsing goes on
_ONE = Lengths(value=1)            # what a spec with a problem parses to (the problem is reported)


def parse(v: Any, key: str, bad: Bad, base_dir: Path) -> Lengths:
    """Turn the file's form into Lengths, reporting every problem through bad(key, message)."""
    if isinstance(v, bool):
        bad(key, f"must be an integer or a table, got {v!r}")
        return _ONE
    if isinstance(v, int):
        if not 1 <= v <= MAX_VALUE:
            bad(key, f"must be >= 1, got {v}" if v < 1 else f"must be <= {MAX_VALUE}, got {v}")
            return _ONE
        return Lengths(value=v)
    if not isinstance(v, dict):
        bad(key, f"must be an integer or a table like {{ dist = \"uniform\", min = 64, max = 512 }}, got {v!r}")
        return _ONE
    dist = v.get("dist", "fixed")
    if dist not in DISTS:
        bad(f"{key}.dist", f"must be one of {', '.join(DISTS)}, got {dist!r}")
        return _ONE
    allowed = _KEYS[dist] | {"dist", "weight"}
    for k in sorted(set(v) - allowed):
        bad(f"{key}.{k}", f"unknown key for dist {dist!r} (expected {', '.join(sorted(allowed - {'weight'}))})")
    t = _Table(v, key, bad)
    lo = t.num("min", integer=True, minimum=1, default=1)
    hi = t.num("max", integer=True, minimum=1, default=DEFAULT_MAX)
    if lo > hi and not t.failed:  # a bad bound is reported by itself (and read as 1)
        bad(key, f"min ({lo}) must be <= max ({hi})")
    if dist == "fixed":
        return Lengths(value=t.num("value", integer=True, minimum=1))
    if dist == "uniform":
        if "min" not in v or "max" not in v:
            bad(key, "uniform needs min and max")
        return Lengths("uniform", min=lo, max=hi)
    if dist == "normal":
        return Lengths("normal", min=lo, max=hi, mean=float(t.num("mean", minimum=0, strict=True)),
                       sd=float(t.num("sd", minimum=0)))
    if dist == "lognormal":
        return Lengths("lognormal", min=lo, max=hi, median=float(t.num("median", minimum=0, strict=True)),
                       sigma=float(t.num("sigma", minimum=0)))
    if dist == "cycle":
        values = _values(v, key, bad)
        return Lengths("cycle", values=values) if values else _ONE
    if dist == "empirical":
        return _empirical(v, key, bad, base_dir, lo, hi)
    return _mixture(v, key, bad, base_dir, lo, hi)


def problems(spec: Lengths) -> list[str]:
    """What is wrong with a Lengths built in code rather than parsed (with_overrides re-checks it): the
    same rules as parse() on its numbers, the components' included."""
    out = []
    if spec.dist not in DISTS:
        out.append(f"dist must be one of {', '.join(DISTS)}, got {spec.dist!r}")
    ints = {"value": spec.value, "min": spec.min, "max": spec.max}
    for name, x in ints.items():
        if isinstance(x, bool) or not isinstance(x, int) or not 0 <= x <= MAX_VALUE:
            out.append(f"{name} must be an integer from 0 to {MAX_VALUE}, got {x!r}")
    for name, f in {"mean": spec.mean, "sd": spec.sd, "median": spec.median, "sigma": spec.sigma}.items():
        if isinstance(f, bool) or not isinstance(f, (int, float)) or not 0 <= f <= MAX_VALUE:
            out.append(f"{name} must be a finite number >= 0, got {f!r}")
    if spec.dist == "fixed" and not out and spec.value < 1:
        out.append(f"value must be >= 1, got {spec.value}")
    if any(isinstance(x, bool) or not isinstance(x, int) or not 1 <= x <= MAX_VALUE for x in spec.values):
        out.append(f"values must be integers from 1 to {MAX_VALUE}")
    if any(not isinstance(w, (int, float)) or not 0 < w < math.inf for w in spec.weights):
        out.append("weights must be finite numbers > 0")
    return out + [f"components[{i}].{p}" for i, c in enumerate(spec.components) for p in problems(c)]


class _Table:
    # The numbers of one length table: a bad or missing one is reported and read as 1.
    def __init__(self, v: dict, key: str, bad: Bad):
        self.v, self.key, self.bad = v, key, bad
        self.failed = False  # a number was reported

    def num(self, name: str, *, integer: bool = False, minimum: float = 0.0, strict: bool = False,
            default: Any = None) -> Any:
        x = self.v.get(name, default)
        if x is None:
            self.bad(f"{self.key}.{name}", "missing")
            self.failed = True
            return 1
        ok = isinstance(x, int) if integer else isinstance(x, (int, float))
        if isinstance(x, bool) or not ok or not math.isfinite(x) or x > MAX_VALUE \
                or (x <= minimum if strict else x < minimum):
            what = "an integer" if integer else "a number"
            self.bad(f"{self.key}.{name}", f"must be {what} {'>' if strict else '>='} {minimum:g} (finite, "
                     f"at most {MAX_VALUE}), got {x!r}")
            self.failed = True
            return 1
        return x


def _values(v: dict, key: str, bad: Bad) -> tuple[int, ...]:
    # `values = [...]` of cycle and inline empirical: () after reporting a problem
    values = v.get("values")
    if (not isinstance(values, list) or not values
            or any(isinstance(x, bool) or not isinstance(x, int) or not 1 <= x <= MAX_VALUE for x in values)):
        bad(f"{key}.values", f"must be a non-empty list of integers >= 1 (at most {MAX_VALUE})")
        return ()
    return tuple(values)


def _empirical(v: dict, key: str, bad: Bad, base_dir: Path, lo: int, hi: int) -> Lengths:
    values, trace = v.get("values"), v.get("trace")
    if (values is None) == (trace is None):
        bad(key, "empirical needs exactly one of values (a list) or trace (a file)")
        return _ONE
    if trace is None:
        inline = _values(v, key, bad)
        return Lengths("empirical", min=lo, max=hi, values=inline) if inline else _ONE
    if not isinstance(trace, str) or not trace:
        bad(f"{key}.trace", f"must be a file name, got {trace!r}")
        return _ONE
    path = (base_dir / trace) if not Path(trace).is_absolute() else Path(trace)
    if not is_file(path):
        bad(f"{key}.trace", f"no such file {str(path)!r}")
    fmt = v.get("format", "")
    if fmt not in ("", "azure", "mooncake", "burstgpt", "jsonl"):
        bad(f"{key}.format", f"must be one of azure, mooncake, burstgpt, jsonl, got {fmt!r}")
        fmt = ""
    return Lengths("empirical", min=lo, max=hi, trace=str(path), trace_format=fmt)


def _mixture(v: dict, key: str, bad: Bad, base_dir: Path, lo: int, hi: int) -> Lengths:
    comps = v.get("components")
    if not isinstance(comps, list) or not comps:
        bad(f"{key}.components", "must be a non-empty list of tables, each with a weight and a dist")
        return _ONE
    parsed, weights = [], []
    for i, c in enumerate(comps):
        ck = f"{key}.components[{i}]"
        w = c.get("weight") if isinstance(c, dict) else None
        if isinstance(w, bool) or not isinstance(w, (int, float)) or not 0 < w < math.inf:
            bad(f"{ck}.weight", f"must be a number > 0 (finite), got {w!r}")
            w = 1.0
        if isinstance(c, dict) and c.get("dist") == "mixture":
            bad(f"{ck}.dist", "a mixture cannot nest another mixture")
        parsed.append(parse({k: x for k, x in c.items() if k != "weight"} if isinstance(c, dict) else c,
                            ck, bad, base_dir))
        weights.append(float(w))
    total = sum(weights)
    return Lengths("mixture", min=lo, max=hi, weights=tuple(w / total for w in weights),
                   components=tuple(parsed))
