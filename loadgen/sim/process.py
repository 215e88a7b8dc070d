"""Start `loadgen sim` as a child process on a free loopback port, and stop it by PID.

Used by `loadgen run` without `--url` and by the integration tests. The simulator prints
`listening on http://HOST:PORT` on stdout once it accepts connections.

Its life is tied to this process: the child asks the kernel (prctl PR_SET_PDEATHSIG) for SIGTERM when
its parent dies, so a `kill -9` of `loadgen run` (or a Ctrl-C while the simulator starts) never leaves a
simulator behind. Its stderr is relayed to ours line by line (asyncio's shutdown noise, "Task was
destroyed but it is pending!" and the task line after it, is dropped) and its last lines are kept, so a
simulator that exits at once is reported with its own error, not as a start timeout.
"""
from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import threading
from collections import deque
from dataclasses import dataclass, field

from loadgen.errors import SimStartError  # noqa: F401  (raised here; importable from here too)

PR_SET_PDEATHSIG = 1
_NOISE = "Task was destroyed but it is pending!"


def _die_with_parent(parent_pid: int):
    # Runs in the child between fork and exec (preexec_fn): only async-signal-safe work here.
    def hook() -> None:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        except (OSError, AttributeError):
            return  # not Linux: the simulator is stopped by stop() only
        if os.getppid() != parent_pid:  # the parent died before prctl took effect
            os._exit(1)
    return hook


@dataclass
class SimProcess:
    args: list[str] = field(default_factory=list)  # flags after `loadgen sim`
    start_timeout_s: float = 30.0
    url: str = ""
    proc: subprocess.Popen | None = None
    stderr_tail: deque = field(default_factory=lambda: deque(maxlen=20))

    def start(self) -> str:
        cmd = [sys.executable, "-m", "loadgen", "sim", "--port", "0", "--host", "127.0.0.1", *self.args]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     start_new_session=True, preexec_fn=_die_with_parent(os.getpid()))
        self._stderr_done, self._echo = threading.Event(), threading.Event()
        threading.Thread(target=self._relay_stderr, daemon=True).start()
        found: list[str] = []

        def read_banner() -> None:
            for line in self.proc.stdout:  # type: ignore[union-attr]
                if line.startswith("listening on "):
                    found.append(line.split("listening on ", 1)[1].strip())
                    break

        reader = threading.Thread(target=read_banner, daemon=True)
        reader.start()
        reader.join(self.start_timeout_s)  # returns early when the child exits (stdout closes)
        if not found:
            code = self.proc.poll()
            if code is None and not reader.is_alive():  # stdout closed: it is exiting, reap it
                try:
                    code = self.proc.wait(5.0)
                except subprocess.TimeoutExpired:
                    pass
            self.stop()
            if code is None:
                raise SimStartError(f"simulator did not start within {self.start_timeout_s:g}s: {' '.join(cmd)}")
            self.proc.wait()
            self._stderr_done.wait(2.0)
            said = "\n  ".join(self.stderr_tail) or "(nothing on stderr)"
            raise SimStartError(f"the built-in simulator exited at once (exit code {code}):\n  {said}")
        self.url = found[0]
        self._echo.set()  # from now on its stderr is the user's to see (before, it goes into the error)
        # Keep draining stdout so the child never blocks on a full pipe.
        threading.Thread(target=lambda: [None for _ in self.proc.stdout], daemon=True).start()  # type: ignore[union-attr]
        return self.url

    def _relay_stderr(self) -> None:
        skip_next = False
        try:
            for line in self.proc.stderr:  # type: ignore[union-attr]
                if skip_next and line.startswith("task: <Task"):
                    skip_next = False
                    continue
                skip_next = line.strip() == _NOISE
                if skip_next:
                    continue
                self.stderr_tail.append(line.rstrip("\n"))
                if self._echo.is_set():
                    sys.stderr.write(line)
        finally:
            self._stderr_done.set()

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
