"""Entry points of the page formats (`--format html|md`) of `loadgen report`: a run's results folder, or a
sweep (folder or sweep_summary.json) or a comparison (`loadgen compare --format json` saved to a file)."""
from __future__ import annotations

from pathlib import Path

import orjson
import polars as pl

from loadgen.results.folder import ResultsError, Run, Summary
from loadgen.report.html import render_run as render_html
from loadgen.report.markdown import render_run as render_md
from loadgen.report.sweep_pages import kind_of, render


def render_run_page(fmt: str, summary: Summary, run: Run, decomposition: pl.DataFrame | None) -> str:
    if fmt == "md":
        return render_md(summary)
    return render_html(summary, run, decomposition, run.server_metrics())


def render_sweep_or_compare(path: str, fmt: str) -> str | None:
    """The page of a sweep or comparison at path; None when path is not one (then it is a run's folder)."""
    p = Path(path)
    if p.is_dir() and (p / "sweep_summary.json").is_file() and not (p / "manifest.json").is_file():
        p = p / "sweep_summary.json"
    if not (p.is_file() and p.suffix == ".json"):
        return None
    try:
        d = orjson.loads(p.read_bytes())
    except orjson.JSONDecodeError as e:
        raise ResultsError(f"{p}: not valid JSON: {e}") from None
    if not isinstance(d, dict) or kind_of(d) is None:
        raise ResultsError(f"{p}: not a sweep summary or a compare result (its \"kind\" must be "
                           "loadgen-sweep-summary or loadgen-compare)")
    return render(d, fmt)
