"""Requests the workload abandoned ([abandon]: users closing the tab), and whether the server freed them.

summary.json `abandoned` (None when no row had an abandonment point):
    planned            measured rows with a point (abandon_after_ns or abandon_after_tokens set)
    abandoned          of them, cut off by the client (outcome `abandoned`)
    finished_first     of them, ended before their point (ok or an error): never cut
    by                 "time" | "tokens": what the points are
    with_first_token   abandoned rows that had received a first token
    output_tokens      abandoned rows' tokens received: p50 and max (None when none)
    server_slots       did the server free an abandoned request's slot? (None without --scrape-metrics)

server_slots compares, at every /metrics scrape from the first abandonment to the end of the run, the
requests the server holds (its running + waiting gauges, summed over label sets: probe/scrape.py's names)
with the requests the client holds open at that moment (dispatched and not yet done, warm-up included):
    scrapes       the scrapes compared
    excess_mean   mean of (server's - client's), requests: ~0 when the server frees a closed request's slot
    excess_max    its largest value
    freed         excess_mean < FREED_BELOW: on average less than half a request more on the server than
                  the client has open. A server that keeps generating for a closed connection holds about
                  as many extra requests as it has abandoned ones still decoding.
"""
from __future__ import annotations

import numpy as np
import polars as pl

from loadgen.probe.scrape import RUNNING, WAITING
from loadgen.results.folder import Json, Run

FREED_BELOW = 0.5   # requests, mean excess


def section(run: Run, measured: pl.DataFrame) -> Json | None:
    """measured: the run's rows without warm-up (as summary.summarize reads them)."""
    if "abandon_after_ns" not in measured.columns:
        return None
    planned = measured.filter(pl.col("abandon_after_ns").is_not_null() | pl.col("abandon_after_tokens").is_not_null())
    if not planned.height:
        return None
    cut = planned.filter(pl.col("outcome") == "abandoned")
    tokens = cut["output_tokens"].drop_nulls()
    return {"planned": planned.height, "abandoned": cut.height, "finished_first": planned.height - cut.height,
            "by": "time" if planned["abandon_after_ns"].is_not_null().any() else "tokens",
            "with_first_token": int(cut["first_token_ns"].is_not_null().sum()),
            "output_tokens": ({"p50": float(tokens.median()), "max": int(tokens.max())}  # type: ignore[arg-type]
                              if tokens.len() else None),
            "server_slots": server_slots(run.server_metrics(), run.requests, cut)}


def server_slots(scraped: pl.DataFrame | None, requests: pl.DataFrame, cut: pl.DataFrame) -> Json | None:
    if scraped is None or not cut.height or cut["done_ns"].is_null().all():
        return None
    held = (scraped.filter(pl.col("name").is_in([*RUNNING, *WAITING]))
            .group_by("t_ns").agg(pl.col("value").sum()).sort("t_ns"))
    sent = requests["dispatched_ns"].drop_nulls().sort().to_numpy()
    done = requests.filter(pl.col("dispatched_ns").is_not_null())["done_ns"].drop_nulls().sort().to_numpy()
    start, end = cut["done_ns"].min(), requests["done_ns"].max()
    held = held.filter(pl.col("t_ns").is_between(start, end))
    if not held.height:
        return None
    t = held["t_ns"].to_numpy()
    open_at = np.searchsorted(sent, t, side="right") - np.searchsorted(done, t, side="right")
    excess = held["value"].to_numpy() - open_at
    mean = float(excess.mean())
    return {"scrapes": int(t.size), "excess_mean": mean, "excess_max": float(excess.max()),
            "freed": mean < FREED_BELOW}
