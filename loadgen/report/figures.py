"""What the HTML report draws, taken from a results folder and thinned to a fixed size.

Only what is DRAWN is thinned; every number printed comes from the summary dict (html.py). Bounds, per
report, whatever the run's length (they keep the file under html.SIZE_BOUND_BYTES):
    CDF_POINTS      points per CDF line: ranks spread evenly in p and in nines (the tail keeps its points)
    TIME_POINTS     points per line over time: interval histograms are merged (exactly) into coarser
                    intervals, server samples and token counts are binned, when a run has more
    GPU_LINES       GPUs drawn per telemetry chart (the first by endpoint and GPU; the table lists all),
                    each line binned to TELEMETRY_POINTS
    GANTT_ROWS      requests in the per-request timeline (consecutive ones around the most-stalled request)
    GANTT_MARKS     stall marks in it
Times are seconds from the run's t0 (the origin of every *_ns column and of the *.hlog timestamps).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import polars as pl

from loadgen import metrics
from loadgen.metrics import number
from loadgen.results import hdr
from loadgen.analysis.summary import itl_ms, measured
from loadgen.analysis.telemetry import GAUGES, gpu_samples
from loadgen.results.folder import Run
from loadgen.probe.scrape import KV_USAGE, RUNNING, WAITING

CDF_POINTS = 400
TIME_POINTS = 600
GANTT_ROWS = 60
GANTT_MARKS = 600
GPU_LINES = 8
TELEMETRY_POINTS = 300
NS_PER_S = 1e9


def cdf_points(values: np.ndarray, max_points: int = CDF_POINTS) -> tuple[list[float], list[float]]:
    """The empirical CDF (x = the i-th smallest sample, p = i/n) at at most max_points ranks; the largest
    sample is plotted at p = 1 - 1/(2n), the top of a nines axis that has room for it."""
    v = np.sort(np.asarray(values, dtype=np.float64)[np.isfinite(values)])
    n = v.size
    if n == 0:
        return [], []
    half = max_points // 2
    p_lin = np.linspace(0, 1, half, endpoint=False)
    top = math.log10(max(n, 10))
    p_tail = 1 - 10.0 ** -np.linspace(0, top, max_points - half - 1)
    ranks = np.unique(np.clip(np.ceil(np.concatenate([p_lin, p_tail, [1.0]]) * n).astype(np.int64), 1, n))
    ps = ranks / n
    ps[-1] = 1 - 0.5 / n    # the largest sample (rank n is always kept)
    return v[ranks - 1].tolist(), ps.tolist()


def latency_samples(run: Run) -> dict[str, np.ndarray]:
    """ttft, itl and e2e samples (ms) over the rows the summary uses (summary.py's definitions)."""
    req = metrics.latency_columns(measured(run))
    ok = req.filter(metrics.OK_ROWS)
    return {"ttft": ok["ttft"].drop_nulls().to_numpy(), "itl": itl_ms(run.tokens, ok["request_id"]).to_numpy(),
            "e2e": ok["e2e"].drop_nulls().to_numpy()}


@dataclass
class TimeSeries:
    t_s: list[float]
    values: dict[str, list[float | None]] = field(default_factory=dict)


def interval_percentiles(run_dir: Path, metric: str, max_points: int = TIME_POINTS) -> TimeSeries | None:
    """p50, p99 and count per interval of <metric>.hlog (all workers' logs merged by interval start),
    intervals merged in groups when there are more than max_points. None without a log."""
    logs = hdr.interval_logs(run_dir, metric)
    if not logs:
        return None
    by_start: dict[float, list] = {}
    for p in logs:
        for iv in hdr.read_interval_log(p):
            by_start.setdefault(round(iv.start_s, 3), []).append(iv)
    starts = sorted(by_start)
    group = max(1, math.ceil(len(starts) / max_points))
    ts = TimeSeries([], {"p50": [], "p99": [], "count_per_s": []})
    for i in range(0, len(starts), group):
        chunk = [iv for s in starts[i:i + group] for iv in by_start[s]]
        merged = hdr.merge_intervals(chunk).hist
        length = max(1e-9, max(iv.start_s + iv.length_s for iv in chunk) - starts[i])
        count = merged.get_total_count()
        pct = hdr.percentiles_us(merged, (50.0, 99.0)) if count else {}
        ts.t_s.append(starts[i] + length / 2)
        ts.values["p50"].append(pct[50.0] / 1000 if count else None)
        ts.values["p99"].append(pct[99.0] / 1000 if count else None)
        ts.values["count_per_s"].append(count / length)
    return ts


def _binned(t_ns: pl.Series, weights: pl.Series | None, span_ns: int, max_points: int) -> tuple[list, list]:
    """Sum of weights (or counts) per bin of max(1 s, span / max_points), as a rate per second."""
    width = max(NS_PER_S, span_ns / max_points)
    df = pl.DataFrame({"b": (t_ns / width).floor().cast(pl.Int64),
                       "w": weights if weights is not None else pl.Series([1] * t_ns.len())})
    n_bins = int(span_ns // width) + 1
    sums = np.zeros(n_bins)
    g = df.group_by("b").agg(pl.col("w").sum()).filter((pl.col("b") >= 0) & (pl.col("b") < n_bins))
    sums[g["b"].to_numpy()] = g["w"].to_numpy()
    return ((np.arange(n_bins) + 0.5) * width / NS_PER_S).tolist(), (sums / (width / NS_PER_S)).tolist()


def warmup_span(run: Run) -> tuple[float, float, str] | None:
    """(0, s from t0 when the first measured request was due, label) when the run had warm-up requests:
    they are sent but left out of the statistics, so the charts over time show nothing there."""
    req = run.requests
    if "warmup" not in req.columns:
        return None
    n = int(req["warmup"].sum())
    due = req.filter(~pl.col("warmup"))["intended_ns"].drop_nulls()
    if n == 0 or due.len() == 0:
        return None
    return 0.0, number(due.min()) / NS_PER_S, f"warm-up: {n} requests, not measured"


def throughput(run: Run, max_points: int = TIME_POINTS) -> TimeSeries | None:
    """Offered requests/s (intended), completed ok requests/s and output tokens/s over time (measured rows)."""
    req = measured(run)
    if req.height == 0:
        return None
    span = int(req.select(pl.max_horizontal(pl.col("done_ns").max(), pl.col("intended_ns").max())).item() or 0)
    ok = req.filter(metrics.OK_ROWS)
    t, offered = _binned(req["intended_ns"].drop_nulls(), None, span, max_points)
    _, done = _binned(ok["last_token_ns"].drop_nulls(), None, span, max_points)
    tok = run.tokens.join(ok.select("request_id"), on="request_id", how="semi")
    _, tokens = _binned(tok["t_ns"], tok["n_tokens"].cast(pl.Int64), span, max_points)
    return TimeSeries(t, {"offered req/s": offered, "completed req/s": done, "output tok/s": tokens})


def server_series(metrics: pl.DataFrame | None, max_points: int = TIME_POINTS) -> TimeSeries | None:
    """Requests waiting and running (sum over label sets per scrape) and KV usage (%, max over label sets),
    binned to at most max_points (max per bin: a spike stays visible). None when nothing was scraped."""
    if metrics is None or metrics.height == 0:
        return None
    wanted = {"waiting": WAITING, "running": RUNNING, "KV usage %": KV_USAGE}
    m = metrics.filter(pl.col("name").is_in([n for ns in wanted.values() for n in ns]))
    if m.height == 0:
        return None
    span = int(number(m["t_ns"].max()))
    width = max(1, math.ceil((span + 1) / max_points))
    series: dict[str, dict[int, float]] = {}
    for label, names in wanted.items():
        sel = m.filter(pl.col("name").is_in(list(names)))
        if sel.height == 0:
            continue
        agg = pl.col("value").max() if label.startswith("KV") else pl.col("value").sum()
        per_scrape = sel.group_by("t_ns").agg(agg.alias("v"))
        if label.startswith("KV"):
            per_scrape = per_scrape.with_columns(pl.col("v") * 100)
        binned = per_scrape.group_by((pl.col("t_ns") // width).alias("b")).agg(pl.col("v").max()).sort("b")
        series[label] = dict(zip(binned["b"].to_list(), binned["v"].to_list()))
    bins = sorted({b for s in series.values() for b in s})
    return TimeSeries([(b + 0.5) * width / NS_PER_S for b in bins],
                      {label: [s.get(b) for b in bins] for label, s in series.items()})


def telemetry_series(tel: pl.DataFrame | None, max_points: int = TELEMETRY_POINTS,
                     max_gpus: int = GPU_LINES) -> dict[str, TimeSeries]:
    """Per DCGM gauge (analysis/telemetry.GAUGES key) present, one line per GPU (`gpu N`, with the host
    when several endpoints are scraped), binned to at most max_points on a common grid (mean per bin:
    gauges, not events); {} without DCGM samples. The figures are the summary's samples, all of them
    (the summary keeps only the measured window's)."""
    if tel is None or tel.height == 0:
        return {}
    g = gpu_samples(tel)
    if g.height == 0:
        return {}
    keys = g["gpu_key"].unique(maintain_order=True).to_list()[:max_gpus]
    several = g["source"].n_unique() > 1
    lo, hi = int(number(g["t_ns"].min())), int(number(g["t_ns"].max()))
    width = max(1, math.ceil((hi - lo + 1) / max_points))
    g = g.filter(pl.col("gpu_key").is_in(keys)).with_columns(((pl.col("t_ns") - lo) // width).alias("b"))
    out: dict[str, TimeSeries] = {}
    for gauge in GAUGES:
        sel = g.filter(pl.col("name") == gauge.name)
        if sel.height == 0:
            continue
        binned = sel.group_by("gpu_key", "b").agg(pl.col("value").mean(), pl.col("gpu").first(),
                                                  pl.col("hostname").first())
        bins = sorted(set(binned["b"].to_list()))
        ts = TimeSeries([(lo + (b + 0.5) * width) / NS_PER_S for b in bins])
        for key in keys:
            mine = binned.filter(pl.col("gpu_key") == key)
            if mine.height == 0:
                continue
            row = mine.row(0, named=True)
            label = f"gpu {row['gpu']}" + (f" {row['hostname']}" if several and row["hostname"] else "")
            at = dict(zip(mine["b"].to_list(), mine["value"].to_list()))
            ts.values[label] = [at.get(b) for b in bins]
        out[gauge.key] = ts
    return out


@dataclass
class GanttRow:
    request_id: str
    prompt_tokens: int | None
    segments: list[tuple[str, float, float]]     # (component, start s, end s)
    first_s: float                                # first token
    stall_causes: list[str]
    decode_stalls_ms: float


def gantt(d: pl.DataFrame, rows: int = GANTT_ROWS) -> tuple[list[GanttRow], dict[str, tuple[float, float]]]:
    """Consecutive requests (by intended time) around the most-stalled one (the slowest e2e without stalls),
    with their segments, and every cause's prefill interval [start s, first token s] (causes outside the
    sample too, so a stall can be marked where its prefill ran)."""
    if d.height == 0:
        return [], {}
    key = "decode_stalls_ms" if (d["decode_stalls_ms"] > 0).any() else "e2e_ms"
    centre = d[key].arg_max()
    if centre is None:  # every value null: no request to centre on
        return [], {}
    lo = max(0, min(centre - rows // 2, d.height - rows))
    w = d.slice(lo, rows)
    s = lambda ms: ms / 1e3  # noqa: E731
    out = []
    for r in w.iter_rows(named=True):
        t0 = r["intended_ns"] / NS_PER_S
        first, end = t0 + s(r["ttft_ms"]), t0 + s(r["e2e_ms"])
        sent = t0 + s(r["send_lag_ms"])
        connected = sent + s(r["connect_ms"])
        segs = [("send_lag", t0, sent), ("connect", sent, connected)]
        if r["prefill_ms"] is not None and r["queue_ms"] is not None:
            p0 = first - s(r["prefill_ms"])
            segs += [("queue", max(connected, p0 - s(r["queue_ms"])), p0), ("prefill", p0, first)]
        else:
            segs.append(("other", connected, first))   # no split of the server's TTFT (method none)
        segs.append(("decode", first, end))
        out.append(GanttRow(r["request_id"], r["prompt_tokens"], [g for g in segs if g[2] > g[1]], first,
                            list(r["stall_causes"] or []), r["decode_stalls_ms"] or 0.0))
    causes = {c for g in out for c in g.stall_causes}
    prefills = {}
    if causes:
        q = d.filter(pl.col("request_id").is_in(list(causes)))
        for r in q.iter_rows(named=True):
            first = (r["intended_ns"] / NS_PER_S) + s(r["ttft_ms"])
            prefills[r["request_id"]] = (first - s(r["prefill_ms"] or 0.0), first)
    return out, prefills


def decomposition_by_bin(d: pl.DataFrame, bins: list[dict], components: tuple[str, ...]) -> list[dict]:
    """Mean components of the requests in each prompt-length bin of summary `by_prompt_tokens`
    (bins are disjoint [min, max] ranges, so a row's bin is the one its prompt length falls in)."""
    out = []
    for b in bins:
        sel = d.filter(pl.col("prompt_tokens").is_between(b["prompt_tokens_min"], b["prompt_tokens_max"]))
        means = sel.select(pl.col(f"{c}_ms").mean().alias(c) for c in components).row(0, named=True) \
            if sel.height else {c: None for c in components}
        out.append({"bin": b, "n": sel.height, **means})
    return out
