"""Arrival schedules as pure functions: parameters and a seed in, sorted int64 ns offsets from t0 out.

Contract for every process here:
- the first request is at offset 0 (the run starts working at once; gaps after it are the process's);
- bounded by `n` (exactly n offsets) or by `duration_ns` (every offset < duration_ns), not both;
- same arguments and seed -> the same array, bit for bit (numpy's PCG64 via default_rng);
- gaps are drawn in float seconds, rounded to whole ns, then summed in int64, so offsets are exact and
  never decrease.
"""
from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from loadgen.config.units import MIN_RATE_PER_S

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
    assert duration_ns is not None  # exactly one of the two is given (checked above)
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
    if duration_ns is None:
        raise ValueError("give exactly one of n or duration_ns")
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
    # gaps of a slower rate overflow int64 ns, and an infinite one never advances a duration-bounded draw
    if not MIN_RATE_PER_S <= rate_per_s < math.inf:
        raise ValueError(f"rate must be finite and >= {MIN_RATE_PER_S:g}/s, got {rate_per_s}")



# --- Time-varying rates and trace replay -----------------------------------------------------------
#
# Ramps and stages are non-homogeneous processes made by time rescaling: a unit-rate base process
# (Poisson: Exp(1) gaps; constant: gaps of exactly 1) gives event "masses" m_1 < m_2 < ..., and event i
# is sent at t_i = L^-1(m_i), where L(t) is the integral of the rate from 0 to t. A stage holds a rate
# that moves linearly from `rate_from` to `rate_to` over its duration, so L is piecewise quadratic and
# its inverse is closed form. After the last stage the last rate holds (so a request-count bound longer
# than the stages still ends). A stage of rate 0 is a pause.

Stage = tuple[int, float, float]  # (duration_ns, rate_from_per_s, rate_to_per_s)


def stages(stage_list: list[Stage] | tuple[Stage, ...], *, seed: int, base: str = "poisson",
           n: int | None = None, duration_ns: int | None = None) -> np.ndarray:
    """Piecewise-linear rate (see above). Without n or duration_ns the bound is the stages' total length."""
    if not stage_list:
        raise ValueError("stages: need at least one stage")
    for d, r0, r1 in stage_list:
        if d <= 0 or r0 < 0 or r1 < 0:
            raise ValueError(f"stages: duration must be > 0 and rates >= 0, got {(d, r0, r1)}")
    if stage_list[-1][2] <= 0 and n is not None:
        raise ValueError("stages: the last stage must end at a rate > 0 when bounded by a count")
    if base not in ("poisson", "constant"):
        raise ValueError(f"stages: base must be poisson or constant, got {base!r}")
    if n is None and duration_ns is None:
        duration_ns = sum(d for d, _, _ in stage_list)
    if (n is None) == (duration_ns is None):
        raise ValueError("give exactly one of n or duration_ns")
    dur_s = np.array([d / NS_PER_S for d, _, _ in stage_list])
    a = np.array([r0 for _, r0, _ in stage_list], dtype=np.float64)
    b = np.array([(r1 - r0) / (d / NS_PER_S) for d, r0, r1 in stage_list])  # rate slope per s
    mass = a * dur_s + b * dur_s ** 2 / 2                                     # events per stage
    start_mass = np.concatenate(([0.0], np.cumsum(mass)))
    start_s = np.concatenate(([0.0], np.cumsum(dur_s)))
    rng = np.random.default_rng(seed)

    def masses(k: int, first: float) -> np.ndarray:
        gaps = rng.exponential(1.0, k) if base == "poisson" else np.ones(k)
        return first + np.concatenate(([0.0], np.cumsum(gaps)[:-1]))

    def invert(m: np.ndarray) -> np.ndarray:
        k = np.clip(np.searchsorted(start_mass, m, side="right") - 1, 0, len(mass))
        out = np.empty(len(m))
        tail = k >= len(mass)
        last_rate = stage_list[-1][2]
        out[tail] = start_s[-1] + (m[tail] - start_mass[-1]) / last_rate if last_rate > 0 else np.inf
        ki, x = k[~tail], m[~tail] - start_mass[k[~tail]]
        ai, bi = a[ki], b[ki]
        # Solve ai*t + bi*t^2/2 = x for t >= 0; the form 2x / (a + sqrt(a^2 + 2bx)) is stable for b -> 0.
        root = np.sqrt(np.maximum(ai * ai + 2 * bi * x, 0.0))
        with np.errstate(divide="ignore", invalid="ignore"):
            t = np.where(ai + root > 0, 2 * x / (ai + root), 0.0)
        out[~tail] = start_s[ki] + t
        return out

    # The first event is at mass 0, i.e. t = 0 unless the run opens with a pause (rate 0).
    if n is not None:
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        t_s = invert(masses(n, 0.0)) if n else np.zeros(0)
    else:
        assert duration_ns is not None  # exactly one of the two is given (checked above)
        total_mass = float(start_mass[-1]) + (max(0.0, duration_ns / NS_PER_S - start_s[-1])
                                              * stage_list[-1][2])
        k = int(total_mass + 6 * total_mass ** 0.5 + 16)
        m = masses(k, 0.0)
        while m[-1] < total_mass:  # rare: extend until the mass is covered
            m = np.concatenate((m, masses(k, m[-1] + (rng.exponential() if base == "poisson" else 1.0))))
        t_s = invert(m[m <= total_mass])
    offsets = np.rint(t_s * NS_PER_S).astype(np.int64)
    if duration_ns is not None:
        offsets = offsets[offsets < duration_ns]
    return offsets


def ramp(rate_from_per_s: float, rate_to_per_s: float, ramp_ns: int, *, seed: int, base: str = "poisson",
         n: int | None = None, duration_ns: int | None = None) -> np.ndarray:
    """Rate rising (or falling) linearly from rate_from to rate_to over ramp_ns, then holding rate_to."""
    if n is None and duration_ns is None:
        duration_ns = ramp_ns
    return stages([(ramp_ns, rate_from_per_s, rate_to_per_s)], seed=seed, base=base, n=n,
                  duration_ns=duration_ns)


def replay(trace_ns: np.ndarray, *, time_scale: float | None = None, rate_per_s: float | None = None,
           start_ns: int = 0, limit: int | None = None, duration_ns: int | None = None) -> np.ndarray:
    """Replay a trace's timestamps (int64 ns, sorted; any origin). Returns sorted offsets from 0.

    Rule, in this order:
    1. window: keep the timestamps t with t - t_first >= start_ns (start offset, in trace time), then the
       first `limit` of those;
    2. origin: subtract the first kept timestamp, so the first request is at 0;
    3. scale: every offset is multiplied by one factor f, so the shape of the inter-arrival gaps (their
       ratios, burstiness, CV) is kept exactly:
         - time_scale X: f = X (2 = twice as slow, 0.5 = twice as fast); f = 1 is integer arithmetic,
           so the trace's gaps come back bit for bit;
         - rate_per_s R: f = (k - 1) / (span_s * R), where span_s is the kept span and k the kept count,
           i.e. the trace's mean gap is stretched to 1/R, so the offered mean rate (k - 1) / span is R;
       give at most one of them (neither = time_scale 1);
    4. bound: with duration_ns, offsets >= duration_ns are dropped (after scaling).
    """
    if time_scale is not None and rate_per_s is not None:
        raise ValueError("replay: give time_scale or rate_per_s, not both")
    if time_scale is not None and not time_scale > 0:
        raise ValueError(f"replay: time_scale must be > 0, got {time_scale}")
    if rate_per_s is not None:
        _check_rate(rate_per_s)
    if start_ns < 0:
        raise ValueError(f"replay: start offset must be >= 0, got {start_ns}")
    t = np.asarray(trace_ns, dtype=np.int64)
    if len(t) and np.any(np.diff(t) < 0):
        raise ValueError("replay: trace timestamps must be sorted")
    if len(t) == 0:
        return t.copy()
    t = t[t - t[0] >= start_ns]
    if limit is not None:
        t = t[:limit]
    if len(t) == 0:
        return t.copy()
    rel = t - t[0]
    if rate_per_s is not None:
        if len(rel) < 2 or rel[-1] == 0:
            raise ValueError("replay: a target rate needs at least two requests at different times")
        f = (len(rel) - 1) / ((rel[-1] / NS_PER_S) * rate_per_s)
    else:
        f = 1.0 if time_scale is None else float(time_scale)
    out = rel if f == 1.0 else np.rint(rel.astype(np.float64) * f).astype(np.int64)
    if duration_ns is not None:
        out = out[out < duration_ns]
    return out

