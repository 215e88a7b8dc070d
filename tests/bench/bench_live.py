"""The live terminal view's cost (run/liveview.py): `loadgen run` on a pseudo-terminal with the view and
with `--no-live` (the plain progress line), same rate, same simulator, alternating.

    python -m tests.bench.bench_live      (part of `make bench`; ~1.5 min)

Environment: BENCH_LIVE_RATES (default 200,400 req/s), BENCH_LIVE_S (6 s per case), BENCH_LIVE_TOKENS (16
per request), BENCH_LIVE_REPEATS (3). Each case starts `loadgen sim --mode fixed --ttft 20ms --itl 5ms`
pinned to BENCH_SIM_CORE (1) and runs the client pinned to BENCH_CLIENT_CORE (0), its stderr a 120x40
pseudo-terminal that a thread here drains (a terminal that keeps up). Printed per case: CPU per
streamed chunk (manifest.generator.cpu_us_per_chunk: the whole process, the view's thread included),
loop lateness p99, loadgen's verdict; then per rate the median CPU per chunk with and without the view.
"""
from __future__ import annotations

import fcntl
import os
import pty
import statistics
import struct
import subprocess
import sys
import tempfile
import termios
import threading
from pathlib import Path

import orjson

from tests.bench.bench_fast import start_sim, workload

PY = sys.executable


def on_terminal(cmd: list[str]) -> int:
    """Run cmd with its stderr on a fresh 120x40 pseudo-terminal, drained here; its exit status."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))

    def drain():
        while True:
            try:
                if not os.read(master, 65536):
                    return
            except OSError:
                return

    reader = threading.Thread(target=drain)
    reader.start()
    try:
        p = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=slave, env={**os.environ, "TERM": "xterm-256color"})
    finally:
        os.close(slave)
        reader.join(10)
        os.close(master)
    return p.returncode


def one(rate_per_s: float, live: bool, duration_s: float, tokens: int) -> dict:
    sim_core, client_core = os.environ.get("BENCH_SIM_CORE", "1"), os.environ.get("BENCH_CLIENT_CORE", "0")
    with tempfile.TemporaryDirectory(prefix="lgbench-live-") as d:
        tmp = Path(d)
        sim = start_sim(tmp / "truth.jsonl", sim_core)
        try:
            w = workload(tmp / "w.toml", rate_per_s, duration_s, tokens)
            rc = on_terminal(["taskset", "-c", client_core, PY, "-m", "loadgen", "run", str(w), "--url", sim.url,
                              "--out", str(tmp / "run"), *([] if live else ["--no-live"])])
        finally:
            sim.stop()
        if rc not in (0, 3):
            raise RuntimeError(f"loadgen run exited {rc}")
        m = orjson.loads((tmp / "run" / "manifest.json").read_bytes())
    g = m["generator"]
    return {"rate_per_s": rate_per_s, "live": live, "status": m["status"], "cpu_us_per_chunk": g["cpu_us_per_chunk"],
            "loop_lateness_p99_ms": (g.get("loop_lateness_ms") or {}).get("p99")}


def main() -> int:
    rates = [float(x) for x in os.environ.get("BENCH_LIVE_RATES", "200,400").split(",") if x]
    duration_s = float(os.environ.get("BENCH_LIVE_S", "6"))
    tokens = int(os.environ.get("BENCH_LIVE_TOKENS", "16"))
    repeats = int(os.environ.get("BENCH_LIVE_REPEATS", "3"))
    print("live view cost: loadgen run on a pseudo-terminal, with the view and with --no-live", flush=True)
    print(f"{'rate':>6} {'view':<8} {'cpu/chk µs':>10} {'late99 ms':>9}  status", flush=True)
    results = []
    for rep in range(repeats):
        for r in rates:
            for live in ((True, False) if rep % 2 == 0 else (False, True)):  # alternating: no order effect
                res = one(r, live, duration_s, tokens)
                results.append(res)
                late = res["loop_lateness_p99_ms"]
                print(f"{r:>6g} {'live' if live else 'no-live':<8} {res['cpu_us_per_chunk']:>10.1f} "
                      f"{'-' if late is None else f'{late:.2f}':>9}  {res['status']}", flush=True)
    for r in rates:
        on = statistics.median(x["cpu_us_per_chunk"] for x in results if x["rate_per_s"] == r and x["live"])
        off = statistics.median(x["cpu_us_per_chunk"] for x in results if x["rate_per_s"] == r and not x["live"])
        print(f"{r:>6g}/s median CPU per chunk: live {on:.1f} µs, no-live {off:.1f} µs, "
              f"live/no-live {on / off:.3f}x", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
