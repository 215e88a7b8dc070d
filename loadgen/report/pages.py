"""Entry point of the page formats (`--format html|md`) of `loadgen report`."""
from __future__ import annotations

import polars as pl

from loadgen.analysis.explain import load_metrics
from loadgen.results import Run


def render_run_page(fmt: str, summary: dict, run: Run, decomposition: pl.DataFrame | None) -> str:
    if fmt == "md":
        from loadgen.report.markdown import render_run

        return render_run(summary)
    from loadgen.report.html import render_run

    return render_run(summary, run, decomposition, load_metrics(run))
