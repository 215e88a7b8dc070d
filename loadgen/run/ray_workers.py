"""`loadgen run --ray auto|ADDRESS`: the workers of workers.py as Ray actors, spread over a cluster's nodes.

Contract (what differs from workers.py; the plan split, the part files, the dead-worker rows and the
self-checks are the same code):
- `auto` joins the cluster that `ray start` runs on this host (ray.init(address="auto")), ADDRESS any
  other (ray.init(address=ADDRESS)); the actors are placed with the SPREAD strategy;
- one clock for all nodes is the wall clock: before the start, the driver measures each actor's offset
  (its time.time_ns() against the midpoint of the driver's call, CLOCK_SKEW_PROBES tries, the one of
  least round trip kept); once every actor is set up, the driver picks the start as a wall-clock
  instant START_LEAD_S ahead (driver time) and each actor turns it into its own CLOCK_MONOTONIC t0
  (start - its offset, converted on its host); manifest.json `ray` records every node's offset and round
  trip; the run is invalid when a skew exceeds the send-lag limit (the schedule would be off by more than
  the self-check tolerates, unseen by it);
- each actor writes its part in a local temporary folder and returns its files; the driver writes them
  into the results folder. An actor that dies returns nothing: all its requests are recorded `dropped`.
Requires `pip install 'loadgen[ray]'`; without Ray, `--ray` is refused (exit 2) with that line.
"""
from __future__ import annotations

import os
import secrets
import sys
import tempfile
import time
from pathlib import Path
from typing import TextIO

import numpy as np

from loadgen.config.workload import RunConfig, with_overrides
from loadgen.plan.schedule import build
from loadgen.run.workers import Part, PartWriter, _finish, assign, count_for

START_LEAD_S = 3.0
CLOCK_SKEW_PROBES = 5
INSTALL_HINT = "--ray needs Ray on every node: pip install 'loadgen[ray]'"


def available() -> bool:
    import importlib.util

    return importlib.util.find_spec("ray") is not None


class _RayPart(Part):
    # t0 comes from the driver's coordinator actor: ready -> wait for the wall-clock start -> local monotonic
    def wait_for_t0(self) -> int:
        import ray

        ray.get(self.conn.ready.remote(self.worker))
        while (start_wall_ns := ray.get(self.conn.start.remote())) is None:
            time.sleep(0.01)
        offset_ns = self.offset_ns or 0
        return time.monotonic_ns() + (start_wall_ns + offset_ns - time.time_ns())

    offset_ns: int | None = None


class _Coordinator:
    def __init__(self):
        self._ready, self._start = set(), None

    def ready(self, w: int) -> None:
        self._ready.add(w)

    def n_ready(self) -> int:
        return len(self._ready)

    def set_start(self, wall_ns: int) -> None:
        self._start = wall_ns

    def start(self) -> int | None:
        return self._start


class _Worker:
    def now_ns(self) -> int:
        return time.time_ns()

    def node(self) -> dict:
        import socket

        return {"hostname": socket.gethostname(), "pid": os.getpid()}

    def run(self, config: RunConfig, indices: np.ndarray, worker: int, run_id: str, url: str, builtin: bool,
            coordinator, offset_ns: int) -> tuple[dict[str, bytes], str]:
        import asyncio

        import uvloop

        from loadgen.client.backends import make_backend
        from loadgen.run.launch import _run, request_bodies

        with tempfile.TemporaryDirectory(prefix="loadgen-ray-") as d:
            schedule = build(config)
            backend = make_backend(config.backend, config.api, config.model, config.extra_body)
            writer = PartWriter(d, worker)
            writer.prepare()
            bodies, shaper, info = request_bodies(config, schedule, backend, url)
            part = _RayPart(worker, indices, run_id, coordinator)
            part.offset_ns = offset_ns
            outcome = asyncio.Runner(loop_factory=uvloop.new_event_loop).run(
                _run(config, schedule, backend, bodies, writer, url, builtin, None, shaper, info, part=part))
            files = {f.name: f.read_bytes() for f in Path(d).iterdir() if f.is_file()}
        return files, outcome.status


class _Ended:
    # what _finish reads of a worker process (workers.py); here, of an actor
    def __init__(self, pid: int | None, exitcode: int | None):
        self.pid, self.exitcode = pid, exitcode


def measure_offset(actor) -> tuple[int, int]:
    """(offset ns = actor's wall clock - the driver's, round trip ns) of the least-delayed of a few probes."""
    import ray

    best = None
    for _ in range(CLOCK_SKEW_PROBES):
        a = time.time_ns()
        remote = ray.get(actor.now_ns.remote())
        b = time.time_ns()
        if best is None or b - a < best[1]:
            best = (remote - (a + b) // 2, b - a)
    return best


def run_ray(config: RunConfig, progress: TextIO | None = sys.stderr):
    import ray

    from loadgen.run.launch import RunOutcome, _say, default_out
    from loadgen.results.folder import RunWriter
    from loadgen.sim.process import SimProcess

    schedule = build(config)
    n = count_for(config, schedule)
    config = with_overrides(config, "--ray", workers=n, out=str(config.out or default_out(config)))
    owner = assign(schedule, n)
    writer = RunWriter(config.out)
    writer.prepare()
    run_id = secrets.token_hex(4)
    ray.init(address="auto" if config.ray == "auto" else config.ray, log_to_driver=False,
             configure_logging=False)
    sim, url = None, config.url
    try:
        if url is None:
            sim = SimProcess(args=[*config.sim_args, "--truth", str(writer.path / "sim_truth.parquet")])
            url = sim.start()
            _say(progress, f"started the built-in simulator at {url}")
        coordinator = ray.remote(num_cpus=0)(_Coordinator).remote()
        Worker = ray.remote(num_cpus=1, scheduling_strategy="SPREAD")(_Worker)
        actors = [Worker.remote() for _ in range(n)]
        nodes = []
        for w, a in enumerate(actors):
            offset_ns, rtt_ns = measure_offset(a)
            nodes.append({"worker": w, **ray.get(a.node.remote()), "offset_ms": offset_ns / 1e6,
                          "rtt_ms": rtt_ns / 1e6})
        calls = [a.run.remote(config if w == 0 else with_overrides(config, "--ray", calibrate=False),
                              np.flatnonzero(owner == w), w, run_id, url, sim is not None, coordinator,
                              round(nodes[w]["offset_ms"] * 1e6))
                 for w, a in enumerate(actors)]
        _say(progress, f"{n} Ray actors on {len({x['hostname'] for x in nodes})} node(s); waiting for set-up")
        while ray.get(coordinator.n_ready.remote()) < n:
            done, _ = ray.wait(calls, timeout=0.05)
            if done and ray.get(coordinator.n_ready.remote()) < n:
                break  # an actor ended before it was ready
        start_wall_ns = time.time_ns() + int(START_LEAD_S * 1e9)
        ray.get(coordinator.set_start.remote(start_wall_ns))
        ended = []
        for w, call in enumerate(calls):
            try:
                files, _ = ray.get(call)
                for name, data in files.items():
                    (writer.path / name).write_bytes(data)
                ended.append(_Ended(nodes[w]["pid"], 0))
            except (ray.exceptions.RayError, OSError) as e:
                _say(progress, f"worker {w}: {type(e).__name__}: {str(e)[:300]}")
                ended.append(_Ended(nodes[w]["pid"], None))
    finally:
        if sim is not None:
            sim.stop()
        ray.shutdown()
    t0 = start_wall_ns
    status, reasons = _finish(config, schedule, owner, ended, run_id, t0, writer.path,
                              extra=_skew_section(config, nodes, start_wall_ns))
    for reason in reasons:
        _say(progress, f"INVALID RUN: {reason}")
    _say(progress, f"[{status}] {n} Ray actors, results in {writer.path}")
    return RunOutcome(writer.path, status, reasons)


def _skew_section(config: RunConfig, nodes: list[dict], start_wall_ns: int) -> dict:
    limit_ms = config.max_send_lag_p99_ns / 1e6
    worst = max(abs(x["offset_ms"]) + x["rtt_ms"] / 2 for x in nodes)
    reasons = ([f"clock skew between Ray nodes up to {worst:.3f} ms (offset + half the round trip) exceeds "
                f"the send-lag limit {limit_ms:g} ms: the workers' schedules may be that far apart"]
               if worst > limit_ms else [])
    return {"ray": {"address": config.ray, "start_unix_ns": start_wall_ns, "nodes": nodes,
                    "max_skew_ms": worst, "skew_limit_ms": limit_ms}, "reasons": reasons}
