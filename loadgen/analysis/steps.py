"""When did the server start a request's prefill? An estimate from engine step boundaries seen by the client.

A continuous-batching engine emits one token per running stream at the end of every step, so the
client sees steps as clusters of chunk stamps (stamps closer than `cluster_ns` form one cluster; its
earliest stamp is the boundary B_i; step i lasts D_i = B_i - B_{i-1}). Prefill work makes a step
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
prefill_idle(L) comes from the idle-server calibration (loadgen/calibrate.py). Both sides of f - B_j are client
read stamps, so the network delay cancels.
"""
from __future__ import annotations

import numpy as np
import polars as pl

SLACK = 0.75
CAP = 3.0
BASE_Q = 0.1
ROLLING = 64


def boundaries(tokens: pl.DataFrame, cluster_ns: int) -> pl.DataFrame:
    """b_ns (sorted cluster starts) and x_ns, the excess of the step ending there."""
    b = (tokens.lazy().select(pl.col("t_ns").unique().sort())
         .with_columns(new=(pl.col("t_ns").diff().fill_null(cluster_ns + 1) > cluster_ns))
         .filter(pl.col("new")).select(pl.col("t_ns").alias("b_ns"))
         .with_columns(d_ns=pl.col("b_ns").diff())  # null for the first: no step ends there
         .with_columns(base=pl.col("d_ns").cast(pl.Float64).rolling_quantile(
             BASE_Q, interpolation="lower", window_size=ROLLING, min_samples=1, center=True))
         .with_columns(x_ns=(pl.col("d_ns") - pl.col("base")).clip(lower_bound=0).fill_null(0)))
    return b.collect()


def scheduled_ns(tokens: pl.DataFrame, req: pl.DataFrame, compute_ms: pl.Expr, idle_ms: pl.Expr,
                 cluster_ns: int = 1_000_000) -> np.ndarray:
    """req: first_token_ns, sent_ns (or connected/dispatched); compute_ms: the prefill's idle compute;
    idle_ms: its whole idle prefill time.
    Returns the estimated scheduling time (ns) per row of req, in req's order."""
    b = boundaries(tokens, cluster_ns)
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
