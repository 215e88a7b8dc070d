"""How long a server's process waited for a CPU: the premise check of the e2e tests whose judgement needs the
server to keep its speed (a busy shared host holds it back: beside two CPU burners llama-server waited 48 %
of its runnable time during a fit)."""
from __future__ import annotations

import os
from pathlib import Path


class Waited:
    """The server's compute thread (the one with the most CPU time meanwhile): run_delay / (cpu + run_delay)
    between start() and share(), from /proc/PID/task/TID/schedstat (cpu ns, run-queue wait ns, slices).
    group: every process of PID's process group (vLLM: its engine core is a child in the group it leads)."""

    def __init__(self, pid: int, group: bool = False):
        self.pid, self.group = pid, group
        self.t0: dict[str, tuple[int, int]] = {}

    def _pids(self) -> list[str]:
        if not self.group:
            return [str(self.pid)]
        out = []
        for p in filter(str.isdigit, os.listdir("/proc")):
            try:
                if int(Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[2]) == self.pid:
                    out.append(p)
            except (OSError, ValueError, IndexError):
                continue
        return out

    def _read(self) -> dict[str, tuple[int, int]]:
        out = {}
        for pid in self._pids():
            try:
                tids = os.listdir(f"/proc/{pid}/task")
            except OSError:
                continue
            for tid in tids:
                try:
                    cpu, wait, _ = (int(x) for x in Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split())
                except (OSError, ValueError):
                    continue
                out[tid] = (cpu, wait)
        return out

    def start(self) -> "Waited":
        self.t0 = self._read()
        return self

    def share(self) -> float:
        now = self._read()
        d = [(c - self.t0.get(t, (0, 0))[0], w - self.t0.get(t, (0, 0))[1]) for t, (c, w) in now.items()]
        cpu, wait = max(d)
        return wait / (cpu + wait) if cpu + wait else 0.0


HOST_BUSY_MAX = 0.95   # a fit's premise: the host's CPUs were not all busy (client and server had room)


class HostBusy:
    """The share of the host's CPU time that was busy (not idle, not waiting for I/O) between start() and
    share(), from /proc/stat's `cpu` line: near 1, every core had work and the client's and the server's
    threads queued behind each other and other work; None where /proc/stat cannot be read."""

    def __init__(self):
        self.t0: tuple[int, int] | None = None

    @staticmethod
    def _read() -> tuple[int, int] | None:
        try:
            ticks = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
        except (OSError, ValueError, IndexError):
            return None
        return sum(ticks), ticks[3] + (ticks[4] if len(ticks) > 4 else 0)   # all, idle + iowait

    def start(self) -> "HostBusy":
        self.t0 = self._read()
        return self

    def share(self) -> float | None:
        now = self._read()
        if now is None or self.t0 is None or now[0] <= self.t0[0]:
            return None
        total, idle = now[0] - self.t0[0], now[1] - self.t0[1]
        return 1 - idle / total
