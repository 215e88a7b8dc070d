"""`loadgen export RUN --format csv|jsonl [--out FILE]`: one line per scheduled request, for tools that
do not read Parquet. Columns: every column of requests.parquet (times in ns from t0, null = did not
happen), then the per-request latencies in ms as the report defines them (analysis/summary.py
`latency_columns`), named with their unit: send_lag_ms, connect_ms, ttft_ms, ttfa_ms, ttft_from_send_ms, e2e_ms,
tpot_ms. Rows in plan order (idx); warm-up rows included (column `warmup`).
"""
from __future__ import annotations

import sys
from pathlib import Path

import polars as pl

from loadgen import metrics
from loadgen.results.folder import ResultsError, read_run, write_bytes_durably

FORMATS = ("csv", "jsonl")
_LATENCY = ("send_lag", "connect", "ttft", "ttfa", "ttft_from_send", "e2e", "tpot")


def export_frame(run_dir: str | Path) -> pl.DataFrame:
    req = read_run(run_dir).requests.sort("idx")
    return metrics.latency_columns(req).rename({c: f"{c}_ms" for c in _LATENCY})


def export(run_dir: str | Path, fmt: str, out: str | None = None) -> int:
    """Write the rows to `out` (whole or not at all: a StorageError naming it), or to stdout; returns
    how many. Whether `out` may be written is the caller's rule (cli/common.out_file)."""
    df = export_frame(run_dir)
    if out is not None:
        write_bytes_durably(Path(out), (df.write_csv() if fmt == "csv" else df.write_ndjson()).encode())
        return df.height
    try:
        if fmt == "csv":
            df.write_csv(sys.stdout.buffer)
        else:
            df.write_ndjson(sys.stdout.buffer)
    except OSError as e:
        if isinstance(e, BrokenPipeError):
            raise
        raise ResultsError(f"stdout: cannot write: {e.strerror or e}") from None
    return df.height
