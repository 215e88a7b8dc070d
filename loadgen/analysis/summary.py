"""The run summary: counts, rates, and latency distributions (the `summary.json` contract).

Definitions (all from requests.parquet / tokens.parquet; warm-up rows excluded; latencies from ok rows):
- send_lag = dispatched - intended (every dispatched row)   ttft = first_token - intended
- connect = connected - dispatched (every row with a connection; ~0 on a reused one): connection set-up
  is client/network time, never server time, so it is reported on its own
- ttft_from_send = first_token - dispatched                  e2e = last_token - intended
- tpot = (last_token - first_token) / (output_tokens - 1), rows with output_tokens > 1
- itl, per token: consecutive chunks of a request with the same t_ns arrived in one read and form one
  group; each gap between a group and the one before it counts as k samples of gap/k, k = the group's
  tokens. So a request's ITL samples sum exactly to last_token - first_token, a chunk of k tokens is
  not one long gap, and chunks read together are never a run of zero gaps. The first group's own
  tokens have no gap before them and add no sample.
- offered rate = (n - 1) / span of intended times; achieved = the same over dispatch times.
- throughput: ok requests and their output tokens over [first intended, last done].
Percentiles are exact (linear interpolation) over all samples, not histogram estimates.
`histograms` reads the run's HdrHistogram interval logs back (`<metric>.hlog`, and the logs of other
workers `<metric>.<worker>.hlog`, merged exactly): counts, out-of-range counts (values the histograms
could not hold: negative or above 1 h) and HDR percentiles, a cross-check of the exact ones above.
`generator` is the run's self-check from the manifest (selfcheck.py).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl

from loadgen import hdr
from loadgen.analysis import completeness
from loadgen.itl import itl_samples_ns
from loadgen.results import ResultsError, Run

METRICS = ("send_lag", "ttft", "ttft_from_send", "itl", "tpot", "e2e", "connect")
STATS = ("p50", "p90", "p99", "p999", "max", "mean")
_Q = {"p50": 0.5, "p90": 0.9, "p99": 0.99, "p999": 0.999}


def measured(run: Run) -> pl.DataFrame:
    return run.requests.filter(~pl.col("warmup"))


def latency_columns(requests: pl.LazyFrame | pl.DataFrame):
    ns = 1e6
    return requests.with_columns(
        send_lag=(pl.col("dispatched_ns") - pl.col("intended_ns")) / ns,
        connect=(pl.col("connected_ns") - pl.col("dispatched_ns")) / ns,
        ttft=(pl.col("first_token_ns") - pl.col("intended_ns")) / ns,
        ttft_from_send=(pl.col("first_token_ns") - pl.col("dispatched_ns")) / ns,
        e2e=(pl.col("last_token_ns") - pl.col("intended_ns")) / ns,
        tpot=pl.when(pl.col("output_tokens") > 1)
        .then((pl.col("last_token_ns") - pl.col("first_token_ns")) / (pl.col("output_tokens") - 1) / ns),
    )


def itl_ms(tokens: pl.DataFrame, request_ids: pl.Series) -> pl.Series:
    """Per-token ITL samples in ms, under the rule in the module comment (loadgen/itl.py, vectorized)."""
    owners = pl.DataFrame({"request_id": request_ids.cast(pl.String)}).with_row_index("o")
    df = (tokens.lazy().join(owners.lazy(), on="request_id", how="inner")
          .sort("o", "t_ns").select("o", "t_ns", "n_tokens").collect())
    samples = itl_samples_ns(df["t_ns"].to_numpy(), df["n_tokens"].to_numpy(), df["o"].to_numpy())
    return pl.Series("itl", samples / 1e6)


def distribution(values: pl.Series) -> dict[str, float | None]:
    v = values.drop_nulls().cast(pl.Float64).to_numpy()
    if v.size == 0:
        return {s: None for s in STATS}
    qs = np.quantile(v, list(_Q.values()))  # linear interpolation; one partition for all of them
    out = {name: float(q) for name, q in zip(_Q, qs)}
    out["max"], out["mean"] = float(v.max()), float(v.mean())
    return out


def _rate(times: pl.Series) -> float | None:
    t = times.drop_nulls()
    if t.len() < 2 or t.max() == t.min():
        return None
    return (t.len() - 1) * 1e9 / (t.max() - t.min())


def _status_reason(status: str | None, missing: dict | None = None) -> list[str]:
    if missing is not None and status not in ("complete", "invalid", "interrupted"):
        return [completeness.reason(missing)]
    return [] if status in ("complete", "invalid") else [f"run status is {status!r}"]


def summarize(run: Run) -> dict:
    req = latency_columns(measured(run))
    ok = req.filter(pl.col("outcome") == "ok")
    outcomes = dict(req.group_by("outcome").len().iter_rows())
    n, n_ok, n_dropped = req.height, ok.height, outcomes.get("dropped", 0)
    window_ns = None
    if n and req["done_ns"].drop_nulls().len():
        window_ns = req["done_ns"].max() - req["intended_ns"].min()
    per_s = (lambda x: x * 1e9 / window_ns) if window_ns else (lambda x: None)
    latency = {m: distribution(req[m] if m in ("send_lag", "connect") else ok[m]) for m in METRICS if m != "itl"}
    latency["itl"] = distribution(itl_ms(run.tokens, ok["request_id"]))
    manifest = run.manifest
    missing = completeness.lost(run)
    return {
        "run": {"path": str(run.path), "name": manifest.get("config", {}).get("name"),
                "status": manifest.get("status"), "target": manifest.get("target", {}).get("url")},
        "requests": {"scheduled": n, "ok": n_ok,  # cancelled rows were never sent: not failed
                     "failed": n - n_ok - n_dropped - outcomes.get("cancelled", 0), "dropped": n_dropped},
        "outcomes": outcomes,
        "rate": {"offered_per_s": _rate(req["intended_ns"]), "achieved_per_s": _rate(req["dispatched_ns"])},
        "throughput": {"output_tokens_per_s": per_s(int(ok["output_tokens"].sum() or 0)),
                       "requests_per_s": per_s(n_ok)},
        "latency_ms": {m: latency[m] for m in METRICS},
        "histograms": histograms(run.path),
        "generator": manifest.get("generator"),
        "valid": manifest.get("status") == "complete",
        "invalid_reasons": list(manifest.get("invalid_reasons", [])) + _status_reason(manifest.get("status"),
                                                                                      missing),
        "lost": missing,
    }


def histograms(run_dir: str | Path) -> dict[str, dict] | None:
    """Per metric, the HDR summary (ms) of its interval logs, all workers merged; None without logs."""
    p = Path(run_dir)
    out = {}
    for m in hdr.METRICS:
        logs = sorted({*p.glob(f"{m}.hlog"), *p.glob(f"{m}.*.hlog")})
        if logs:
            try:
                out[m] = hdr.summary_ms(hdr.merge_logs(logs))
            except ValueError as e:  # a damaged line, named by file and line
                raise ResultsError(f"{e}\n(the interval logs are damaged; requests.parquet is not: move the "
                                   f"damaged .hlog aside to report without it)") from None
    return out or None
