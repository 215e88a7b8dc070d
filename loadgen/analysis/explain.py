"""`loadgen report`'s explanation: decomposition, windows, per-length table, server cross-check,
roofline and diagnosis of one results folder (read-only inputs; the caller writes the outputs).

Adds to summary.json:
    decomposition_ms         {"mean", "p99_e2e", "p99_ttft": {component: ms}, "method", "n", ...}
    decomposition_windows    [{"t_s", "n", component: mean ms}] per window of intended send time
    by_prompt_tokens         [{"prompt_tokens_min/max", "n", "ttft_p50", "tpot_p50", "queue_mean", ...}]
    server_histograms_ms     mean queue/prefill/decode from vLLM's histogram deltas (or null)
    queue_split_ms           loadgen's queue/prefill/decode beside the server's, front-end time, disagreements
    calibration              the fit (coefficients, residuals) or why there is none
    roofline                 roofline.py's numbers (only with --device/--bandwidth and --model-config)
    diagnosis                [{"rule", "finding", "evidence", "remedy"}]
"""
from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from loadgen import metrics
from loadgen.metrics import number
from loadgen.analysis import decompose as dec
from loadgen.analysis import prefix_cache
from loadgen.analysis import failures
from loadgen.analysis.diagnose import Facts, diagnose, facts_from_metrics
from loadgen.analysis.roofline import bandwidth_from, model_shape, roofline
from loadgen.analysis.server_split import queue_split
from loadgen.probe.calibrate import DECODE_KEY
from loadgen.results.folder import Explanation, Run


@dataclass(frozen=True)
class ExplainOptions:
    device: str | None = None
    bandwidth: str | None = None
    model_config: str | None = None
    window_ns: int = 5_000_000_000
    calibration: dict | None = None   # in calibration.json's shape, instead of the run's (report --fitted-profile)


def _single_stream(calibration: dict | None, d: pl.DataFrame, prompt_mean: float) -> tuple[float | None, str]:
    if calibration and calibration[DECODE_KEY]["coef"] != [0.0]:
        decode_ms_per_token = sum(c * prompt_mean ** i for i, c in enumerate(calibration[DECODE_KEY]["coef"]))
        if decode_ms_per_token > 0:
            return 1000.0 / decode_ms_per_token, "idle-server probes (calibration.json)"
    tpot = d["tpot_ms"].drop_nulls()
    if tpot.len():
        return (1000.0 / float(number(tpot.min())),
                "fastest request of the run (no calibration: an upper bound under load)")
    return None, "no data"


def _pace(run: Run) -> dict:
    """Facts of the over-saturation rule: the offered and the ok completion rates, the mean TTFT of the first
    and the last quarter of the measured requests (plan order), and the request timeout (ms)."""
    timeout_ns = (run.manifest.get("config") or {}).get("request_timeout_ns")
    out: dict = {"request_timeout_ms": timeout_ns / 1e6 if isinstance(timeout_ns, (int, float)) else None}
    req = run.requests.filter(~pl.col("warmup")).sort("intended_ns")
    # rows with a first token only (a pooling API's answers have none: no TTFT to compare, as decompose.py)
    ok = metrics.latency_columns(req.filter(metrics.OK_ROWS & pl.col("first_token_ns").is_not_null()))
    if req.height < 8 or ok.height < 8:
        return out
    span_ns = number(ok["done_ns"].max()) - number(req["intended_ns"].min())
    out["offered_per_s"] = metrics.rate_per_s(req["intended_ns"].to_numpy())
    out["completed_per_s"] = ok.height * 1e9 / span_ns if span_ns > 0 else None
    q = ok.height // 4
    out["ttft_first_ms"] = float(number(ok["ttft"].head(q).mean()))
    out["ttft_last_ms"] = float(number(ok["ttft"].tail(q).mean()))
    return out


def explain(run: Run, opts: ExplainOptions = ExplainOptions()) -> tuple[Explanation, pl.DataFrame]:
    calibration = opts.calibration or run.calibration()
    metrics = run.server_metrics()
    fit: dict = {}
    d = dec.decompose(run, calibration, replay_fit=fit)
    agg = dec.aggregate(d)
    agg["replay"] = fit or None
    by_len = dec.by_prompt_tokens(d)
    roof = None
    if opts.model_config and (opts.device or opts.bandwidth):
        bw, source = bandwidth_from(opts.device, opts.bandwidth)
        prompt_mean = float(number(d["prompt_tokens"].mean() or 0)) if d.height else 0.0
        output_mean = float(number(d["output_tokens"].mean() or 0)) if d.height else 0.0
        rate, where = _single_stream(calibration, d, prompt_mean)
        roof = roofline(model_shape(opts.model_config), bw, source, prompt_mean, output_mean, rate, where)
    max_waiting, max_kv = facts_from_metrics(metrics)
    ttft_mean = float(number(d["ttft_ms"].mean())) if d.height else None
    hist = dec.histogram_crosscheck(metrics)
    facts = Facts(mean=agg["mean"], ttft_mean_ms=ttft_mean,
                  by_prompt=by_len, stalled_requests=agg["stalls"]["requests_stalled"], requests=d.height,
                  max_waiting=max_waiting, max_kv_usage=max_kv, roofline=roof,
                  prefix_cache=prefix_cache.section(run), errors=failures.summarize(run.requests), **_pace(run))
    out: Explanation = {
        "decomposition_ms": agg,
        "decomposition_windows": dec.by_window(d, opts.window_ns),
        "by_prompt_tokens": by_len,
        "server_histograms_ms": hist,
        "queue_split_ms": queue_split(hist, agg, ttft_mean),
        "calibration": ({k: v for k, v in calibration.items() if k != "probes"} if calibration
                        else run.manifest.get("calibration", "none")),
        "roofline": roof,
        "diagnosis": diagnose(facts),
    }
    return out, d
