"""Where each request's time went: the one place that defines every component of the decomposition.

Inputs: requests.parquet and tokens.parquet (times int64 ns from t0), optionally calibration.json
(calibrate.py). Only ok, non-warm-up rows are decomposed. Every component is in ms; the client-side
ones (e2e, send_lag, slot_wait, connect, ttft, decode) are loadgen/metrics.py's definitions.

    e2e        = last_token - intended                       (what the user waited, from the plan)
    send_lag   = dispatched - intended - slot_wait           (the generator's own lateness)
    slot_wait  the wait for a --max-concurrency slot          (the user's cap; 0 without one)
    connect    = connected - dispatched                      (0 on a reused connection)
    queue      time the server held the request before it started its prefill
    prefill    time from the start of prefill to the first token
    decode     last token - first token
      decode_ideal       idle-server ITL x (output_tokens - 1): what decoding alone would have cost
      decode_stalls      extra time of gaps that overlap other requests' prefills (see stalls.py), at most
                         decode - decode_ideal less the client's measured read lateness
      decode_contention  decode - decode_ideal - decode_stalls: batching (a shared step is slower); not
                         clamped at 0: negative means decode_ideal was overstated (diagnose.py ideal_overstated)
    other      e2e - send_lag - slot_wait - connect - queue - prefill - decode: network, HTTP, tokenization,
               the server's own overhead (explicit residual, may be slightly negative from rounding)

`method` says how queue and prefill were obtained, best first:
    server_timings  the server reported them: vLLM's per-request `metrics` (queue_time_ms,
                    time_to_first_token_ms = scheduled -> first token, generation_time_ms), Ollama's
                    durations, llama.cpp's timings (backends/*.py fill server_*_ms). decode is the
                    server's decode time when given. Where only prefill is given (llama.cpp) the queue
                    is derived: ttft_from_send - connect - prefill.
    calibrated      an estimate from client-side sources: the engine's steps seen in every stream's
                    stamps (steps.py: a cluster of stamps ends a step), every request's send time and
                    prompt tokens, and prefill_idle(L) = a + b*L + c*L^2 fitted on the idle server before
                    the run (L = prompt tokens, loadgen/probe/calibrate.py; or from a fitted profile,
                    twin/fit_model.idle_calibration, `report --fitted-profile`). The prefill started when the
                    engine admitted the request, found by a replay of a FCFS continuous-batching
                    scheduler over those steps (replay.py: a token budget per step and a seat limit,
                    both fitted to the run as the pair that puts the most first tokens in the step the
                    client saw them in; warm-up requests take part). Where the replay reproduces the
                    request's first-token step ("matched"), its admission step is the start; else the
                    step-excess walk: the step boundary from which the steps' excess over a decode-only
                    step covers 0.75 x its idle compute (at least one step; several when chunked), or
                    the send if the engine was idle. prefill = first_token - that start (clipped to
                    [0, ttft_from_send - connect]); queue = ttft_from_send - connect - prefill.
                    Under load a prefill shares its step with other prompts and running decodes:
                    the steps put that slowdown in prefill, as the server's own clock would; a short
                    prompt admitted into the budget a long one left over, and chunked, counts the
                    steps it waited in as prefill too (the engine had scheduled it).
                    queue_uncertainty_ms: 0 where matched, else the window the stamps leave open (from
                    the first step start after the send to the start of the step producing the first
                    token): queue and prefill move by at most that, in opposite directions.
                    Left out of the replay (the walk then answers): KV-capacity waits, preemptions,
                    prefix-cache hits, a step with no stream to stamp it.
    none            no timings and no calibration (--no-calibrate): queue and prefill are null and the
                    whole server-side TTFT lands in `other`.
decode_ideal uses the calibrated idle decode time per token (decode_ms_per_token(L) = d + e*L, calibrate.py:
a per-request mean, stored as calibration.json `itl_ms`); without calibration, the p5 over requests
of their median gap (the fastest streams of the run), which overstates the ideal under steady load.
Server histograms (vllm:request_{queue,prefill,decode}_time_seconds deltas) are an aggregate
cross-check only: see `histogram_crosscheck`.
aggregate() adds queue_uncertainty_ms = sum of the rows' / n (a bound on the error of the mean queue and
prefill from unmatched rows; null without calibrated rows); explain adds `replay` {budget_tokens, seats
(null = no limit needed), matched_share (over every ok request, warm-up included)}.

"At p99" = the mean decomposition of the requests whose e2e (or ttft) is at or beyond its p99.
"""
from __future__ import annotations

import numpy as np
import polars as pl

from loadgen import metrics
from loadgen.analysis.stalls import ATTRIBUTION_REACH, StallRule, attribute_stalls
from loadgen.analysis import replay
from loadgen.analysis.steps import boundaries, scheduled_ns
from loadgen.probe.calibrate import DECODE_KEY
from loadgen.results.folder import Run

COMPONENTS = ("send_lag", "slot_wait", "connect", "queue", "prefill", "decode", "decode_ideal", "decode_contention",
              "decode_stalls", "other")
COLUMNS = ("request_id", "method", "e2e_ms", *(f"{c}_ms" for c in COMPONENTS), "stall_causes",
           "queue_uncertainty_ms")
# Context kept beside the contract columns (for windows and per-length tables).
EXTRA = ("intended_ns", "prompt_tokens", "output_tokens", "ttft_ms", "tpot_ms")
NS_PER_MS = 1e6
CLUSTER_NS = 1_000_000  # stamps closer than this are one step's (steps.py merges more where streams say so)


def _poly(coef: list[float], x: pl.Expr) -> pl.Expr:
    out = pl.lit(0.0)
    for i, c in enumerate(coef):
        out = out + float(c) * x.cast(pl.Float64) ** i
    return out


def decompose(run: Run, calibration: dict | None = None, rule: StallRule | None = None,
              replay_fit: dict | None = None) -> pl.DataFrame:
    # replay_fit: filled (when given) with the FCFS replay's fitted engine limits (calibrated method)
    req = run.requests.lazy().filter(~pl.col("warmup") & metrics.OK_ROWS
                                     & pl.col("first_token_ns").is_not_null())
    L = pl.coalesce("prompt_tokens", "planned_prompt_tokens")
    base = metrics.latency_columns(req, suffix="_ms").with_columns(
        L.alias("prompt_tokens"),
        connect_ms=pl.col("connect_ms").fill_null(0.0).clip(lower_bound=0),
        client_decode_ms=pl.col("decode_ms"),
    ).drop("decode_ms")
    server_side = pl.col("ttft_from_send_ms") - pl.col("connect_ms")  # server TTFT + network
    has_timings = pl.col("server_prefill_ms").is_not_null()
    if calibration:
        coef = calibration["prefill_ms"]["coef"]
        idle = _poly(coef, pl.col("prompt_tokens")).clip(lower_bound=0)
        compute = (idle - coef[0]).clip(lower_bound=0)
        collected = base.collect()
        b = boundaries(run.tokens, CLUSTER_NS)
        sched, unc, fit = _replayed(run, collected, b["b_ns"].to_numpy(), scheduled_ns(b, collected, compute, idle))
        del b
        base = collected.with_columns(scheduled_est_ns=pl.Series(sched, dtype=pl.Int64),
                                      _unc_ms=pl.Series(unc, dtype=pl.Float64)).lazy()
        del collected
        est_prefill = pl.min_horizontal(((pl.col("first_token_ns") - pl.col("scheduled_est_ns")) / NS_PER_MS),
                                        server_side).clip(lower_bound=0)
        # the idle server's decode ms per token at this prompt length (calibrate.py)
        decode_per_token = _poly(calibration[DECODE_KEY]["coef"], pl.col("prompt_tokens")).clip(lower_bound=0)
        fallback = "calibrated"
        base = base.with_columns(_idle_ms=idle)
    else:
        fit = None
        est_prefill = pl.lit(None, pl.Float64)
        decode_per_token = None
        fallback = "none"
    d = base.with_columns(
        method=pl.when(has_timings).then(pl.lit("server_timings")).otherwise(pl.lit(fallback)),
        prefill_ms=pl.when(has_timings).then(pl.col("server_prefill_ms")).otherwise(est_prefill),
        decode_ms=pl.coalesce("server_decode_ms", "client_decode_ms"),
    ).with_columns(
        queue_ms=pl.when(has_timings & pl.col("server_queue_ms").is_not_null())
        .then(pl.col("server_queue_ms"))
        .otherwise((server_side - pl.col("prefill_ms")).clip(lower_bound=0)),
    ).collect()
    g = metrics.gap_arrays(run.tokens, d["request_id"])  # shared by the ideal ITL and the stall attribution
    if decode_per_token is None:
        decode_per_token = pl.lit(_fastest_itl_ms(g))
    d = d.with_columns(decode_ideal_ms=(decode_per_token * (pl.col("output_tokens") - 1).clip(lower_bound=0)))
    if "_idle_ms" in d.columns:
        d = d.with_columns(attr_span_ms=pl.when(pl.col("method") == "calibrated")
                           .then(pl.max_horizontal("prefill_ms", ATTRIBUTION_REACH * pl.col("_idle_ms")))
                           .otherwise(pl.col("prefill_ms")))
    rule = rule or StallRule.for_run(run.manifest)
    stalls = attribute_stalls(run.tokens, d, rule, g)
    del g
    # sorted before the stall lists join it: sorting after would copy every list (GBs on a 10 M-chunk run)
    d = d.sort("intended_ns")
    # Stalls are at most the decode time beyond the ideal, less what the client's own read lateness can
    # add to a stream's last stamp (rule.client_lateness_ns; ~0 on a quiet host).
    d = d.join(stalls, on="request_id", how="left", maintain_order="left").with_columns(
        pl.col("stall_causes").fill_null(pl.lit([], pl.List(pl.String))),
        decode_stalls_ms=pl.min_horizontal(
            pl.col("stall_ms").fill_null(0.0),
            (pl.col("decode_ms") - pl.col("decode_ideal_ms") - rule.client_lateness_ns / NS_PER_MS)
            .clip(lower_bound=0)),
    ).with_columns(
        decode_contention_ms=pl.col("decode_ms") - pl.col("decode_ideal_ms") - pl.col("decode_stalls_ms"),
        other_ms=pl.col("e2e_ms") - pl.col("send_lag_ms") - pl.col("slot_wait_ms") - pl.col("connect_ms")
        - pl.col("queue_ms").fill_null(0) - pl.col("prefill_ms").fill_null(0) - pl.col("decode_ms"),
    )
    d = d.with_columns(queue_uncertainty_ms=pl.when(pl.col("method") == "calibrated")
                       .then(pl.col("_unc_ms") if "_unc_ms" in d.columns else None).otherwise(None)
                       .cast(pl.Float64))
    if replay_fit is not None and fit is not None:
        replay_fit.update(fit)
    return d.select(*COLUMNS, *EXTRA)


def _replayed(run: Run, base: pl.DataFrame, B: np.ndarray,
              walk_ns: np.ndarray) -> tuple[np.ndarray, np.ndarray, dict | None]:
    """Scheduling time per row of base (ns): the FCFS replay's admission where the replay reproduced the
    request's first-token step (replay.py), else the step-excess walk's. And the queue uncertainty (ms):
    0 where the replay matched, else the width of the window the stamps leave open, from the first step
    start after send to the start of the step that produced the first token."""
    ok = (run.requests.filter(metrics.OK_ROWS & pl.col("first_token_ns").is_not_null())
          .select("request_id", pl.coalesce("sent_ns", "connected_ns", "dispatched_ns").alias("sent"),
                  pl.coalesce("prompt_tokens", "planned_prompt_tokens").fill_null(1).alias("L"),
                  "first_token_ns", pl.coalesce("last_token_ns", "first_token_ns").alias("last"))
          .sort("sent"))  # warm-up requests included: they held the engine too
    rp = replay.fit(B, ok["sent"].to_numpy(), ok["L"].to_numpy(), ok["first_token_ns"].to_numpy(),
                    ok["last"].to_numpy())
    sent = base.select(pl.coalesce("sent_ns", "connected_ns", "dispatched_ns"))[:, 0].to_numpy()
    first = base["first_token_ns"].to_numpy()
    lo, hi = replay.window(B, sent, first)
    unc_ms = np.clip(hi - lo, 0, None) / NS_PER_MS
    if rp is None:
        return walk_ns, unc_ms, None
    r = base.select("request_id").join(pl.DataFrame({"request_id": ok["request_id"], "rs": rp.sched_ns,
                                                     "m": rp.matched}), on="request_id", how="left",
                                       maintain_order="left")
    matched = r["m"].fill_null(False).to_numpy() & (r["rs"].fill_null(-1).to_numpy() >= 0)
    sched = np.where(matched, r["rs"].fill_null(0).to_numpy(), walk_ns)
    fit = {"budget_tokens": None if rp.budget_tokens >= replay.NO_LIMIT else rp.budget_tokens,
           "seats": None if rp.seats >= replay.NO_LIMIT else rp.seats,
           "matched_share": float(rp.matched.mean())}
    return sched, np.where(matched, 0.0, unc_ms), fit


def _fastest_itl_ms(g: metrics.Gaps) -> float:
    per = (pl.DataFrame({"rid": g.owner, "itl_ns": g.gap_ns / g.k})
           .group_by("rid").agg(pl.col("itl_ns").median().alias("m")))
    return float(per["m"].quantile(0.05) or 0.0) / NS_PER_MS if per.height else 0.0


def _means(df: pl.DataFrame) -> dict[str, float | None]:
    if df.height == 0:
        return {c: None for c in COMPONENTS}
    row = df.select(pl.col(f"{c}_ms").mean().alias(c) for c in COMPONENTS).row(0, named=True)
    return {c: (None if v is None else float(v)) for c, v in row.items()}


def aggregate(d: pl.DataFrame) -> dict:
    """The `decomposition_ms` block of summary.json."""
    out = {"mean": _means(d), "n": d.height}
    for key, col in (("p99_e2e", "e2e_ms"), ("p99_ttft", "ttft_ms")):
        if d.height:
            cut = metrics.quantiles(d[col].to_numpy(), (0.99,))[0]
            tail = d.filter(pl.col(col) >= cut)
        else:
            cut, tail = None, d
        out[key] = {**_means(tail), "n": tail.height, "threshold_ms": cut}
    methods = d["method"].unique().sort().to_list() if d.height else []
    out["method"] = methods[0] if len(methods) == 1 else ("mixed: " + ", ".join(methods) if methods else None)
    out["e2e_mean"] = float(metrics.number(d["e2e_ms"].mean())) if d.height else None
    # a bound on the mean queue's (and prefill's) error from the calibrated rows: every request the replay
    # did not reproduce sitting at the far end of the window its stamps allow (0 where all matched)
    unc = d["queue_uncertainty_ms"].drop_nulls() if "queue_uncertainty_ms" in d.columns else pl.Series([])
    out["queue_uncertainty_ms"] = float(unc.sum()) / d.height if unc.len() and d.height else None
    out["stalls"] = {"requests_stalled": int((d["decode_stalls_ms"] > 0).sum()) if d.height else 0,
                     "total_ms": float(d["decode_stalls_ms"].sum()) if d.height else 0.0}
    return out


def by_window(d: pl.DataFrame, window_ns: int = 5_000_000_000) -> list[dict]:
    """Mean components per window of intended send time (queueing building up shows here)."""
    if d.height == 0:
        return []
    w = (d.with_columns(window=(pl.col("intended_ns") // window_ns))
         .group_by("window").agg(pl.len().alias("n"), *(pl.col(f"{c}_ms").mean().alias(c) for c in COMPONENTS))
         .sort("window"))
    return [{"t_s": r.pop("window") * window_ns / 1e9, **r} for r in w.iter_rows(named=True)]


def by_prompt_tokens(d: pl.DataFrame, bins: int = 4) -> list[dict]:
    """TTFT, TPOT, queue and prefill by prompt length (quantile bins): prefill cost shows as TTFT rising
    with length while TPOT stays flat."""
    if d.height == 0:
        return []
    # equal-count bins by rank; equal lengths share a bin (rank "min")
    labelled = d.with_columns(bin=((pl.col("prompt_tokens").rank("min") - 1) * bins // d.height))
    t = (labelled.group_by("bin").agg(
        pl.len().alias("n"), pl.col("prompt_tokens").min().alias("prompt_tokens_min"),
        pl.col("prompt_tokens").max().alias("prompt_tokens_max"),
        metrics.quantile_expr("ttft_ms", 0.5).alias("ttft_p50"),
        metrics.quantile_expr("tpot_ms", 0.5).alias("tpot_p50"),
        pl.col("queue_ms").mean().alias("queue_mean"), pl.col("prefill_ms").mean().alias("prefill_mean"))
        .sort("prompt_tokens_min").drop("bin"))
    return t.to_dicts()


def histogram_crosscheck(metrics: pl.DataFrame | None) -> dict | None:
    """Mean queue/prefill/decode (ms) from the server's histogram deltas (_sum/_count, last - first
    sample over the run). Coarse: vLLM's buckets are wide, but sum/count give an exact mean."""
    if metrics is None or metrics.height == 0:
        return None
    out = {}
    for comp, name in (("queue", "vllm:request_queue_time_seconds"), ("prefill", "vllm:request_prefill_time_seconds"),
                       ("decode", "vllm:request_decode_time_seconds")):
        delta = {}
        for suffix in ("_sum", "_count"):
            s = (metrics.filter(pl.col("name") == name + suffix).group_by("labels")
                 .agg((pl.col("value").sort_by("t_ns").last() - pl.col("value").sort_by("t_ns").first()).alias("d")))
            delta[suffix] = float(s["d"].sum()) if s.height else 0.0
        if delta["_count"] > 0:
            out[comp] = delta["_sum"] / delta["_count"] * 1e3
            out["n"] = int(delta["_count"])
    return out or None
