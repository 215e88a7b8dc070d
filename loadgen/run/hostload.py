"""Was the client starved or saturated? The kernel's own counters, read before and after a run (Linux).

sample() reads, for this process:
- per thread, /proc/self/task/TID/schedstat: ns on a CPU (field 1) and ns waiting on a run queue (field 2:
  runnable but not running, i.e. another task had the CPU); the event loop is the main thread (TID = pid);
- /proc/self/stat utime + stime (fields 14, 15; clock ticks): the whole process's CPU;
- /proc/stat's `cpu` line (ticks, all CPUs): busy = user + nice + system + irq + softirq + steal, and steal.
delta(a, b) turns two samples into the figures the self-check reads (selfcheck.cause):
    wall_s               the span between the samples
    loop_cpu_share       the event-loop thread's CPU / wall (1.0 = a whole core: saturated)
    loop_runqueue_share  the event-loop thread's run-queue wait / wall (starved: runnable, not running)
    threads_runqueue_s   the run-queue wait of all the process's threads
    own_cpu_cores        the process's CPU / wall, in cores
    others_cpu_cores     every other process's CPU / wall, in cores (busy ticks minus this process's)
    steal_share          steal ticks / all ticks (a hypervisor ran another guest)
    cpus                 the CPUs this process may run on (sched_getaffinity); host_cpus: all of them
Where a file cannot be read (not Linux, a restricted /proc), the figures it feeds are None.
"""
from __future__ import annotations

import os
import time
from pathlib import Path

TICK_S = 1.0 / os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 0.01


def _read(path: str | Path) -> str | None:
    try:
        return Path(path).read_text()
    except OSError:
        return None


def _schedstat(text: str | None) -> tuple[int, int] | None:
    parts = (text or "").split()
    return (int(parts[0]), int(parts[1])) if len(parts) >= 2 else None


def _threads() -> dict[int, tuple[int, int]]:
    out: dict[int, tuple[int, int]] = {}
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return out
    for tid in tids:
        s = _schedstat(_read(f"/proc/self/task/{tid}/schedstat"))
        if s is not None and tid.isdigit():
            out[int(tid)] = s
    return out


def _own_ticks() -> int | None:
    text = _read("/proc/self/stat")
    if not text:
        return None
    fields = text.rsplit(")", 1)[1].split()   # after the command name, which may hold spaces
    return int(fields[11]) + int(fields[12])  # utime, stime: fields 14 and 15 of the whole line


def _cpu_ticks() -> tuple[int, int, int] | None:
    """(busy, steal, total) ticks of /proc/stat's `cpu` line."""
    text = _read("/proc/stat")
    if not text or not text.startswith("cpu "):
        return None
    v = [int(x) for x in text.split("\n", 1)[0].split()[1:]]
    v += [0] * (8 - len(v))
    user, nice, system, idle, iowait, irq, softirq, steal = v[:8]
    busy = user + nice + system + irq + softirq + steal
    return busy, steal, busy + idle + iowait


def sample() -> dict:
    return {"wall_ns": time.monotonic_ns(), "pid": os.getpid(), "threads": _threads(),
            "own_ticks": _own_ticks(), "cpu": _cpu_ticks()}


def delta(a: dict, b: dict) -> dict:
    """The figures between two samples (module docstring)."""
    wall_s = (b["wall_ns"] - a["wall_ns"]) / 1e9
    out: dict = {"wall_s": wall_s, "loop_cpu_share": None, "loop_runqueue_share": None, "threads_runqueue_s": None,
                 "own_cpu_cores": None, "others_cpu_cores": None, "steal_share": None,
                 "cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
                 "host_cpus": os.cpu_count()}
    if wall_s <= 0:
        return out
    main_a, main_b = a["threads"].get(a["pid"]), b["threads"].get(b["pid"])
    if main_a and main_b:
        out["loop_cpu_share"] = (main_b[0] - main_a[0]) / 1e9 / wall_s
        out["loop_runqueue_share"] = (main_b[1] - main_a[1]) / 1e9 / wall_s
    if b["threads"]:
        out["threads_runqueue_s"] = sum(w - a["threads"].get(t, (0, 0))[1] for t, (_, w) in b["threads"].items()) / 1e9
    own = None if a["own_ticks"] is None or b["own_ticks"] is None else b["own_ticks"] - a["own_ticks"]
    if own is not None:
        out["own_cpu_cores"] = own * TICK_S / wall_s
    if a["cpu"] and b["cpu"]:
        busy, steal, total = (y - x for x, y in zip(a["cpu"], b["cpu"]))
        out["steal_share"] = steal / total if total > 0 else None
        if own is not None:
            out["others_cpu_cores"] = max(0.0, (busy - own) * TICK_S / wall_s)
    return out
