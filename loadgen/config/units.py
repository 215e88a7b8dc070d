"""Parsing of quantities with units: durations (`500ms`, `2s`, `1m`) and rates (`8/s`, `120/m`).

Every parser raises ValueError with a message that quotes the bad text; callers add the file and key.
"""
from __future__ import annotations

import math
import re

MAX_NS = 1 << 62          # ~146 years: every planned time and gap fits int64 ns, with room for their sums
MIN_RATE_PER_S = 1e-6     # one request in ~11.6 days; below, gaps in ns overflow int64 (a typo, surely)
_DURATION_NS = {"ns": 1, "us": 1_000, "µs": 1_000, "ms": 1_000_000, "s": 1_000_000_000,
                "m": 60_000_000_000, "min": 60_000_000_000, "h": 3_600_000_000_000}
_RATE_PER_S = {"s": 1.0, "m": 1 / 60, "min": 1 / 60, "h": 1 / 3600}
_NUM = r"([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)"


def parse_duration_ns(text: str | float) -> int:
    """`500ms` -> 500_000_000. A bare number is rejected: a duration must say its unit."""
    if isinstance(text, bool) or not isinstance(text, str) or re.fullmatch(_NUM, text.strip()):
        raise ValueError(f"duration {text!r} needs a unit, e.g. '500ms' or '2s'")
    m = re.fullmatch(_NUM + r"\s*(ns|us|µs|ms|s|m|min|h)", text.strip())
    if not m:
        raise ValueError(f"bad duration {text!r}: expected a number and a unit (ns, us, ms, s, m, h)")
    ns = float(m.group(1)) * _DURATION_NS[m.group(2)]
    if not ns <= MAX_NS:  # 1e400s is inf
        raise ValueError(f"bad duration {text!r}: at most {MAX_NS / 3.15576e16:.0f} years")
    return round(ns)


def parse_rate_per_s(text: str | float) -> float:
    """`8/s` -> 8.0, `120/m` -> 2.0. A bare positive number is read as per second."""
    if isinstance(text, bool):
        raise ValueError(f"bad rate {text!r}")
    if isinstance(text, (int, float)):
        value = float(text)
    elif not isinstance(text, str):
        raise ValueError(f"bad rate {text!r}: expected e.g. '8/s' or '120/m'")
    else:
        m = re.fullmatch(_NUM + r"\s*(?:/\s*(s|m|min|h))?", text.strip())
        if not m:
            raise ValueError(f"bad rate {text!r}: expected e.g. '8/s' or '120/m'")
        value = float(m.group(1)) * _RATE_PER_S[m.group(2) or "s"]
    if not value > 0:
        raise ValueError(f"bad rate {text!r}: must be > 0")
    if not math.isfinite(value):  # "inf" (every request due at t0) is the callers' word, not a number
        raise ValueError(f"bad rate {text!r}: not a finite number")
    if value < MIN_RATE_PER_S:
        raise ValueError(f"bad rate {text!r}: below {MIN_RATE_PER_S:g}/s (one request in 11.6 days)")
    return value

