"""The shares of a run split over several processes (--workers, --ray) merged into the files one process
writes, so that every results folder has the same files whatever the mode (folder.py).

While such a run goes, process w keeps its share under _parts/ (workers.PartWriter):
    requests-<w>-NNNNN.parquet, tokens-<w>-NNNNN.parquet   its rows as flushed, times ns from the run's t0
    <metric>.<w>.hlog                                      its interval logs (intervals from t0, 1 s)
    manifest-<w>.json                                      its process record (status, t0, generator)
At the end the driver writes tokens.parquet, one <metric>.hlog per metric and requests.parquet (every
row, idx order), in that order, then removes _parts/. A driver killed before that leaves _parts/, which
read_run() and the summary's histograms still read.

Interval logs merge exactly: the intervals of every share that start at the same instant (whole seconds
from t0; the timestamps have ms resolution) become one interval holding the sum of their histograms and
out-of-range counts, ending where the latest of them ends. Each share's last interval is shorter (it ends
when that process stopped); the merged one covers them all. So every interval's counts, and the whole
run's histogram, equal the sum of the shares'. Tags are not kept (loadgen's logs have none).
"""
from __future__ import annotations

import os
import shutil
from typing import Any
from pathlib import Path

import orjson
import polars as pl

from loadgen.errors import StorageError
from loadgen.results import hdr
from loadgen.results.folder import PARTS, REQUEST_SCHEMA, TOKEN_SCHEMA, write_parquet


def share_requests(path: str | Path) -> pl.DataFrame:
    """Every row the shares under _parts/ hold, sorted by idx (REQUEST_SCHEMA)."""
    return _concat(sorted((Path(path) / PARTS).glob("requests-*.parquet")), REQUEST_SCHEMA).sort("idx")


def share_record(path: str | Path, worker: int) -> dict[str, Any] | None:
    """Process w's record (manifest-<w>.json), None when it wrote none (it died) or it is unreadable."""
    try:
        record: dict[str, Any] = orjson.loads((Path(path) / PARTS / f"manifest-{worker}.json").read_bytes())
        return record
    except (OSError, orjson.JSONDecodeError):
        return None


def merge_shares(path: str | Path, requests: pl.DataFrame, start_wall_s: float) -> None:
    """Write the one-process files from the shares (requests: share_requests() with any rows the driver
    adds, e.g. those of a worker that died), then remove _parts/. start_wall_s: the wall clock at t0.
    A write that fails (StorageError, raised) removes the merged files written so far: the shares under
    _parts/ stay the run's record, which read_run and `report` read."""
    p = Path(path)
    merged = [p / "tokens.parquet", *(hdr.log_path(p, m) for m in hdr.METRICS), p / "requests.parquet"]
    try:
        write_parquet(p / "tokens.parquet", _concat(sorted((p / PARTS).glob("tokens-*.parquet")), TOKEN_SCHEMA))
        for m in hdr.METRICS:
            logs = sorted((p / PARTS).glob(f"{m}.*.hlog"))
            if logs:
                try:
                    merge_interval_logs(logs, hdr.log_path(p, m), start_wall_s)
                except OSError as e:
                    raise StorageError(str(hdr.log_path(p, m)), e) from None
        write_parquet(p / "requests.parquet", requests.sort("idx"))
    except StorageError:
        for f in merged:
            f.unlink(missing_ok=True)
        raise
    shutil.rmtree(p / PARTS, ignore_errors=True)


def merge_interval_logs(paths: list[Path], out: Path, start_wall_s: float) -> hdr.Recorded:
    """One interval log from several (module docstring), written atomically; returns the whole run's."""
    starts: dict[int, list[hdr.Interval]] = {}
    for path in paths:
        for iv in hdr.read_interval_log(path):
            starts.setdefault(round(iv.start_s * 1000), []).append(iv)
    total = hdr.Recorded(hdr.new_histogram(), 0)
    tmp = out.with_name(f".{out.name}.tmp")
    try:
        with hdr.IntervalLogWriter(tmp, start_wall_s=start_wall_s) as w:
            for start_ms in sorted(starts):
                ivs = starts[start_ms]
                end_ms = max(round((iv.start_s + iv.length_s) * 1000) for iv in ivs)
                rec = hdr.Recorded(hdr.merge(iv.hist for iv in ivs), sum(iv.out_of_range for iv in ivs))
                w.write_interval(start_ms * 1_000_000, max(end_ms, start_ms) * 1_000_000, rec)
                total.add(rec)
            w.close(fsync=True)
        os.replace(tmp, out)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return total


def _concat(files: list[Path], schema: dict[str, Any]) -> pl.DataFrame:
    return pl.concat([pl.read_parquet(f) for f in files]) if files else pl.DataFrame(schema=schema)
