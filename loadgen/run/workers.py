"""`loadgen run --workers N`: one seeded schedule driven by N generator processes on one host.

Contract:
- the launcher (launch.py) sets the target up once (simulator, model, server kind); every worker builds
  the same schedule (same config, same seed) and the bodies of the whole plan, and runs its share, split
  by `assign`: whole units (a multi-turn session, or a single request) dealt round-robin in plan order,
  so every session stays in one worker and the N shares interleave; the union of the shares is the
  plan, so the arrival process at the server is the plan's (Poisson stays Poisson);
- a limit of the whole run is split, not repeated: a closed loop's `--concurrency` users and a
  `--max-concurrency` cap are dealt over the workers (worker_config; units are dealt in the same
  proportion), and there are never more workers than users or slots; worker 0 alone calibrates the
  idle server and samples /metrics;
- every worker sets up, then says it is ready (with its `workload` section: the driver's manifest takes
  worker 0's); once all are, the driver picks t0 = CLOCK_MONOTONIC now + START_LEAD_NS and sends it to
  all: CLOCK_MONOTONIC is one clock for every process of a host, so they share t0 exactly; the driver
  then writes manifest.json (status `running`, `workers` with their pids);
- worker w keeps its share under _parts/ (PartWriter: its flushed parts, its interval logs, and at the
  end its process record manifest-<w>.json with its own check of its share); at the end the driver
  merges the shares into the files a single process writes (results/merge.py) and ends the run the
  common way (ending.finish): the run is judged once, over all rows, by the single process's rules;
- a worker that dies (no record: non-zero exit, killed) is reported in manifest.json `workers` and the
  run's invalid reasons; its rows that no flushed part holds are written as `dropped` (error_kind
  worker_died), so every scheduled request still has exactly one row.
`--workers auto` takes one worker per WORKER_CHUNKS_PER_S streamed chunks per second of the plan (offered
rate x mean max_tokens), at most one per CPU; one worker is the ordinary single-process run.
"""
from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import math
import multiprocessing as mp
import multiprocessing.connection as mp_connection
import os
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import numpy as np
import polars as pl

from loadgen.client.recorder import DROPPED
from loadgen.config.credentials import ScrubbedStream, remember_sent
from loadgen.config.workload import RunConfig, with_overrides
from loadgen.plan.schedule import Schedule, build
from loadgen.results.folder import no_pause, requests_frame, PARTS, REQUEST_SCHEMA, RunWriter, write_json
from loadgen.results.merge import merge_shares, share_record, share_requests
from loadgen.run.ending import RunFacts, combine_generators, finish, judge, run_manifest
from loadgen.run.inprocess import START_LEAD_NS, Job, t0_section
from loadgen.run.loop import run_job
from loadgen.errors import ExitCode, StorageError
from loadgen.run.outcome import RunOutcome, exit_code_of, say
from loadgen.run.prepare import Target, request_bodies, say_workload

WORKER_CHUNKS_PER_S = 20_000   # what one core sustains with headroom (make bench: ~25-50 µs of CPU per chunk)
READY_TIMEOUT_S = 600.0        # set-up of a worker (tokenizer, bodies, calibration) must end by then
WORKER_DIED = "worker_died"
STOP_GRACE_S = 30.0            # after SIGINT/SIGTERM, how long the workers have to end their shares
PR_SET_PDEATHSIG = 1


def count_for(config: RunConfig, schedule: Schedule) -> int:
    """The number of workers of the run: config.workers, or by rate when it is 0 (auto); never more than
    the closed loop's users or the --max-concurrency slots (each worker needs one)."""
    n = config.workers
    if not n:
        rate = schedule.offered_rate_per_s()
        rate = rate if math.isfinite(rate) else 0.0  # a closed loop's plan has no rate (all due at t0): 1
        chunks_per_s = rate * float(np.mean(schedule.max_tokens)) if len(schedule) else 0.0
        n = max(1, min(os.cpu_count() or 1, math.ceil(chunks_per_s / WORKER_CHUNKS_PER_S)))
    return min([n, *(x for x in (config.concurrency, config.max_concurrency) if x)])


def split(total: int, n: int) -> list[int]:
    """total dealt over n workers as evenly as can be, the first ones getting one more."""
    return [total // n + (w < total % n) for w in range(n)]


def weights_of(config: RunConfig, n: int) -> list[int]:
    """Each worker's weight in the deal of units: its users (closed loop), or its slots, or 1."""
    limit = config.concurrency or config.max_concurrency
    return split(limit, n) if limit else [1] * n


def worker_config(config: RunConfig, n: int, w: int) -> RunConfig:
    """Worker w's config: its part of the run's users and slots; calibration and the scrapes (the server's
    /metrics, --scrape's endpoints) on worker 0."""
    changes: dict = {} if w == 0 else {"calibrate": False, "scrape_metrics": False, "scrape": ()}
    if config.concurrency:
        changes["concurrency"] = split(config.concurrency, n)[w]
        changes["pool_users"] = config.concurrency  # the same plan (a duration loop's pool) in every worker
    if config.max_concurrency:
        changes["max_concurrency"] = split(config.max_concurrency, n)[w]
    return with_overrides(config, "--workers", **changes)


def assign(schedule: Schedule, n: int, weights: list[int] | None = None) -> np.ndarray:
    """The worker of every row: units (a session's turns, or one request) dealt in plan order, worker w
    taking weights[w] units of every sum(weights) (interleaved); equal weights: plain round-robin."""
    weights = weights or [1] * n
    cycle = np.array([w for r in range(max(weights)) for w in range(n) if weights[w] > r], np.int32)
    idx = np.arange(len(schedule))
    unit = np.where(schedule.session >= 0, schedule.session, -(idx + 1))
    _, first, inverse = np.unique(unit, return_index=True, return_inverse=True)
    rank = np.empty(first.size, np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(first.size)
    return cycle[rank[inverse] % cycle.size]


@dataclass
class Part:
    """What one worker process runs (inprocess.Job.part): its rows, the shared run id, and the pipe on
    which it reports ready (with its `workload` section, `info`) and receives t0."""
    worker: int
    indices: np.ndarray
    run_id: str
    conn: Any = None        # a multiprocessing Connection (here) or the Ray coordinator's handle (ray_workers)
    info: dict | None = None

    def wait_for_t0(self) -> int:
        try:
            self.conn.send(("ready", self.worker, self.info))
            return int(self.conn.recv())
        except (EOFError, OSError):  # the driver gave up (another worker died setting up): nothing to clean
            print(f"worker {self.worker}: the run was called off before t0", file=sys.stderr, flush=True)
            os._exit(1)

    def select(self, rows, bodies, shaper):
        mine = [rows[i] for i in self.indices]
        for r in mine:
            r.worker = self.worker
        return mine, [bodies[i] for i in self.indices], (_Shaper(shaper, mine) if shaper is not None else None)


class _Shaper:
    # Runner passes positions in its (partial) row list; Bodies.next_turn wants the plan's indices.
    def __init__(self, shaper, rows):
        self.shaper, self.rows = shaper, rows
        self.blocking = shaper.blocking

    def next_turn(self, j: int, prev_row, prev_reads):
        return self.shaper.next_turn(self.rows[j].idx, prev_row, prev_reads)

    @property
    def turns_impossible(self) -> int:
        return self.shaper.turns_impossible


class PartWriter(RunWriter):
    """A worker's share of the results folder, all under _parts/ (names carry the worker number); the
    driver merges the shares at the end (results/merge.py)."""

    def __init__(self, path: str | Path, worker: int):
        super().__init__(path)
        self.worker = worker

    @property
    def hlog_dir(self) -> Path:
        return self.path / PARTS

    def prepare(self, overwrite: bool = False) -> None:
        # the run's folder is the driver's (it handled --overwrite): a share only adds _parts/
        (self.path / PARTS).mkdir(parents=True, exist_ok=True)

    def record(self, record: dict) -> None:
        """The worker's process record, written last: a worker without one died."""
        write_json(self.path / PARTS / f"manifest-{self.worker}.json", record)

    def fail(self, error: StorageError) -> None:
        # a share keeps its error only: the reserve under _parts/ is the driver's, for the run's manifest
        if self.failure is None:
            self.failure = error

    def flush(self, rows, t0_ns: int, name: str = "", pause=no_pause) -> None:
        super().flush(rows, t0_ns, f"{self.worker}-", pause)

    def finalize(self, rows, t0_ns: int) -> pl.DataFrame:
        """The rows not flushed yet as one last part; returns the share's rows (idx order), saved or not
        (after a failed write, `failure`, nothing more is written)."""
        rows = list(rows)
        if self.failure is None:
            try:
                self.flush(rows, t0_ns)
                rows = []
            except StorageError:
                pass
        parts = sorted((self.path / PARTS).glob(f"requests-{self.worker}-*.parquet"))
        return pl.concat([*(pl.read_parquet(f) for f in parts), requests_frame(rows, t0_ns)]).sort("idx")


def run_share(target: Target, part, writer: PartWriter) -> dict:
    """A worker's (or Ray actor's) whole life: bodies, its share's run, its own check; writes and returns
    its process record."""
    config = target.config
    remember_sent(target.headers)  # this process's sends: what the server echoes of them is scrubbed
    schedule = build(config)
    backend = target.backend()
    bodies, shaper, part.info = request_bodies(config, schedule, backend, target.url, None, target.headers,
                                                 target.client.ssl_context())
    job = Job(target, schedule, backend, bodies, shaper, writer, part.run_id, None, part=part)
    measured = run_job(job)
    own = judge(config, measured.requests, measured.status, None,  # its share alone: detail, not the verdict
                host=measured.generator.get("host"))
    record = {**measured.record(), "worker": part.worker, "pid": os.getpid(), "hostname": socket.gethostname(),
              "status": own.status, "invalid_reasons": own.reasons,
              "generator": combine_generators(own, [measured.record()]), "requests": measured.requests.height}
    writer.record(record)
    return record


def _tie_to_driver() -> None:
    """A worker lives no longer than its driver, kill -9 of the driver included: the kernel sends it SIGTERM
    when the driver dies (Linux prctl PR_SET_PDEATHSIG), and, as a fallback where that is missing, a
    thread watching multiprocessing's parent sentinel (a pipe the driver holds open) sends it the same.
    SIGTERM then ends the worker's share as it does a single process (its rows and record under _parts/)
    or, before t0, ends the worker at once (nothing was sent)."""
    driver = mp.parent_process()
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):
        pass  # not Linux: the sentinel below alone
    if driver is None or not driver.is_alive():  # the driver died before prctl took effect
        os._exit(1)

    def watch() -> None:
        mp_connection.wait([driver.sentinel])
        os.kill(os.getpid(), signal.SIGTERM)
    threading.Thread(target=watch, name="driver-watch", daemon=True).start()


def _worker_main(target: Target, part: Part) -> None:
    assert target.config.out is not None  # the launcher names the folder before any worker starts
    _tie_to_driver()
    sys.stderr = ScrubbedStream(sys.stderr)  # its lines may quote the server
    writer = PartWriter(target.config.out, part.worker)
    try:
        record = run_share(target, part, writer)
    except StorageError as e:  # its record did not fit: the driver counts it as died, its parts stay
        print(f"loadgen worker {part.worker}: error: {e}", file=sys.stderr, flush=True)
        sys.exit(ExitCode.STORAGE)
    sys.exit(exit_code_of(record["status"]))


def run_workers(target: Target, schedule: Schedule, n: int, writer: RunWriter, run_id: str,
                progress: TextIO | None) -> RunOutcome:
    config = target.config
    owner = assign(schedule, n, weights_of(config, n))
    ctx = mp.get_context("spawn")
    procs: list[Any] = []
    conns, facts, t0 = [], RunFacts(target, schedule, run_id), None
    stop = DriverStop(procs)
    try:
        with stop.installed():
            for w in range(n):
                parent, child = ctx.Pipe()
                share = dataclasses.replace(target, config=worker_config(config, n, w))
                p = ctx.Process(target=_worker_main, args=(share, Part(w, np.flatnonzero(owner == w), run_id, child)),
                                name=f"loadgen-worker-{w}")
                with stop.sigint_ignored():
                    p.start()
                procs.append(p)
                conns.append(parent)
            say(progress, f"{n} workers started (pids {', '.join(str(p.pid) for p in procs)}); waiting for set-up")
            ready = _start_together(procs, conns, stop)
            if ready is not None:
                t0_ns, facts.workload = ready
                t0 = t0_section(t0_ns, time.time_ns() + t0_ns - time.monotonic_ns())
                say_workload(progress, facts.workload)
                writer.manifest(run_manifest(facts, t0, workers=[{"worker": w, "pid": p.pid}
                                                                  for w, p in enumerate(procs)]))
                pool = schedule.info.get("pool")
                say(progress, f"t0 sent to {n} workers; " + (f"{len(schedule)} requests" if pool is None else
                              f"a closed loop of {config.concurrency} users with a pool of {pool['requests']} "
                              f"requests until {(config.duration_ns or 0) / 1e9:g}s after t0"))
            elif stop.signum is None:  # a worker died setting up: the others, waiting for t0, get end-of-file
                say(progress, "a worker died during set-up; stopping the others")
                for c in conns:
                    c.close()
            _join(procs, stop)
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
    if t0 is None and stop.signum is not None:
        raise KeyboardInterrupt  # stopped during set-up: nothing was sent, the folder is left as it was
    return end_shares(facts, writer, t0, owner, [(p.pid, p.exitcode) for p in procs], progress,
                      f"{n} workers, results in {writer.path}")


class DriverStop:
    """SIGINT or SIGTERM to the driver's PID (not only Ctrl-C to the process group): forwarded to every
    worker as SIGTERM, on which each ends its share as a single process does (in-flight rows
    `interrupted`, the rest `cancelled`, its record written); the run then ends as usual, interrupted."""

    def __init__(self, procs: list):
        self.procs = procs
        self.signum: int | None = None
        self.at = 0.0

    def __call__(self, signum: int, frame) -> None:
        if self.signum is None:
            self.signum, self.at = signum, time.monotonic()
        for p in self.procs:
            try:
                os.kill(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass

    @contextlib.contextmanager
    def installed(self):
        """The handlers while the workers live (main thread only: Python's rule for signal handlers)."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        before = {sig: signal.signal(sig, self) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in before.items():
                signal.signal(sig, handler)

    @contextlib.contextmanager
    def sigint_ignored(self):
        """SIGINT ignored while a worker is started: it starts with SIGINT ignored (kept across exec, and
        Python then installs no KeyboardInterrupt), so a Ctrl-C to the process group during its set-up is
        not a traceback; the driver's SIGTERM stops it, and from t0 on its run handles both signals."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        before = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            yield
        finally:
            signal.signal(signal.SIGINT, before)

    def expired(self) -> bool:
        return self.signum is not None and time.monotonic() - self.at > STOP_GRACE_S


def _join(procs, stop: DriverStop) -> None:
    """Wait for every worker to end; after a signal, for STOP_GRACE_S at most (the caller kills the rest)."""
    while any(p.is_alive() for p in procs) and not stop.expired():
        for p in procs:
            p.join(0.1)


def _start_together(procs, conns, stop: DriverStop) -> tuple[int, dict] | None:
    """Wait until every worker is ready, then send them one t0; (t0, worker 0's workload section), or
    None if a worker died during set-up or the driver was signalled."""
    waiting, infos = set(range(len(procs))), {}
    deadline = time.monotonic() + READY_TIMEOUT_S
    while waiting and time.monotonic() < deadline and stop.signum is None:
        for w in list(waiting):
            if conns[w].poll(0.05):
                try:
                    _, _, infos[w] = conns[w].recv()
                except (EOFError, OSError):  # readable because the worker died (end of file)
                    return None
                waiting.discard(w)
            elif not procs[w].is_alive():
                return None
    if waiting or stop.signum is not None:
        return None
    t0 = time.monotonic_ns() + START_LEAD_NS
    for c in conns:
        c.send(t0)
    return t0, infos[0] or {}


def end_shares(facts: RunFacts, writer: RunWriter, t0: dict | None, owner: np.ndarray,
               ended: list[tuple[int | None, int | None]], progress: TextIO | None, final_line: str,
               launcher_reasons: list[str] | tuple[str, ...] = (), ray: dict | None = None) -> RunOutcome:
    """The end of a run split over processes (--workers, --ray): each worker's entry from its record (or
    `died`, its missing rows dropped), the shares merged into the run's files, the common ending.
    ended: (pid, exit code) of every worker; t0: the run's t0 section, None when it never started."""
    path, reasons = writer.path, list(launcher_reasons)
    t0 = t0 or {"monotonic_ns": None, "unix_ns": None, "iso": None}
    requests = share_requests(path)
    entries, records, fills = [], [], []
    for w, (pid, code) in enumerate(ended):
        mine = np.flatnonzero(owner == w)
        entry: dict[str, Any] = {"worker": w, "pid": pid, "exit_code": code, "requests": int(mine.size)}
        record = share_record(path, w)
        if record is None:
            missing = np.setdiff1d(mine, requests["idx"].to_numpy())
            fills.append(_dropped(facts, w, missing, code))
            entry.update(status="died", invalid_reasons=[], generator=None, dropped=int(missing.size))
            reasons.append(f"worker {w} (pid {pid}) died (exit code {code}); its {missing.size} requests "
                           f"not finished are recorded as dropped")
        else:
            records.append(record)
            entry["requests"] = record.get("requests", entry["requests"])  # its rows (a pool's: those it scheduled)
            entry.update(status=record["status"], invalid_reasons=record["invalid_reasons"],
                         generator=record["generator"], t0=record["t0"])
        entries.append(entry)
    requests = pl.concat([requests, *fills]).sort("idx")
    failed = next((r["write_error"] for r in records if r.get("write_error")), None)
    if failed is not None:
        writer.fail(StorageError.from_record(failed))  # a worker could not save its share: the shares stay as they are
    else:
        try:
            merge_shares(path, requests, (t0["unix_ns"] or time.time_ns()) / 1e9)
        except StorageError as e:  # the shares under _parts/ stay the run's record
            writer.fail(e)
    return finish(facts, writer, t0, requests, records, progress=progress, final_line=final_line,
                  launcher_reasons=reasons, workers=entries, ray=ray)


def _dropped(facts: RunFacts, w: int, missing: np.ndarray, exit_code) -> pl.DataFrame:
    """A `dropped` row (worker_died) for every request of worker w that no flushed part holds."""
    n, schedule = missing.size, facts.schedule
    rows = {k: pl.Series(k, [None] * n, dtype=t) for k, t in REQUEST_SCHEMA.items()}
    rows.update(
        request_id=pl.Series([f"{facts.run_id}-{i:06d}" for i in missing], dtype=pl.String),
        idx=pl.Series(missing, dtype=pl.Int64), worker=pl.Series([w] * n, dtype=pl.Int32),
        warmup=pl.Series(schedule.warmup[missing], dtype=pl.Boolean),
        intended_ns=pl.Series(schedule.intended_ns[missing], dtype=pl.Int64),
        planned_prompt_tokens=pl.Series(schedule.prompt_tokens[missing], dtype=pl.Int64),
        max_tokens=pl.Series(schedule.max_tokens[missing], dtype=pl.Int64),
        n_chunks=pl.Series([0] * n, dtype=pl.Int64), outcome=pl.Series([DROPPED] * n, dtype=pl.String),
        error_kind=pl.Series([WORKER_DIED] * n, dtype=pl.String),
        error_detail=pl.Series([f"worker {w} exited with {exit_code} before this request finished"] * n,
                               dtype=pl.String))
    return pl.DataFrame(rows, schema=REQUEST_SCHEMA)
