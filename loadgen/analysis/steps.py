"""When did the server start a request's prefill? An estimate from engine step boundaries seen by the client.

A continuous-batching engine emits one token per running stream at the end of every step, so the
client sees steps as clusters of chunk stamps (stamps closer than `cluster_ns` form one cluster, and a
cut no stream crosses within MERGE_FRACTION x max(median stream gap, the step before) of the previous
one is undone: a
busy client reads one step's chunks over several ms; the earliest stamp is the boundary B_i; step i
lasts D_i = B_i - B_{i-1}). Prefill work makes a step
longer than a decode-only step, so each step has an excess X_i = max(0, D_i - base_i), base_i = the
BASE_Q quantile of the step durations around it (ROLLING steps): its decode-only duration.
A request's prefill ends with the step k that emits its first token f. Walking back from k, its
prefill started at the latest boundary B_j (j <= k - 1: at least one step) such that the excess of
steps j+1..k covers SLACK x its compute, compute = prefill_idle(L) - prefill_idle(0) (the idle fit
without its constant: step overhead and network). One step for a prompt that fits the step budget;
several for a chunked one. The walk never goes back further than CAP x prefill_idle(L) before f (an
excess too small to see, e.g. a short prompt, must not drag the start back to an old boundary), and
always at least one step. Then
    scheduled ~= max(sent, B_j)        (sent: the request was fully written; an idle engine starts at once)
prefill_idle(L) comes from the idle-server calibration (loadgen/probe/calibrate.py). Both sides of f - B_j are client
read stamps, so the network delay cancels.
"""
from __future__ import annotations

import numpy as np
import polars as pl

SLACK = 0.75
CAP = 3.0
BASE_Q = 0.1
ROLLING = 64


MERGE_FRACTION = 0.5


def _labels(t_ns: np.ndarray, owner: np.ndarray, cluster_ns: int) -> np.ndarray:
    """Step label per stamp (stamps sorted by time). First cut wherever consecutive stamps are more than
    cluster_ns apart; then undo a cut that no stream confirms (no stream has its previous stamp in the
    cluster just before: one token per stream per step, so a real step boundary is crossed by every
    stream decoding across it) when it comes less than MERGE_FRACTION x the median stream gap, or x the
    step before, after the previous cut: a busy client's (or server's) writes and reads of one step spread
    over a few ms and can leave gaps > cluster_ns."""
    lab = np.concatenate(([0], np.cumsum(np.diff(t_ns) > cluster_ns)))
    order = np.lexsort((t_ns, owner))  # by stream, then time
    same = owner[order][1:] == owner[order][:-1]
    gaps = np.diff(t_ns[order])[same]
    gap_ns = float(np.median(gaps)) if gaps.size else 0.0
    for _ in range(4):
        prev = np.full(len(t_ns), -2)
        prev[order[1:][same]] = lab[order[:-1][same]]
        n = int(lab[-1]) + 1
        confirmed = np.zeros(n, dtype=bool)
        confirmed[lab[prev == lab - 1]] = True
        start = t_ns[np.flatnonzero(np.diff(lab, prepend=-1))]  # labels rise with time: first stamp of each
        step = np.diff(start)
        prev_step = np.concatenate(([0], step[:-1]))  # the duration of the step before the cut's
        keep = np.ones(n, dtype=bool)
        keep[1:] = confirmed[1:] | (step >= MERGE_FRACTION * np.maximum(gap_ns, prev_step))
        if keep.all():
            break
        lab = np.cumsum(keep)[lab] - 1
    return lab


def boundaries(tokens: pl.DataFrame, cluster_ns: int) -> pl.DataFrame:
    """b_ns (sorted step starts, as the earliest stamp of each step's cluster) and x_ns, the excess of
    the step ending there."""
    t = tokens.select("request_id", "t_ns").sort("t_ns")
    t_ns = t["t_ns"].to_numpy()
    if len(t_ns) == 0:
        return pl.DataFrame({"b_ns": [], "x_ns": []}, schema={"b_ns": pl.Int64, "x_ns": pl.Float64})
    owner = t["request_id"].cast(pl.Categorical).to_physical().to_numpy()
    lab = _labels(t_ns, owner, cluster_ns)
    first = np.concatenate(([True], lab[1:] != lab[:-1]))
    b = (pl.DataFrame({"b_ns": t_ns[first]}).lazy()
         .with_columns(d_ns=pl.col("b_ns").diff())  # null for the first: no step ends there
         .with_columns(base=pl.col("d_ns").cast(pl.Float64).rolling_quantile(
             BASE_Q, interpolation="lower", window_size=ROLLING, min_samples=1, center=True))
         .with_columns(x_ns=(pl.col("d_ns") - pl.col("base")).clip(lower_bound=0).fill_null(0)))
    return b.collect()


def scheduled_ns(b: pl.DataFrame, req: pl.DataFrame, compute_ms: pl.Expr, idle_ms: pl.Expr) -> np.ndarray:
    """b: boundaries(); req: first_token_ns, sent_ns (or connected/dispatched); compute_ms: the prefill's
    idle compute; idle_ms: its whole idle prefill time.
    Returns the estimated scheduling time (ns) per row of req, in req's order."""
    B = b["b_ns"].to_numpy()
    P = np.cumsum(b["x_ns"].to_numpy())  # P[i]: excess of steps 1..i
    r = req.select(pl.col("first_token_ns"), pl.coalesce("sent_ns", "connected_ns", "dispatched_ns").alias("sent"),
                   (compute_ms * 1e6 * SLACK).alias("need"), (idle_ms * 1e6 * CAP).alias("cap"))
    f, sent, need, cap = (r[c].to_numpy() for c in ("first_token_ns", "sent", "need", "cap"))
    if len(B) == 0:
        return sent
    k = np.searchsorted(B, f, side="right") - 1                 # f's own cluster
    pk = np.where(k >= 0, P[np.clip(k, 0, None)], 0.0)
    j = np.searchsorted(P, pk - need, side="right") - 1          # latest j with P[j] <= P[k] - need
    j_min = np.searchsorted(B, f - cap, side="left")             # first boundary within the cap
    j = np.minimum(np.maximum(j, j_min), k - 1)
    start = np.where(j >= 0, B[np.clip(j, 0, None)], np.iinfo(np.int64).min)
    return np.maximum(sent, start)
