"""The run summary: counts, rates, and latency distributions (the `summary.json` contract).

Every metric, which rows it covers and the percentile rule are defined in loadgen/metrics.py (warm-up
rows excluded). Beyond those:
- offered rate = (n - 1) / span of intended times; achieved = the same over dispatch times.
- throughput: ok requests, their output tokens and their prompt tokens (the server's usage counts) over
  [first intended, last done].
Percentiles are exact over all samples (nearest rank), not histogram estimates.
`histograms` reads the run's HdrHistogram interval logs back (`<metric>.hlog`; hdr.interval_logs also
finds the per-worker logs of older or unfinished --workers runs, merged exactly): counts, out-of-range
counts (values the histograms could not hold: negative or above 1 h) and HDR percentiles, a cross-check
of the exact ones above.
`errors` is analysis/failures.py's: the error rate and the most frequent error texts (redacted).
`generator` is the run's self-check from the manifest (selfcheck.py). `prefix_cache`: the measured
prefix-cache hit rate beside the one the workload implies (analysis/prefix_cache.py). `replies`: how many
replies were valid JSON / valid tool calls, for a workload that sends tools or response_format
(analysis/replies.py). `telemetry`: the
GPU figures of the --scrape endpoints over the throughput's window (analysis/telemetry.py).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl

from loadgen.results import hdr
from loadgen import metrics
from loadgen.analysis import abandon, agentic, completeness, failures, prefix_cache, replies, telemetry
from loadgen.results.folder import Json, ResultsError, Run, RunSummary

METRICS = ("send_lag", "ttft", "ttfa", "ttft_from_send", "itl", "tpot", "e2e", "connect", "slot_wait")
STATS = metrics.STATS


def measured(run: Run) -> pl.DataFrame:
    return run.requests.filter(~pl.col("warmup"))


def itl_ns(tokens: pl.DataFrame, request_ids: pl.Series) -> np.ndarray:
    """Per-token ITL samples in ns of these requests (metrics.py's rule)."""
    g = metrics.gap_arrays(tokens, request_ids)
    return np.repeat(g.gap_ns / g.k, g.k)


def itl_ms(tokens: pl.DataFrame, request_ids: pl.Series) -> pl.Series:
    return pl.Series("itl", itl_ns(tokens, request_ids) / metrics.NS_PER_MS)


def distribution_ms(values_ns) -> dict[str, float | None]:
    return metrics.distribution(values_ns, scale=metrics.NS_PER_MS)


def _rate(times: pl.Series) -> float | None:
    return metrics.rate_per_s(times.drop_nulls().to_numpy())


def _status_reason(status: str | None, missing: dict | None = None) -> list[str]:
    # write_failed: the manifest's own reason says why and how many rows were saved (ending.write_error)
    if status == "write_failed":
        return []
    if missing is not None and status not in ("complete", "invalid", "interrupted"):
        return [completeness.reason(missing)]
    return [] if status in ("complete", "invalid") else [f"run status is {status!r}"]


def summarize(run: Run) -> RunSummary:
    req = metrics.latency_columns(measured(run), unit_ns=1)
    ok = req.filter(metrics.OK_ROWS)
    outcomes = dict(req.group_by("outcome").len().iter_rows())
    n, n_ok, n_dropped = req.height, ok.height, outcomes.get("dropped", 0)
    window_ns = start_ns = end_ns = None
    if n and req["done_ns"].drop_nulls().len():
        start_ns, end_ns = metrics.number(req["intended_ns"].min()), metrics.number(req["done_ns"].max())
        window_ns = end_ns - start_ns
    per_s = (lambda x: x * 1e9 / window_ns) if window_ns else (lambda x: None)
    output_tokens = int(ok["output_tokens"].sum() or 0)
    prompt_tokens = int(ok["prompt_tokens"].sum() or 0)  # the server's usage counts (null: not reported)
    latency = {m: distribution_ms(req[m] if metrics.ROWS[m] == "sent" else ok[m]) for m in METRICS if m != "itl"}
    latency["itl"] = distribution_ms(itl_ns(run.tokens, ok["request_id"]))
    manifest = run.manifest
    missing = completeness.lost(run)
    return {
        "run": {"path": str(run.path), "name": manifest.get("config", {}).get("name"),
                "status": manifest.get("status"), "target": manifest.get("target", {}).get("url")},
        # cancelled rows were never sent, abandoned ones closed by plan ([abandon]): neither failed
        "requests": {"scheduled": n, "ok": n_ok,
                     "failed": n - n_ok - n_dropped - outcomes.get("cancelled", 0) - outcomes.get("abandoned", 0),
                     "dropped": n_dropped, "abandoned": outcomes.get("abandoned", 0)},
        "outcomes": outcomes,
        "errors": failures.summarize(run.requests),   # the error rate, counts, most frequent texts
        "rate": {"offered_per_s": _rate(req["intended_ns"]), "achieved_per_s": _rate(req["dispatched_ns"])},
        "throughput": {"output_tokens_per_s": per_s(output_tokens),
                       "requests_per_s": per_s(n_ok),
                       # what a pooling API (embeddings, rerank) is measured by: prompt tokens it processed
                       "prompt_tokens_per_s": per_s(prompt_tokens)},
        "latency_ms": {m: latency[m] for m in METRICS},
        "percentiles": metrics.PERCENTILE_RULE,
        "histograms": histograms(run.path),
        "generator": manifest.get("generator"),
        "valid": manifest.get("status") == "complete",
        "invalid_reasons": list(manifest.get("invalid_reasons", [])) + _status_reason(manifest.get("status"),
                                                                                      missing),
        "lost": missing,
        # what the target is, and whether the prompts had the planned lengths (prompts.verdict)
        "server": (manifest.get("target", {}).get("server") or {}).get("kind"),
        "prompt_lengths": manifest.get("workload", {}).get("prompt_lengths"),
        "prefix_cache": prefix_cache.section(run),  # measured hit rate vs the workload's (prefix_cache.py)
        "abandoned": abandon.section(run, req),      # [abandon]: what was cut, did the server free the slots
        "images": images(req),                       # [image]: what was sent, what the server charged
        "replies": replies.section(run),  # valid JSON / valid tool calls (replies.py); null: none asked
        "agentic": agentic.section(run),  # agentic sessions: user turns, tool rounds, their waits (agentic.py)
        # --scrape endpoints: GPU figures over the same window as the throughput (telemetry.py)
        "telemetry": telemetry.section(run.telemetry(), start_ns, end_ns, output_tokens),
    }


def images(measured: pl.DataFrame) -> Json | None:
    """[image] (None without): requests with images, images and pixels sent, and the prompt tokens the server
    charged for them over ok rows that report usage: prompt_tokens - planned_prompt_tokens (the plan counts
    the text only, fitted exactly; docs/metrics.md)."""
    if "images" not in measured.columns:
        return None
    rows = measured.filter(pl.col("images").is_not_null())
    if not rows.height:
        return None
    ok = rows.filter((pl.col("outcome") == "ok") & pl.col("prompt_tokens").is_not_null())
    charged = (ok["prompt_tokens"] - ok["planned_prompt_tokens"]).cast(pl.Float64)
    per_image = charged / ok["images"]
    return {"requests": rows.height, "images": int(rows["images"].sum()),
            "pixels": int((rows["images"] * rows["image_width"] * rows["image_height"]).sum()),
            "reported": ok.height,
            "image_tokens": ({"total": int(charged.sum()), "per_request_p50": float(charged.median()),  # type: ignore[arg-type]
                              "per_image_mean": float(per_image.mean())} if ok.height else None)}  # type: ignore[arg-type]


def histograms(run_dir: str | Path) -> dict[str, dict] | None:
    """Per metric, the HDR summary (ms) of its interval logs, all workers merged; None without logs."""
    p = Path(run_dir)
    out = {}
    for m in hdr.METRICS:
        logs = hdr.interval_logs(p, m)
        if logs:
            try:
                out[m] = hdr.summary_ms(hdr.merge_logs(logs))
            except ValueError as e:  # a damaged line, named by file and line
                raise ResultsError(f"{e}\n(the interval logs are damaged; requests.parquet is not: move the "
                                   f"damaged .hlog aside to report without it)") from None
    return out or None
