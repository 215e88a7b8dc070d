"""RSS of `loadgen run` over a long run: does the client's memory stay flat?

    python -m tests.bench.bench_memory      (part of `make bench`)

Environment: BENCH_MEMORY_S (default 600: the issue's 10-minute run), BENCH_MEMORY_RATE (200 req/s),
BENCH_MEMORY_TOKENS (64). A fixed-mode simulator (TTFT 20 ms, ITL 5 ms) serves; the client's resident
set (/proc/PID/status VmRSS) is sampled every second. Printed: RSS once the run is under way (at 10 % of
it), at its end, the growth per minute in between, and the growth per request (what every request's
kept row and chunk stamps cost until the run ends).
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from loadgen.sim.process import SimProcess
from tests.bench.bench_fast import workload


def rss_kib(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def run(duration_s: float, rate: float, tokens: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="lgbench-memory-") as d:
        tmp = Path(d)
        sim = SimProcess(args=["--mode", "fixed", "--ttft", "20ms", "--itl", "5ms"])
        sim.start()
        try:
            w = workload(tmp / "w.toml", rate, duration_s, tokens)
            p = subprocess.Popen([sys.executable, "-m", "loadgen", "run", str(w), "--url", sim.url, "--out",
                                  str(tmp / "run"), "--quiet", "--no-calibrate"],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            start, samples = time.monotonic(), []
            while p.poll() is None:
                kib = rss_kib(p.pid)
                if kib is not None:
                    samples.append((time.monotonic() - start, kib))
                time.sleep(1.0)
            err = p.stderr.read().decode(errors="replace")
        finally:
            sim.stop()
        if p.returncode not in (0, 3):
            raise RuntimeError(f"loadgen run failed ({p.returncode}): {err[-1000:]}")
    # the run proper: from 10 % of the schedule (set-up done, steady state) to its end
    steady = [(t, k) for t, k in samples if duration_s * 0.1 <= t <= duration_s]
    (t1, k1), (t2, k2) = steady[0], steady[-1]
    minutes = (t2 - t1) / 60
    return {"duration_s": duration_s, "rate_per_s": rate, "tokens": tokens, "rss_start_mib": k1 / 1024,
            "rss_end_mib": k2 / 1024, "growth_mib_per_min": (k2 - k1) / 1024 / minutes if minutes else None,
            "growth_kib_per_request": (k2 - k1) / (rate * (t2 - t1)) if t2 > t1 else None,
            "peak_mib": max(k for _, k in samples) / 1024}


def main() -> int:
    duration_s = float(os.environ.get("BENCH_MEMORY_S", "600"))
    rate = float(os.environ.get("BENCH_MEMORY_RATE", "200"))
    tokens = int(os.environ.get("BENCH_MEMORY_TOKENS", "64"))
    r = run(duration_s, rate, tokens)
    print(f"memory: loadgen run {duration_s:g} s at {rate:g} req/s x {tokens} tokens: RSS {r['rss_start_mib']:.0f} "
          f"MiB at 10 % -> {r['rss_end_mib']:.0f} MiB at the end ({r['growth_mib_per_min']:.1f} MiB/min, "
          f"{r['growth_kib_per_request']:.2f} KiB per request), peak {r['peak_mib']:.0f} MiB", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
