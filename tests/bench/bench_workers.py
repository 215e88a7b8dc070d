"""`loadgen run --workers N`: the rate held, with the Poisson shape at the server, by 1 and 2 workers.

    python -m tests.bench.bench_workers     (part of `make bench`; ~1 min)

Environment: BENCH_WORKERS_RATES (default 400,800 req/s), BENCH_WORKERS_S (5 s per case),
BENCH_WORKERS_TOKENS (16 per request), BENCH_WORKERS (1,2).
Each case starts `loadgen sim --mode fixed --ttft 20ms --itl 5ms` (one process, with a truth file) and
runs `loadgen run --workers N` against it, unpinned: on a 2-core host the simulator and the workers
share the two cores, so 2 workers cannot show more headroom than the second core leaves after the
simulator; on a host with C free cores the workers scale until C (each one is a separate process with its
own event loop and GIL), e.g. 16 cores: about 15x the rate one worker holds, the simulator (or the real
server) aside. Printed: achieved rate, CV of the gaps between arrivals at the server (Poisson = 1),
index of dispersion of arrivals per 100 ms (Poisson = 1), send lag p99, CPU per chunk, loadgen's verdict.
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import orjson
import polars as pl

from loadgen.sim.process import SimProcess
from tests.bench.bench_fast import workload
from tests.bench.truthcmp import cv, rate, read_truth

PY = sys.executable


def dispersion(t_ns: np.ndarray, window_ns: int = 100_000_000) -> float | None:
    t = np.sort(t_ns)
    counts = np.bincount(((t - t[0]) // window_ns).astype(np.int64))[:-1]
    return float(counts.var() / counts.mean()) if counts.size > 2 and counts.mean() > 0 else None


def one(rate_per_s: float, workers: int, duration_s: float, tokens: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="lgbench-workers-") as d:
        tmp = Path(d)
        sim = SimProcess(args=["--mode", "fixed", "--ttft", "20ms", "--itl", "5ms", "--truth", str(tmp / "t.jsonl")])
        sim.start()
        try:
            w = workload(tmp / "w.toml", rate_per_s, duration_s, tokens)
            p = subprocess.run([PY, "-m", "loadgen", "run", str(w), "--url", sim.url, "--out", str(tmp / "run"),
                                "--workers", str(workers), "--quiet", "--no-calibrate"], capture_output=True, text=True)
        finally:
            sim.stop()
        if p.returncode not in (0, 3):
            raise RuntimeError(f"loadgen run failed ({p.returncode}): {p.stderr[-1000:]}")
        m = orjson.loads((tmp / "run" / "manifest.json").read_bytes())
        arrivals = read_truth(tmp / "t.jsonl")["arrival_ns"].to_numpy()
    g = m.get("generator") or {}
    return {"rate_per_s": rate_per_s, "workers": workers, "achieved_at_server_per_s": rate(arrivals),
            "cv_at_server": cv(arrivals), "dispersion_100ms": dispersion(arrivals),
            "send_lag_p99_ms": g.get("send_lag_p99_ms"), "cpu_us_per_chunk": g.get("cpu_us_per_chunk"),
            "status": m["status"]}


def main() -> int:
    rates = [float(x) for x in os.environ.get("BENCH_WORKERS_RATES", "400,800").split(",") if x]
    counts = [int(x) for x in os.environ.get("BENCH_WORKERS", "1,2").split(",") if x]
    duration_s = float(os.environ.get("BENCH_WORKERS_S", "5"))
    tokens = int(os.environ.get("BENCH_WORKERS_TOKENS", "16"))
    print(f"--workers: rate held at the server (simulator truth), {tokens} tokens per request, {duration_s:g} s "
          f"per case, {os.cpu_count()} CPUs shared by the simulator and the workers", flush=True)
    print(f"{'rate':>6} {'workers':>7} {'achieved':>9} {'CV@srv':>7} {'disp':>6} {'lag99':>7} {'cpu/chk':>8} status")
    results = []
    for r in rates:
        for n in counts:
            try:
                x = one(r, n, duration_s, tokens)
            except Exception as e:  # reported, the other cases still run
                print(f"{r:>6.0f} {n:>7} FAILED: {e!r}"[:300], flush=True)
                continue
            results.append(x)
            f = lambda v, spec: "-" if v is None else format(v, spec)  # noqa: E731
            print(f"{r:>6.0f} {n:>7} {f(x['achieved_at_server_per_s'], '9.1f')} {f(x['cv_at_server'], '7.2f')} "
                  f"{f(x['dispersion_100ms'], '6.2f')} {f(x['send_lag_p99_ms'], '7.3f')} "
                  f"{f(x['cpu_us_per_chunk'], '8.1f')} {x['status']}", flush=True)
    pl.DataFrame(results).write_json(Path(__file__).parent / "results_workers.json") if results else None
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
