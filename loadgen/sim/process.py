"""Start `loadgen sim` as a child process on a free loopback port, and stop it by PID.

Used by `loadgen run` without `--url` and by the integration tests. The simulator prints
`listening on http://HOST:PORT` on stdout once it accepts connections.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from loadgen.errors import SimStartError  # noqa: F401  (raised here; importable from here too)


@dataclass
class SimProcess:
    args: list[str] = field(default_factory=list)  # flags after `loadgen sim`
    start_timeout_s: float = 30.0
    url: str = ""
    proc: subprocess.Popen | None = None

    def start(self) -> str:
        cmd = [sys.executable, "-m", "loadgen", "sim", "--port", "0", "--host", "127.0.0.1", *self.args]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=None, text=True,
                                     start_new_session=True)
        found: list[str] = []

        def read_banner() -> None:
            for line in self.proc.stdout:  # type: ignore[union-attr]
                if line.startswith("listening on "):
                    found.append(line.split("listening on ", 1)[1].strip())
                    break

        reader = threading.Thread(target=read_banner, daemon=True)
        reader.start()
        reader.join(self.start_timeout_s)
        if not found:
            self.stop()
            raise SimStartError(f"simulator did not start within {self.start_timeout_s}s: {' '.join(cmd)}")
        self.url = found[0]
        # Keep draining stdout so the child never blocks on a full pipe.
        threading.Thread(target=lambda: [None for _ in self.proc.stdout], daemon=True).start()  # type: ignore[union-attr]
        return self.url

    def stop(self, timeout_s: float = 10.0) -> int | None:
        """SIGTERM (the simulator flushes its truth file), then SIGKILL after timeout_s."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        return self.proc.returncode

    def __enter__(self) -> SimProcess:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
