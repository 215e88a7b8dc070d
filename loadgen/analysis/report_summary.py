"""Everything `loadgen report` derives from one results folder, as one call (also used by each sweep
point and by `loadgen compare`): the summary (summary.py), the explanation (explain.py), the load model
(closed or open loop), when an SLO is known attainment and goodput (goodput.py), and the figures per
[[mix]] class and per model (breakdown.py).

The SLO is the one given (`report --slo`), else the one the run recorded (`run --slo`, manifest `slo`).
Writes RUN/summary.json and RUN/decomposition.parquet; raises RooflineError/ValueError on bad options.
"""
from __future__ import annotations

from pathlib import Path

import polars as pl

from loadgen import metrics
from loadgen.analysis import breakdown, goodput
from loadgen.config.slo import classes_named, from_keys as slo_from_keys
from loadgen.analysis.explain import ExplainOptions, explain
from loadgen.analysis.summary import measured, summarize
from loadgen.results.folder import Run, Summary, read_run


def run_slo(run: Run, slo_ms: dict[str, float] | None) -> dict[str, float] | None:
    return slo_ms or slo_from_keys(run.manifest.get("slo") or {}) or None


def check_slo_classes(run: Run, slo_ms: dict[str, float] | None) -> None:
    """A bound given to a class (`--slo ttft=200ms@chat`) names one of the run's [[mix]] classes (ValueError)."""
    classes = set(run.requests["class"].drop_nulls().unique().to_list())
    unknown = sorted(classes_named(slo_ms or {}) - classes)
    if unknown:
        known = f"its classes: {', '.join(sorted(classes))}" if classes else "it has no [[mix]] classes"
        raise ValueError(f"--slo: no class {', '.join(map(repr, unknown))} in the run ({known})")


def build(run_dir: str | Path, opts: ExplainOptions | None = None, slo_ms: dict[str, float] | None = None,
          write: bool = True) -> tuple[Run, Summary, pl.DataFrame]:
    """The run, its summary and its decomposition."""
    opts = opts or ExplainOptions()
    run = read_run(run_dir)
    section, decomposition = explain(run, opts)
    # open or closed loop, the resolved config (shown by every format), and goodput under the SLOs
    slo = run_slo(run, slo_ms)
    check_slo_classes(run, slo_ms)
    summary: Summary = {**summarize(run), **section, "load": run.manifest.get("load") or {"loop": "open"},
                        "config": run.manifest.get("config"),
                        "breakdown": breakdown.breakdown(measured(run), run.tokens, slo)}  # per class, per model
    if slo:
        summary.update(goodput.section(metrics.latency_columns(measured(run)), run.tokens, slo))
    if write:
        run.write_decomposition(decomposition)
        run.write_summary(summary)
    return run, summary, decomposition
