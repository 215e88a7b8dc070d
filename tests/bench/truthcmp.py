"""Compare a client's stamps with the simulator's truth file (all times CLOCK_MONOTONIC ns, one host).

Errors, per request joined on X-Request-Id:
- ttft error = (client first token - client sent) - (truth first_token - truth arrival): how much the
  client's TTFT-from-send overstates the server's own TTFT (request transit + response transit + client
  delay in stamping the first token);
- per-gap ITL error = client gap between chunk i-1 and chunk i - truth gap between the same tokens
  (one token per chunk here), as an absolute value: a read that held two chunks shows as one gap too
  short and one too long, which is exactly the stamping error a per-gap ITL would suffer.
"""
from __future__ import annotations

import numpy as np
import polars as pl


def read_truth(path) -> pl.DataFrame:
    return pl.read_ndjson(path).select("request_id", "arrival_ns", "first_token_ns", "token_ns", "lateness_ns")


def _q(s: pl.Series | np.ndarray, qs=(0.5, 0.99)) -> list[float | None]:
    a = np.asarray(s, dtype=np.float64)
    a = a[~np.isnan(a)]
    return [float(np.quantile(a, q)) if a.size else None for q in qs]


def cv(times_ns) -> float | None:
    t = np.sort(np.asarray(times_ns, dtype=np.int64))
    if t.size < 3:
        return None
    g = np.diff(t).astype(np.float64)
    return float(g.std() / g.mean())


def rate(times_ns) -> float | None:
    t = np.asarray(times_ns, dtype=np.int64)
    return (t.size - 1) * 1e9 / float(t.max() - t.min()) if t.size > 1 and t.max() > t.min() else None


def compare(client: pl.DataFrame, chunks: pl.DataFrame, truth: pl.DataFrame) -> dict:
    """client: request_id, intended_ns, sent_ns (dispatch), first_ns (absolute); chunks: request_id,
    idx, t_ns (absolute, one token per chunk)."""
    lag_ms = (client["sent_ns"] - client["intended_ns"]).cast(pl.Float64) / 1e6
    j = client.join(truth, on="request_id", how="inner")
    ttft_err = ((j["first_ns"] - j["sent_ns"]) - (j["first_token_ns"] - j["arrival_ns"])).cast(pl.Float64) / 1e6
    tt = (truth.select("request_id", "token_ns").explode("token_ns")
          .with_columns(idx=pl.int_range(pl.len()).over("request_id")))
    g = (chunks.join(tt, on=["request_id", "idx"], how="inner").sort("request_id", "idx")
         .with_columns(cg=pl.col("t_ns").diff().over("request_id"), tg=pl.col("token_ns").diff().over("request_id"))
         .drop_nulls("cg"))
    itl_err = ((g["cg"] - g["tg"]).abs().cast(pl.Float64) / 1e6)
    late = truth["lateness_ns"].explode().drop_nulls().cast(pl.Float64) / 1e6
    lag50, lag99 = _q(lag_ms)
    t50, t99 = _q(ttft_err)
    i50, i99 = _q(itl_err)
    s50, s99 = _q(late)
    return {"requests": client.height, "completed_at_server": truth.height,
            "achieved_per_s": rate(client["sent_ns"].to_numpy()),
            "arrival_cv_at_server": cv(j["arrival_ns"].to_numpy()),  # the run's requests (not calibration)
            "send_lag_p50_ms": lag50, "send_lag_p99_ms": lag99,
            "ttft_err_p50_ms": t50, "ttft_err_p99_ms": t99,
            "itl_gap_err_p50_ms": i50, "itl_gap_err_p99_ms": i99, "itl_gaps": g.height,
            "sim_lateness_p50_ms": s50, "sim_lateness_p99_ms": s99,
            "sim_lateness_max_ms": float(late.max()) if late.len() else None}
