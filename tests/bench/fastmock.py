"""fastmock.c built and started for the bench: a fixed-mode streaming server in C with the simulator's truth.

bench_fast runs its cases against it wherever gcc builds it (else, or with `BENCH_SERVER=sim`, against
`loadgen sim --mode fixed`: the same TTFT, ITL and truth columns, far less precise). The one-core Python
simulator saturates near 1,600 req/s of 16-token streams on the shared 2-core VM; this server is not the
limit there, so the client's own ceiling shows (issue 29 part 3).
Built with the machine's gcc into $LOADGEN_CACHE (default ~/.cache/loadgen)/bench/, keyed on the source's
hash (nothing is written into the checkout), and stopped by PID. build("cclient") builds the C reference
client the same way (bench_fast's client `c`).
"""
from __future__ import annotations

import hashlib
import os
import signal
import subprocess
from pathlib import Path

HERE = Path(__file__).parent


def build(name: str = "fastmock") -> Path:
    """tests/bench/NAME.c (fastmock, or cclient: the C reference client) compiled into the cache, once per source."""
    source = HERE / f"{name}.c"
    digest = hashlib.sha256(source.read_bytes()).hexdigest()[:12]
    cache = Path(os.environ.get("LOADGEN_CACHE", Path.home() / ".cache" / "loadgen")) / "bench"
    exe = cache / f"{name}-{digest}"
    if not exe.exists():
        cache.mkdir(parents=True, exist_ok=True)
        tmp = exe.with_suffix(".tmp")
        subprocess.run(["gcc", "-O2", "-Wall", "-o", str(tmp), str(source), "-lm"], check=True)
        tmp.rename(exe)
    return exe


class FastMock:
    """The same surface as loadgen.sim.process.SimProcess where the bench uses it: start(), url, proc, stop()."""

    def __init__(self, truth: Path, ttft_us: int = 20_000, itl_us: int = 5_000):
        self.truth, self.ttft_us, self.itl_us = truth, ttft_us, itl_us
        self.url = ""
        self.proc: subprocess.Popen | None = None

    def start(self) -> str:
        self.proc = subprocess.Popen([str(build()), "0", str(self.ttft_us), str(self.itl_us), str(self.truth)],
                                     stdout=subprocess.PIPE, text=True, start_new_session=True)
        line = self.proc.stdout.readline()  # type: ignore[union-attr]  # "listening PORT" once it accepts
        if not line.startswith("listening "):
            self.stop()
            raise RuntimeError(f"fastmock did not start (exit {self.proc.poll()}): {line!r}")
        self.url = f"http://127.0.0.1:{int(line.split()[1])}"
        return self.url

    def stop(self) -> None:
        # SIGTERM: it writes out its truth file and exits
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
