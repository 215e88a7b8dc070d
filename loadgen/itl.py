"""The per-token ITL rule, vectorized (numpy); used by the live histograms and by the summary.

Chunks are given sorted by owner (request) then time. Chunks of one owner with the same stamp arrived
in one read and form one group of k = the sum of their tokens; groups with k = 0 are skipped; each gap
between a group and the previous group of the same owner counts as k samples of gap / k. So a request's
samples sum to last_token - first_token, a k-token chunk is not one long gap, and chunks read together
are never a run of zero gaps. The first group's own tokens have no gap before them and add no sample.
"""
from __future__ import annotations

import numpy as np


def itl_samples_ns(t_ns: np.ndarray, n_tokens: np.ndarray, owner: np.ndarray) -> np.ndarray:
    # Per-token ITL samples in ns (float64), under the rule in the module comment.
    if t_ns.size == 0:
        return np.empty(0)
    new_group = np.ones(t_ns.size, dtype=bool)
    new_group[1:] = (t_ns[1:] != t_ns[:-1]) | (owner[1:] != owner[:-1])
    starts = np.flatnonzero(new_group)
    k = np.add.reduceat(n_tokens.astype(np.int64), starts)
    g_t, g_owner = t_ns[starts], owner[starts]
    keep = k > 0
    k, g_t, g_owner = k[keep], g_t[keep], g_owner[keep]
    if k.size < 2:
        return np.empty(0)
    same = g_owner[1:] == g_owner[:-1]
    gap, kk = (g_t[1:] - g_t[:-1])[same], k[1:][same]
    return np.repeat(gap / kk, kk)
