"""The seeded sampler of token-length distributions (the spec and its parser: loadgen/config/lengths.py).
Pure: a spec and a seed in, an int64 array out."""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

from loadgen.config.lengths import DEFAULT_MAX, Lengths

def sample(spec: Lengths, n: int, seed: np.random.SeedSequence,
           trace_lengths: Callable[[Lengths], np.ndarray] | None = None) -> np.ndarray:
    """n lengths (int64, >= 1). `trace_lengths(spec)` supplies an empirical trace's column."""
    rng = np.random.default_rng(seed)
    if spec.dist == "fixed":
        return np.full(n, spec.value, dtype=np.int64)
    if spec.dist == "uniform":
        return rng.integers(spec.min, spec.max + 1, n, dtype=np.int64)
    if spec.dist == "cycle":
        return np.resize(np.asarray(spec.values, dtype=np.int64), n)
    raw: np.ndarray
    if spec.dist == "normal":
        raw = rng.normal(spec.mean, spec.sd, n)
    elif spec.dist == "lognormal":
        raw = rng.lognormal(np.log(spec.median), spec.sigma, n)
    elif spec.dist == "empirical":
        if spec.values:
            pool = np.asarray(spec.values, dtype=np.int64)
        elif trace_lengths is None:
            raise ValueError(f"empirical lengths from {spec.trace}: no trace reader given to sample them")
        else:
            pool = trace_lengths(spec)
        if len(pool) == 0:
            raise ValueError(f"empirical lengths from {spec.trace}: the trace has no rows")
        raw = pool[rng.integers(0, len(pool), n)]
    else:  # mixture: pick a component per request, then draw each component from its own sub-seed
        pick = rng.choice(len(spec.components), n, p=np.asarray(spec.weights))
        raw = np.zeros(n, dtype=np.int64)
        for j, comp in enumerate(spec.components):
            mask = pick == j
            raw[mask] = sample(comp, n, child_seed(seed, j), trace_lengths)[mask]
    hi = spec.max or DEFAULT_MAX
    return np.clip(np.rint(raw), max(1, spec.min), hi).astype(np.int64)


def pick_classes(weights: tuple[float, ...], n: int, seed: np.random.SeedSequence) -> np.ndarray:
    """The class of each request for joint `[[mix]]` lengths."""
    return np.random.default_rng(seed).choice(len(weights), n, p=np.asarray(weights))


def child_seed(seed: np.random.SeedSequence, j: int) -> np.random.SeedSequence:
    # Like seed.spawn() but stateless: the same parent always gives the same j-th child.
    return np.random.SeedSequence(seed.entropy, spawn_key=(*seed.spawn_key, j))
