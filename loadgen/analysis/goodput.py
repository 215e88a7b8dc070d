"""Service-level objectives, attainment and goodput (DistServe's definition: requests per second that
meet every SLO).

An SLO spec is `--slo ttft=500ms,tpot=50ms[,ttfa=2s,e2e=2s,itl_p99=80ms]`: upper bounds, each on one
per-request value (loadgen.metrics.latency_columns defines ttft, ttfa, tpot, e2e):
  ttft      first_token - intended (so a request that waited in the client or the server counts)
  ttfa      first_answer - intended: a request whose stream had no answer (all reasoning) misses it
  tpot      (last_token - first_token) / (output_tokens - 1)
  e2e       last_token - intended
  itl_p99   the request's own p99 inter-token latency (nearest rank over its per-token ITL samples)
A bound given for a [[mix]] class (`ttft=200ms@interactive`, config/slo.py) holds for that class's
requests (the `class` column) instead of the plain bound; a metric bounded only for some classes does not
bound the others. A request meets the SLOs when it ended `ok` and every value bounded for it is <= its
bound. tpot and itl_p99
are vacuously met by a request with a single output token (it has no gap). Failed, dropped and timed-out
requests meet nothing: attainment = met / measured requests (warm-up and `abandoned` rows excluded: a
request its user gave up on by plan is neither met nor missed), and
goodput = met / the throughput window (first intended send .. last done, the same window as throughput).

Adds to summary.json (only when an SLO is given, on `report --slo` or recorded by `run --slo`):
    slo       {"ttft_ms": 500.0, "tpot_ms": 50.0, "ttft_ms@interactive": 200.0, ...}
    goodput   {"attainment", "requests_per_s", "met", "requests", "attainment_by_slo": {metric: share}}
(and per class, per model in summary.json `breakdown`: analysis/breakdown.py)
"""
from __future__ import annotations

import numpy as np
import polars as pl

from loadgen import metrics
from loadgen.config.slo import slo_keys, split_slo_key
from loadgen.results.folder import GoodputSection


def nearest_rank(values: np.ndarray, p: float) -> float:
    return metrics.quantiles(values, (p,))[0]


def request_itl_samples_ms(tokens: pl.DataFrame, request_ids: pl.Series) -> tuple[np.ndarray, np.ndarray]:
    """Per-token ITL samples (ms) of the given requests and, per sample, the position of its request in
    request_ids, sorted by that position (the ITL rule of loadgen/metrics.py)."""
    ids = request_ids.cast(pl.String)
    owners = pl.DataFrame({"request_id": ids}).with_row_index("o")
    g = (metrics.request_gaps(tokens.filter(pl.col("request_id").is_in(ids.implode())))
         .join(owners, on="request_id").sort("o", "t_ns"))
    k = g["k"].to_numpy()
    owner = np.repeat(g["o"].to_numpy().astype(np.int64), k)
    return np.repeat(g["gap_ns"].to_numpy() / k, k) / metrics.NS_PER_MS, owner


def request_itl_p99_ms(tokens: pl.DataFrame, request_ids: pl.Series) -> pl.DataFrame:
    """request_id -> itl_p99 (ms), the p99 of each request's own per-token ITL samples (null without one)."""
    samples, owner = request_itl_samples_ms(tokens, request_ids)
    p99 = np.full(request_ids.len(), np.nan)
    if owner.size:
        bounds = np.flatnonzero(np.diff(owner)) + 1
        for lo, hi in zip(np.concatenate(([0], bounds)), np.concatenate((bounds, [owner.size]))):
            p99[owner[lo]] = nearest_rank(samples[lo:hi], 0.99)
    return pl.DataFrame({"request_id": request_ids.cast(pl.String), "itl_p99": p99}).with_columns(
        pl.col("itl_p99").fill_nan(None))


def bound_expr(slo_ms: dict[str, float], metric: str) -> pl.Expr:
    """Each row's bound on `metric` (ms): its class's own (`metric@class`), else the plain one, else null
    (not bounded for that row)."""
    plain = slo_ms.get(metric)
    expr = pl.lit(plain, pl.Float64) if plain is not None else pl.lit(None, pl.Float64)
    for key, v in slo_ms.items():
        m, cls = split_slo_key(key)
        if m == metric and cls is not None:
            expr = pl.when(pl.col("class") == cls).then(pl.lit(v, pl.Float64)).otherwise(expr)
    return expr


def slo_metrics(slo_ms: dict[str, float]) -> list[str]:
    """The metrics bounded, plain or for a class, in the order first given."""
    return list(dict.fromkeys(split_slo_key(k)[0] for k in slo_ms))


def meets(req: pl.DataFrame, tokens: pl.DataFrame, slo_ms: dict[str, float]) -> pl.DataFrame:
    """Per measured request (rows with latency_columns applied): `met` and one `met_<metric>` per bounded
    metric (true where the row's own bound does not bound it)."""
    names = slo_metrics(slo_ms)
    if "itl_p99" in names:  # row for row (request_itl_p99_ms keeps the order of the ids it is given)
        req = req.with_columns(itl_p99=request_itl_p99_ms(tokens, req["request_id"])["itl_p99"])
    ok = metrics.OK_ROWS
    cols = {}
    for m in names:
        value, bound = pl.col(m), bound_expr(slo_ms, m)
        vacuous = value.is_null() if m in ("tpot", "itl_p99") else pl.lit(False)
        cols[f"met_{m}"] = ok & (bound.is_null() | vacuous | (value <= bound)).fill_null(False)
    out = req.with_columns(**cols)
    return out.with_columns(met=pl.all_horizontal(*cols) if cols else ok)


def goodput(req: pl.DataFrame, tokens: pl.DataFrame, slo_ms: dict[str, float]) -> dict:
    """req: the measured rows with latency_columns applied (as in summarize)."""
    return attainment(meets(req.filter(pl.col("outcome") != "abandoned"), tokens, slo_ms), slo_ms)


def attainment(m: pl.DataFrame, slo_ms: dict[str, float]) -> dict:
    """The goodput figures of rows judged by meets() (all of them, or one class's or model's; abandoned rows
    already left out)."""
    n = m.height
    window_ns = None
    if n and m["done_ns"].drop_nulls().len():
        window_ns = metrics.number(m["done_ns"].max()) - metrics.number(m["intended_ns"].min())
    met = int(m["met"].sum()) if n else 0
    return {"attainment": met / n if n else None,
            "requests_per_s": met * 1e9 / window_ns if window_ns else None,
            "met": met, "requests": n,
            "attainment_by_slo": {k: (int(m[f"met_{k}"].sum()) / n if n else None) for k in slo_metrics(slo_ms)}}


def section(req: pl.DataFrame, tokens: pl.DataFrame, slo_ms: dict[str, float]) -> GoodputSection:
    return {"slo": slo_keys(slo_ms), "goodput": goodput(req, tokens, slo_ms)}
