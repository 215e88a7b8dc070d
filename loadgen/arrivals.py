"""Arrival schedules as pure functions: parameters and a seed in, sorted int64 ns offsets from t0 out.

Contract for every process here:
- the first request is at offset 0 (the run starts working at once; gaps after it are the process's);
- bounded by `n` (exactly n offsets) or by `duration_ns` (every offset < duration_ns), not both;
- same arguments and seed -> the same array, bit for bit (numpy's PCG64 via default_rng);
- gaps are drawn in float seconds, rounded to whole ns, then summed in int64, so offsets are exact and
  never decrease.
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

NS_PER_S = 1_000_000_000


def _bounded(gaps_s: Callable[[int], np.ndarray], mean_gap_s: float, n: int | None,
             duration_ns: int | None) -> np.ndarray:
    if (n is None) == (duration_ns is None):
        raise ValueError("give exactly one of n or duration_ns")
    if n is not None:
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        if n == 0:
            return np.zeros(0, dtype=np.int64)
        gaps = np.rint(gaps_s(n - 1) * NS_PER_S).astype(np.int64)
        return np.concatenate(([0], np.cumsum(gaps))).astype(np.int64)
    if duration_ns <= 0:
        raise ValueError(f"duration_ns must be > 0, got {duration_ns}")
    # Draw in batches sized for the expected count plus margin, until the duration is covered.
    expected = int(duration_ns / NS_PER_S / mean_gap_s)
    parts, total = [np.zeros(1, dtype=np.int64)], 0
    while total < duration_ns:
        gaps = np.rint(gaps_s(max(16, expected + 4 * int(expected ** 0.5) + 16)) * NS_PER_S).astype(np.int64)
        steps = total + np.cumsum(gaps)
        parts.append(steps)
        total = int(steps[-1])
    offsets = np.concatenate(parts)
    return offsets[offsets < duration_ns]


def constant(rate_per_s: float, *, n: int | None = None, duration_ns: int | None = None) -> np.ndarray:
    _check_rate(rate_per_s)
    if n is not None:
        # Offsets i * 1e9 / rate computed directly, so rounding never accumulates.
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        return np.rint(np.arange(n) * (NS_PER_S / rate_per_s)).astype(np.int64)
    offsets = constant(rate_per_s, n=int(duration_ns * rate_per_s / NS_PER_S) + 2)
    return offsets[offsets < duration_ns]


def poisson(rate_per_s: float, *, seed: int, n: int | None = None,
            duration_ns: int | None = None) -> np.ndarray:
    _check_rate(rate_per_s)
    rng = np.random.default_rng(seed)
    return _bounded(lambda k: rng.exponential(1.0 / rate_per_s, k), 1.0 / rate_per_s, n, duration_ns)


def gamma(rate_per_s: float, burstiness: float, *, seed: int, n: int | None = None,
          duration_ns: int | None = None) -> np.ndarray:
    """Gamma-distributed gaps with mean 1/rate and shape = burstiness, so the gaps' coefficient of
    variation is 1/sqrt(burstiness): 1 is Poisson, < 1 burstier, > 1 more regular."""
    _check_rate(rate_per_s)
    if not burstiness > 0:
        raise ValueError(f"burstiness must be > 0, got {burstiness}")
    rng = np.random.default_rng(seed)
    scale = 1.0 / (rate_per_s * burstiness)
    return _bounded(lambda k: rng.gamma(burstiness, scale, k), 1.0 / rate_per_s, n, duration_ns)


def _check_rate(rate_per_s: float) -> None:
    if not rate_per_s > 0:
        raise ValueError(f"rate must be > 0, got {rate_per_s}")


PROCESSES = ("poisson", "constant", "gamma")
