"""Moving-block bootstrap of run statistics (pure numpy; used by `loadgen compare`).

Resampling unit: the request. A resample draws ceil(n / block) blocks of `block` consecutive requests
(in intended-send order, start uniform) and keeps the first n. Blocks, because neighbouring requests
share queue and batch states (their latencies are correlated, so resampling single requests would
understate the spread); block = ceil(n^(1/3)), the usual order for the moving-block bootstrap. A
request carries everything measured on it: its ITL samples are resampled together with it (a
cluster), never token by token. Failed requests are resampled too (NaN latency: they change how many
latency values a resample has, as they did in the run).

Percentiles are nearest rank (the ceil(p*m)-th smallest of the m values present: metrics.rank).
"""
from __future__ import annotations

import math

import numpy as np

from loadgen import metrics

RESAMPLES = 1000
CONFIDENCE = 0.95


def block_length(n: int) -> int:
    return max(1, math.ceil(n ** (1 / 3)))


def block_indices(n: int, resamples: int, rng: np.random.Generator, block: int | None = None) -> np.ndarray:
    """(resamples, n) int64 row indices of moving-block resamples of range(n)."""
    if n == 0:
        return np.zeros((resamples, 0), dtype=np.int64)
    b = min(block or block_length(n), n)
    k = math.ceil(n / b)
    starts = rng.integers(0, n - b + 1, size=(resamples, k))
    return (starts[:, :, None] + np.arange(b)).reshape(resamples, k * b)[:, :n]


def nearest_rank_rows(values: np.ndarray, p: float | None) -> np.ndarray:
    """Per row of a (B, n) matrix (NaN = absent): the nearest-rank p-quantile, or the mean if p is None."""
    if p is None:
        present = ~np.isnan(values)
        m = present.sum(axis=1)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(m > 0, np.where(present, values, 0.0).sum(axis=1) / m, np.nan)
    v = np.sort(values, axis=1)  # NaN sort last
    m = np.sum(~np.isnan(v), axis=1)
    k = np.clip(metrics.ranks(p, m) - 1, 0, max(v.shape[1] - 1, 0))
    out = v[np.arange(v.shape[0]), k] if v.shape[1] else np.full(v.shape[0], np.nan)
    return np.where(m > 0, out, np.nan)


def stat(values: np.ndarray, p: float | None) -> float:
    return float(nearest_rank_rows(np.asarray(values, dtype=np.float64)[None, :], p)[0])


def per_request(values: np.ndarray, p: float | None, idx: np.ndarray) -> np.ndarray:
    """The statistic of a per-request value (NaN = no value) over each resample."""
    return nearest_rank_rows(np.asarray(values, dtype=np.float64)[idx], p)


def clustered(samples: np.ndarray, owner: np.ndarray, n: int, p: float | None, idx: np.ndarray) -> np.ndarray:
    """The statistic of samples owned by requests (e.g. ITL: owner = request position, 0..n-1), each
    resample taking all samples of every request it draws."""
    order = np.argsort(owner, kind="stable")
    samples, owner = np.asarray(samples, dtype=np.float64)[order], owner[order]
    counts = np.bincount(owner, minlength=n).astype(np.int64)
    starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
    out = np.empty(idx.shape[0])
    for b, rows in enumerate(idx):
        c = counts[rows]
        total = int(c.sum())
        if total == 0:
            out[b] = np.nan
            continue
        pos = np.repeat(starts[rows] - (np.cumsum(c) - c), c) + np.arange(total)
        v = samples[pos]
        out[b] = float(v.mean()) if p is None else metrics.quantiles(v, (p,))[0]
    return out


def ratio(numer: np.ndarray, denom: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """sum(numer) / sum(denom) over each resample (throughput: counts over inter-completion intervals)."""
    d = np.asarray(denom, dtype=np.float64)[idx].sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(d > 0, np.asarray(numer, dtype=np.float64)[idx].sum(axis=1) / d, np.nan)


def interval(draws: np.ndarray, confidence: float = CONFIDENCE) -> list[float | None]:
    d = draws[~np.isnan(draws)]
    if d.size == 0:
        return [None, None]
    lo, hi = np.quantile(d, [(1 - confidence) / 2, (1 + confidence) / 2])
    return [float(lo), float(hi)]
