"""Entry points of the page formats (`--format html|md`) of `loadgen report`: a run's results folder, or a
sweep (folder or sweep_summary.json) or a comparison (`loadgen compare --format json` saved to a file)."""
from __future__ import annotations

from pathlib import Path

import orjson
import polars as pl

from loadgen.errors import InputError
from loadgen.results.folder import ResultsError, Run, Summary
from loadgen.report.html import render_run as render_html
from loadgen.report.markdown import render_run as render_md
from loadgen.report.sweep_pages import kind_of, render


def render_run_page(fmt: str, summary: Summary, run: Run, decomposition: pl.DataFrame | None) -> str:
    if fmt == "md":
        return render_md(summary)
    return render_html(summary, run, decomposition, run.server_metrics())


def render_sweep_or_compare(path: str, fmt: str, prediction: dict | None = None) -> str | None:
    """The page of a sweep or comparison at path; None when path is not one (then it is a run's folder).
    A prediction (`loadgen predict --format json`) is drawn over a sweep's HTML curves."""
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
    return render(d, fmt, prediction)


def read_prediction(path: str) -> dict:
    """`loadgen predict --format json`'s output at path; InputError naming --prediction and the file."""
    try:
        d = orjson.loads(Path(path).read_bytes())
    except (OSError, orjson.JSONDecodeError) as e:
        raise InputError([f"--prediction {path}: {e}"]) from None
    pts = d.get("points") if isinstance(d, dict) and "profile" in d and "knee" in d else None
    if not isinstance(pts, list) or not pts or not all(isinstance(p, dict) and "rate_per_s" in p
                                                       and "latency_ms" in p for p in pts):
        raise InputError([f"--prediction {path}: not the output of `loadgen predict --format json` "
                           "(profile, knee, points[] with rate_per_s and latency_ms)"])
    return d
