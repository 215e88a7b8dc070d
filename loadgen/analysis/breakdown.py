"""Per-class and per-model breakdown of a run (summary.json `breakdown`): a workload with more than one
[[mix]] class (the rows' `class`) or more than one model (the rows' `model`, e.g. LoRA adapters) gets, per
class and per model, the counts, the latency distributions of BREAKDOWN_METRICS and, when an SLO is known,
attainment and goodput under the bounds that group's requests are held to (goodput.py: a class's own
bounds over the plain ones).

    breakdown = {"by_class": {name: Group, ...} | None, "by_model": {name: Group, ...} | None}
    Group     = {"requests", "ok", "failed", "dropped", "abandoned", "priority", "model", "class",
                 "latency_ms": {metric: {p50, p90, p99, p99.9, max, mean}}, "goodput": {...} | None}

`by_class` is None unless the measured rows hold two or more classes, `by_model` unless they name two or
more models. A group's figures follow the same rules as the whole run's (summary.py, metrics.py: warm-up
left out, nearest-rank percentiles, ITL per token); `priority` and `model` of a class are the values its
rows carried (null when none was sent), `class` of a model group the classes that sent it. Goodput's window
is the group's own (its first intended send .. its last done).
"""
from __future__ import annotations

import polars as pl

from loadgen import metrics
from loadgen.analysis import goodput
from loadgen.analysis.summary import distribution_ms, itl_ns
from loadgen.results.folder import Json

BREAKDOWN_METRICS = ("ttft", "ttfa", "itl", "tpot", "e2e")
KEYS = {"by_class": "class", "by_model": "model"}


def breakdown(rows: pl.DataFrame, tokens: pl.DataFrame, slo_ms: dict[str, float] | None) -> Json:
    """rows: the measured rows (summary.measured)."""
    req = metrics.latency_columns(rows, unit_ns=1)
    # goodput judges the rows goodput.goodput judges: abandoned ones ([abandon]) left out
    judged = (goodput.meets(metrics.latency_columns(rows).filter(pl.col("outcome") != "abandoned"), tokens, slo_ms)
              if slo_ms else None)
    out: Json = {}
    for section, column in KEYS.items():
        values = sorted(v for v in req[column].unique().to_list() if v is not None)
        out[section] = ({v: _group(req, tokens, judged, slo_ms, column, v) for v in values}
                        if len(values) > 1 else None)
    return out


def _group(req: pl.DataFrame, tokens: pl.DataFrame, judged: pl.DataFrame | None, slo_ms: dict[str, float] | None,
           column: str, value: str) -> Json:
    g = req.filter(pl.col(column) == value)
    ok = g.filter(metrics.OK_ROWS)
    outcomes = dict(g.group_by("outcome").len().iter_rows())
    dropped = outcomes.get("dropped", 0)
    latency = {m: distribution_ms(ok[m]) for m in BREAKDOWN_METRICS if m != "itl"}
    latency["itl"] = distribution_ms(itl_ns(tokens, ok["request_id"]))
    other = "model" if column == "class" else "class"
    return {"requests": g.height, "ok": ok.height,
            # as summary.py counts them: cancelled (never sent) and abandoned (cut by plan) rows did not fail
            "failed": g.height - ok.height - dropped - outcomes.get("cancelled", 0) - outcomes.get("abandoned", 0),
            "dropped": dropped, "abandoned": outcomes.get("abandoned", 0),
            "priority": sorted({p for p in g["priority"].to_list() if p is not None}) or None,
            other: sorted({v for v in g[other].to_list() if v is not None}) or None,
            "latency_ms": {m: latency[m] for m in BREAKDOWN_METRICS},
            "goodput": (goodput.attainment(judged.filter(pl.col(column) == value), slo_ms)
                        if judged is not None and slo_ms else None)}
