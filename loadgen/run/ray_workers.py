"""`loadgen run --ray auto|ADDRESS`: the workers of workers.py as Ray actors, spread over a cluster's nodes.

Contract (what differs from workers.py; the target, the plan split, the shares, the dead-worker rows
and the ending are the same code):
- `auto` joins the cluster that `ray start` runs on this host (ray.init(address="auto")), ADDRESS any
  other (ray.init(address=ADDRESS)); the actors are placed with the SPREAD strategy;
- one clock for all nodes is the wall clock: before the start, the driver measures each actor's offset
  (its time.time_ns() against the midpoint of the driver's call, CLOCK_SKEW_PROBES tries, the one of
  least round trip kept); once every actor is set up, the driver picks the start as a wall-clock
  instant START_LEAD_S ahead (driver time) and each actor turns it into its own CLOCK_MONOTONIC t0
  (start - its offset, converted on its host); each share's times are ns from its own t0; manifest.json
  `t0` is the driver's CLOCK_MONOTONIC at that instant (the clock of the built-in simulator, which runs
  beside the driver), each worker's own t0 is in its `workers` entry; `ray` records every node's
  offset and round trip; the run is invalid when a skew exceeds the send-lag limit (the schedule would
  be off by more than the self-check tolerates, unseen by it);
- each actor keeps its share in a local temporary folder and returns its files; the driver writes them
  into the results folder and merges them as workers.py does. An actor that dies returns nothing: all
  its requests are recorded `dropped`.
Requires `pip install 'loadgen[ray]'`; without Ray, `--ray` is refused (exit 2) with that line.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import os
import signal
import socket
import tempfile
import threading
import time
from pathlib import Path
from typing import TextIO

import numpy as np

from loadgen.config.credentials import clipped
from loadgen.config.workload import RunConfig
from loadgen.plan.schedule import Schedule
from loadgen.results.folder import RunWriter
from loadgen.run.ending import RunFacts, run_manifest
from loadgen.run.inprocess import t0_section
from loadgen.run.outcome import RunOutcome, say
from loadgen.run.prepare import Target, say_workload
from loadgen.run.workers import (STOP_GRACE_S, Part, PartWriter, DriverStop, assign, end_shares, run_share, weights_of,
                                 worker_config)

START_LEAD_S = 3.0
STOP_POLL_S = 0.2   # how often an actor asks whether the driver was signalled
CLOCK_SKEW_PROBES = 5
INSTALL_HINT = "--ray needs Ray on every node: pip install 'loadgen[ray]'"


def available() -> bool:
    return importlib.util.find_spec("ray") is not None


class _RayPart(Part):
    # t0 comes from the driver's coordinator actor: ready -> wait for the wall-clock start -> local monotonic
    offset_ns: int | None = None

    def wait_for_t0(self) -> int:
        import ray

        threading.Thread(target=self._watch_driver, name="driver-watch", daemon=True).start()
        ray.get(self.conn.ready.remote(self.worker, self.info))
        while (start_wall_ns := ray.get(self.conn.start.remote())) is None:
            time.sleep(0.01)
        offset_ns = self.offset_ns or 0
        return time.monotonic_ns() + (start_wall_ns + offset_ns - time.time_ns())

    def _watch_driver(self) -> None:
        """The driver was signalled (the coordinator says so): SIGTERM to this actor's process, which ends
        its share as a single process does (measure's handler), so the actor returns its rows. A driver
        that dies takes its actors with it (Ray's fate sharing: they are owned by its job)."""
        import ray

        while not ray.get(self.conn.stopping.remote()):
            time.sleep(STOP_POLL_S)
        os.kill(os.getpid(), signal.SIGTERM)


class _Coordinator:
    def __init__(self):
        self._ready, self._start, self._infos, self._stop = set(), None, {}, False

    def ready(self, w: int, info: dict | None) -> None:
        self._ready.add(w)
        self._infos[w] = info

    def n_ready(self) -> int:
        return len(self._ready)

    def info(self, w: int) -> dict | None:
        return self._infos.get(w)

    def set_start(self, wall_ns: int) -> None:
        self._start = wall_ns

    def start(self) -> int | None:
        return self._start

    def stop(self) -> None:
        self._stop = True

    def stopping(self) -> bool:
        return self._stop


class _Worker:
    def now_ns(self) -> int:
        return time.time_ns()

    def node(self) -> dict:
        return {"hostname": socket.gethostname(), "pid": os.getpid()}

    def run(self, target: Target, indices: np.ndarray, worker: int, run_id: str, coordinator,
            offset_ns: int) -> dict[str, bytes]:
        """Its share in a local temporary folder; returns the files (path relative to it -> bytes)."""
        with tempfile.TemporaryDirectory(prefix="loadgen-ray-") as d:
            writer = PartWriter(d, worker)
            writer.prepare()
            part = _RayPart(worker, indices, run_id, coordinator)
            part.offset_ns = offset_ns
            run_share(target, part, writer)
            return {str(f.relative_to(d)): f.read_bytes() for f in Path(d).rglob("*") if f.is_file()}


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


def run_ray(target: Target, schedule: Schedule, n: int, writer: RunWriter, run_id: str,
            progress: TextIO | None) -> RunOutcome:
    import ray

    config = target.config
    owner = assign(schedule, n, weights_of(config, n))
    facts, t0, ended = RunFacts(target, schedule, run_id), None, []
    ray.init(address="auto" if config.ray == "auto" else config.ray, log_to_driver=False,
             configure_logging=False)
    stop = DriverStop([])  # SIGINT/SIGTERM to the driver: the coordinator tells the actors (_RayPart._watch_driver)
    try:
        with stop.installed():
            coordinator = ray.remote(num_cpus=0)(_Coordinator).remote()
            Worker = ray.remote(num_cpus=1, scheduling_strategy="SPREAD")(_Worker)
            actors = [Worker.remote() for _ in range(n)]
            nodes = []
            for w, a in enumerate(actors):
                offset_ns, rtt_ns = measure_offset(a)
                nodes.append({"worker": w, **ray.get(a.node.remote()), "offset_ms": offset_ns / 1e6,
                              "rtt_ms": rtt_ns / 1e6})
            calls = [a.run.remote(dataclasses.replace(target, config=worker_config(config, n, w)),
                                  np.flatnonzero(owner == w), w, run_id, coordinator,
                                  round(nodes[w]["offset_ms"] * 1e6))
                     for w, a in enumerate(actors)]
            say(progress, f"{n} Ray actors on {len({x['hostname'] for x in nodes})} node(s); waiting for set-up")
            while ray.get(coordinator.n_ready.remote()) < n and stop.signum is None:
                done, _ = ray.wait(calls, timeout=0.05)
                if done and ray.get(coordinator.n_ready.remote()) < n:
                    break  # an actor ended before it was ready
            start_wall_ns = time.time_ns() + int(START_LEAD_S * 1e9)
            ray.get(coordinator.set_start.remote(start_wall_ns))
            # the actors that are ready start then (t0: the driver's CLOCK_MONOTONIC at that instant)
            t0 = t0_section(time.monotonic_ns() + start_wall_ns - time.time_ns(), start_wall_ns)
            infos = map(ray.get, (coordinator.info.remote(w) for w in range(n)))
            facts.workload = next((i for i in infos if i), {})
            if facts.workload:
                say_workload(progress, facts.workload)
            writer.manifest(run_manifest(facts, t0, workers=[{"worker": x["worker"], "pid": x["pid"]}
                                                              for x in nodes]))
            finished = _wait_all(calls, coordinator, stop)
            for w, call in enumerate(calls):
                try:
                    if call not in finished:
                        raise TimeoutError(f"still running {STOP_GRACE_S:g} s after the driver was signalled")
                    for name, data in ray.get(call).items():
                        (writer.path / name).write_bytes(data)
                    ended.append((nodes[w]["pid"], 0))
                except (ray.exceptions.RayError, OSError) as e:
                    say(progress, f"worker {w}: {type(e).__name__}: {clipped(str(e), 300)}")
                    ended.append((nodes[w]["pid"], None))
    finally:
        ray.shutdown()
    skew, reasons = _skew_section(config, nodes, start_wall_ns)
    return end_shares(facts, writer, t0, owner, ended, progress, f"{n} Ray actors, results in {writer.path}",
                      launcher_reasons=reasons, ray=skew)


def _wait_all(calls: list, coordinator, stop: DriverStop) -> set:
    """The actors' calls that ended; after a signal to the driver (passed on to the actors once, through
    the coordinator), those that ended within STOP_GRACE_S."""
    import ray

    told, pending = False, list(calls)
    while pending and not stop.expired():
        if stop.signum is not None and not told:
            ray.get(coordinator.stop.remote())
            told = True
        _, pending = ray.wait(pending, num_returns=len(pending), timeout=0.2)
    return set(calls) - set(pending)


def _skew_section(config: RunConfig, nodes: list[dict], start_wall_ns: int) -> tuple[dict, list[str]]:
    # a node's skew shifts all its sends alike: a reported percentile by up to the skew (selfcheck's floor)
    limit_ms = config.lag_floor_ns / 1e6
    worst = max(abs(x["offset_ms"]) + x["rtt_ms"] / 2 for x in nodes)
    reasons = ([f"clock skew between Ray nodes up to {worst:.3f} ms (offset + half the round trip) exceeds "
                f"the lag floor (--lag-floor) {limit_ms:g} ms: the workers' schedules may be that far apart"]
               if worst > limit_ms else [])
    return ({"address": config.ray, "start_unix_ns": start_wall_ns, "nodes": nodes, "max_skew_ms": worst,
             "skew_limit_ms": limit_ms}, reasons)
