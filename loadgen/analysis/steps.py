"""When did the server start a request's prefill? An estimate from engine step boundaries seen by the client.

A continuous-batching engine emits one token per running stream at the end of every step, so the
client sees steps as clusters of chunk stamps (stamps closer than `cluster_ns` form one cluster; its
earliest stamp is the boundary). A request's prefill ends with the step that emits its first token f
and starts at a step boundary (or at its arrival, if the engine was idle). Rule, per request:
    B_prev  = the last boundary before f's own cluster        (the prefill took at least one step)
    B_prior = the last boundary at or before f - slack * prefill_idle(L)
                                                               (a long, chunked prefill spans several
                                                                steps, each at least as long as its chunk)
    scheduled ~= max(sent, min(B_prev, B_prior))              (sent: the request was fully written)
prefill_idle(L) comes from the idle-server calibration (calibrate.py). Both sides of f - B are client
read stamps, so the network delay cancels. Without other streams (idle server) there are no boundaries
in the way and scheduled = sent: queue 0, prefill = the server-side TTFT.
"""
from __future__ import annotations

import polars as pl

SLACK = 0.75


def boundaries(tokens: pl.DataFrame, cluster_ns: int) -> pl.DataFrame:
    """b_ns: the earliest stamp of each cluster of chunk stamps (sorted)."""
    t = tokens.lazy().select(pl.col("t_ns").unique().sort())
    return (t.with_columns(new=(pl.col("t_ns").diff().fill_null(cluster_ns + 1) > cluster_ns))
            .filter(pl.col("new")).select(pl.col("t_ns").alias("b_ns")).collect())


def scheduled_ns(tokens: pl.DataFrame, req: pl.DataFrame, idle_prefill_ms: pl.Expr,
                 cluster_ns: int = 1_000_000) -> pl.Series:
    """req: request_id, first_token_ns, sent_ns (or connected/dispatched), prompt_tokens. Returns the
    estimated scheduling time per row of req (same order)."""
    b = boundaries(tokens, cluster_ns)
    r = req.select(
        pl.int_range(pl.len()).alias("_i"), "first_token_ns",
        pl.coalesce("sent_ns", "connected_ns", "dispatched_ns").alias("_sent"),
        (pl.col("first_token_ns") - (SLACK * idle_prefill_ms * 1e6).round().cast(pl.Int64)).alias("_prior_at"),
    )
    # f's own cluster starts at the last boundary <= f; the boundary before it is B_prev.
    b_idx = b.with_columns(pl.col("b_ns").shift(1).alias("b_before"))
    own = r.sort("first_token_ns").join_asof(b_idx, left_on="first_token_ns", right_on="b_ns",
                                             strategy="backward")
    prior = (r.sort("_prior_at").join_asof(b.rename({"b_ns": "b_prior"}), left_on="_prior_at",
                                           right_on="b_prior", strategy="backward")
             .select("_i", "b_prior"))
    out = own.join(prior, on="_i").sort("_i").select(
        pl.max_horizontal("_sent", pl.min_horizontal("b_before", "b_prior")).alias("scheduled_ns"))
    return out["scheduled_ns"]
