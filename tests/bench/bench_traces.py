"""Benchmark: load a 5-million-row BurstGPT-format CSV with loadgen.plan.traces.read.

    python -m tests.bench.bench_traces [ROWS] [--keep FILE]

Writes a synthetic file (not timed), then loads it in a fresh child process so the figures are the
reader's alone: wall seconds and the child's peak resident memory (ru_maxrss). Prints one JSON line.
Not collected by pytest (testpaths are tests/unit and tests/integration); `make bench` runs it.
"""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import polars as pl

# Peak memory: VmHWM of the child's own address space (ru_maxrss would carry the parent's peak over fork).
HWM = """
def hwm_mib():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return round(int(line.split()[1]) / 1024, 1)
"""
LOAD = HWM + """
import json, sys, time
from loadgen.plan import traces
t0 = time.perf_counter()
t = traces.read(sys.argv[1], "burstgpt")
dt = time.perf_counter() - t0
print(json.dumps({"rows": len(t), "skipped": t.skipped, "load_s": round(dt, 3), "peak_rss_mib": hwm_mib()}))
"""


def write_burstgpt(path: Path, rows: int, seed: int = 1) -> None:
    rng = np.random.default_rng(seed)
    ts = np.cumsum(rng.exponential(0.05, rows))
    req = np.clip(rng.lognormal(np.log(600), 1.0, rows), 1, 32000).astype(np.int64)
    resp = np.where(rng.random(rows) < 0.03, 0,
                    np.clip(rng.lognormal(np.log(150), 0.8, rows), 1, 4000)).astype(np.int64)
    pl.DataFrame({"Timestamp": np.round(ts, 3), "Model": np.where(rng.random(rows) < 0.8, "ChatGPT", "GPT-4"),
                  "Request tokens": req, "Response tokens": resp, "Total tokens": req + resp,
                  "Log Type": "Conversation log"}).write_csv(path)


def main() -> None:
    rows = int(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1].isdigit() else 5_000_000
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "burstgpt_5m.csv"
        write_burstgpt(path, rows)
        baseline = subprocess.run([sys.executable, "-c", HWM + "import loadgen.plan.traces; print(hwm_mib())"],
                                  capture_output=True, text=True, check=True)
        t0 = time.perf_counter()
        p = subprocess.run([sys.executable, "-c", LOAD, str(path)], capture_output=True, text=True, check=True)
        out = json.loads(p.stdout)
        out.update(file_mib=round(path.stat().st_size / 2**20, 1), child_wall_s=round(time.perf_counter() - t0, 2),
                   import_rss_mib=round(float(baseline.stdout), 1), bench="traces.read burstgpt")
        print(json.dumps(out))


if __name__ == "__main__":
    main()
