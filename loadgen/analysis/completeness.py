"""What a results folder is missing: a run killed with SIGKILL (or a crash, or a full disk) leaves its
flushed parts and a manifest whose status is still `running`.

`lost(run)` is None for a run that finished; otherwise it says what was planned and what was found:
{"status", "planned" (manifest schedule.requests: the rows the run scheduled; None for a duration-bounded
closed loop that never finished, whose count is known only at its end), "found", "missing",
"last_recorded_s" (the latest done time of a recorded row, s from t0), "alive" (the run's process still
exists on this host: the run is still going), "write_error"
(manifest.write_error: a run stopped because its results could not be written, e.g. a full disk; else
None), "workers" (a --workers/--ray run: how many workers its driver had, whose shares under _parts/ were
read; else None)} and `reason` puts it in one sentence for the report's invalid reasons.
"""
from __future__ import annotations

import os
import socket

import polars as pl

from loadgen import metrics
from loadgen.results.folder import Manifest, Run

FINISHED = ("complete", "invalid", "interrupted")   # write_failed is not: its rows may be missing


def _alive(manifest: Manifest) -> bool:
    host = manifest.get("host") or {}
    pid = host.get("pid")
    if not isinstance(pid, int) or host.get("hostname") != socket.gethostname():
        return False
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def lost(run: Run) -> dict | None:
    m = run.manifest
    planned = (m.get("schedule") or {}).get("requests")
    found = run.requests.height
    if m.get("status") in FINISHED and (planned is None or found >= planned):
        return None
    done = run.requests["done_ns"].drop_nulls() if "done_ns" in run.requests.columns else pl.Series([])
    return {"status": m.get("status"), "planned": planned, "found": found,
            "missing": planned - found if planned is not None else None,
            "last_recorded_s": float(metrics.number(done.max())) / 1e9 if done.len() else None,
            "alive": _alive(m) and m.get("status") == "running", "write_error": m.get("write_error"),
            "workers": len(m["workers"]) if isinstance(m.get("workers"), list) else None}


def reason(info: dict) -> str:
    failed = info.get("write_error")
    how = ("is still running" if info["alive"] else
           f"stopped because its results could not be written ({failed.get('message')})" if failed else
           "did not finish (killed, e.g. SIGKILL or out of memory, before it wrote its final files)")
    if info.get("workers") and not info["alive"] and not failed:
        how = (f"did not finish: its driver was killed (e.g. SIGKILL) before it merged the shares of its "
               f"{info['workers']} workers (the rows are those their flushed parts under _parts/ hold)")
    last = f"{info['last_recorded_s']:.1f} s" if info["last_recorded_s"] is not None else "none"
    if info["planned"] is None:  # a closed loop bounded by a duration: its users schedule as they go
        return (f"the run {how}: {info['found']} requests have a row (how many it scheduled is not known: "
                f"its closed loop had not reached its deadline); last request recorded at {last} from t0")
    return (f"the run {how}: {info['found']} of {info['planned']} planned requests have a row "
            f"({info['missing']} missing); last request recorded at {last} from t0")
