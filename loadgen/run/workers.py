"""`loadgen run --workers N`: one seeded schedule driven by N generator processes on one host.

Contract:
- the driver (this process) builds the same schedule every worker builds (same config, same seed) and
  splits it by `assign`: whole units (a multi-turn session, or a single request) dealt round-robin in
  plan order, so every session stays in one worker and the N shares interleave; the union of the
  shares is the plan, so the arrival process at the server is the plan's (Poisson stays Poisson);
- every worker sets up (target tokenizer, bodies, transport; worker 0 alone calibrates the idle
  server), then says it is ready; once all are, the driver picks t0 = CLOCK_MONOTONIC now + START_LEAD_NS
  and sends it to all: CLOCK_MONOTONIC is one clock for every process of a host, so they share t0 exactly;
- worker w writes its part of the results folder: requests.<w>.parquet, tokens.<w>.parquet (rows with
  worker = w), <metric>.<w>.hlog, manifest.<w>.json (its own self-check), and its flushed parts under
  _parts/ while it runs; read_run() concatenates the parts, summary.histograms() merges the logs exactly;
- a worker that dies (non-zero exit, killed) is reported in manifest.json `workers` and the run's
  invalid reasons; its rows that no flushed part holds are written as `dropped` (error_kind
  worker_died), so every scheduled request still has exactly one row;
- the self-check (selfcheck.py) judges each worker over its share (in its manifest part) and the whole
  run over all rows (manifest.json `generator`); the run is invalid when any is.
`--workers auto` takes one worker per WORKER_CHUNKS_PER_S streamed chunks per second of the plan (offered
rate x mean max_tokens), at most one per CPU; one worker is the ordinary single-process run.
"""
from __future__ import annotations

import math
import multiprocessing as mp
import os
import secrets
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import numpy as np
import orjson
import polars as pl

from loadgen.run import selfcheck
from loadgen.config.client import ClientOptions, target_url_and_headers
from loadgen.config.workload import RunConfig, with_overrides
from loadgen.client.recorder import DROPPED
from loadgen.results.folder import PARTS, REQUEST_SCHEMA, TOKEN_SCHEMA, RunWriter, write_json, write_parquet
from loadgen.plan.schedule import Schedule, build

WORKER_CHUNKS_PER_S = 20_000   # what one core sustains with headroom (make bench: ~25-50 µs of CPU per chunk)
READY_TIMEOUT_S = 600.0        # set-up of a worker (tokenizer, bodies, calibration) must end by then
WORKER_DIED = "worker_died"


def count_for(config: RunConfig, schedule: Schedule) -> int:
    """The number of workers of the run: config.workers, or by rate when it is 0 (auto)."""
    if config.workers:
        return config.workers
    rate = schedule.offered_rate_per_s() or 0.0
    chunks_per_s = rate * float(np.mean(schedule.max_tokens)) if len(schedule) else 0.0
    return max(1, min(os.cpu_count() or 1, math.ceil(chunks_per_s / WORKER_CHUNKS_PER_S)))


def assign(schedule: Schedule, n: int) -> np.ndarray:
    """The worker of every row: units (a session's turns, or one request) round-robin in plan order."""
    idx = np.arange(len(schedule))
    unit = np.where(schedule.session >= 0, schedule.session, -(idx + 1))
    _, first, inverse = np.unique(unit, return_index=True, return_inverse=True)
    rank = np.empty(first.size, np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(first.size)
    return (rank[inverse] % n).astype(np.int32)


@dataclass
class Part:
    """What one worker process runs (execute._run's `part`): its rows, the shared run id, and the pipe on
    which it reports ready and receives t0."""
    worker: int
    indices: np.ndarray
    run_id: str
    conn: object = None

    def wait_for_t0(self) -> int:
        try:
            self.conn.send(("ready", self.worker))
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

    def next_turn(self, j: int, prev_row, prev_reads):
        return self.shaper.next_turn(self.rows[j].idx, prev_row, prev_reads)


class PartWriter(RunWriter):
    """A worker's share of the results folder (names carry the worker number)."""

    def __init__(self, path: str | Path, worker: int):
        super().__init__(path)
        self.worker = worker

    def prepare(self) -> None:
        (self.path / PARTS).mkdir(parents=True, exist_ok=True)

    def manifest(self, manifest: dict) -> None:
        write_json(self.path / f"manifest.{self.worker}.json", {**manifest, "worker": self.worker,
                                                                "pid": os.getpid()})

    def flush(self, rows, t0_ns: int, name: str = "") -> None:
        super().flush(rows, t0_ns, f"{self.worker}-")

    def finalize(self, rows, t0_ns: int, name: str = "") -> pl.DataFrame:
        return super().finalize(rows, t0_ns, f"{self.worker}-")


def _worker_main(config: RunConfig, part: Part, url: str, builtin_sim: bool, client: ClientOptions) -> None:
    import asyncio

    import uvloop

    from loadgen.client.backends import make_backend
    from loadgen.run.launch import _run, request_bodies

    schedule = build(config)
    backend = make_backend(config.backend, config.api, config.model, config.extra_body)
    writer = PartWriter(config.out, part.worker)
    headers = target_url_and_headers(config, client)[1]  # --header, API key, URL credentials
    bodies, shaper, info = request_bodies(config, schedule, backend, url, None, headers)
    outcome = asyncio.Runner(loop_factory=uvloop.new_event_loop).run(
        _run(config, schedule, backend, bodies, writer, url, builtin_sim, None, shaper, info, (client, headers),
             part=part))
    sys.exit(outcome.exit_code)


def run_workers(config: RunConfig, progress: TextIO | None = sys.stderr, client: ClientOptions | None = None):
    from loadgen.run.launch import RunOutcome, _say, default_out, run_workload
    from loadgen.sim.process import SimProcess

    schedule = build(config)
    n = count_for(config, schedule)
    config = with_overrides(config, "--workers", workers=n, out=str(config.out or default_out(config)))
    client = client or ClientOptions()
    if n == 1:
        return run_workload(config, progress, client)
    owner = assign(schedule, n)
    writer = RunWriter(config.out)
    writer.prepare()
    run_id = secrets.token_hex(4)
    sim, url = None, target_url_and_headers(config, client)[0]  # the URL without credentials
    if url is None:
        sim = SimProcess(args=[*config.sim_args, "--truth", str(writer.path / "sim_truth.parquet")])
        url = sim.start()
        _say(progress, f"started the built-in simulator at {url}")
    ctx = mp.get_context("spawn")
    procs, conns, t0 = [], [], None
    try:
        for w in range(n):
            parent, child = ctx.Pipe()
            part = Part(w, np.flatnonzero(owner == w), run_id, child)
            cfg = config if w == 0 else with_overrides(config, "--workers", calibrate=False)
            p = ctx.Process(target=_worker_main, args=(cfg, part, url, sim is not None, client),
                            name=f"loadgen-worker-{w}")
            p.start()
            procs.append(p)
            conns.append(parent)
        _say(progress, f"{n} workers started (pids {', '.join(str(p.pid) for p in procs)}); waiting for set-up")
        t0 = _start_together(procs, conns)
        if t0 is not None:
            _say(progress, f"t0 sent to {n} workers; {len(schedule)} requests")
        else:  # a worker died setting up: the others, waiting for t0, get end-of-file and exit
            _say(progress, "a worker died during set-up; stopping the others")
            for c in conns:
                c.close()
        for p in procs:
            p.join()
    except KeyboardInterrupt:
        for p in procs:
            p.join(timeout=30)
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
        if sim is not None:
            sim.stop()
    status, reasons = _finish(config, schedule, owner, procs, run_id, t0, writer.path)
    for reason in reasons:
        _say(progress, f"INVALID RUN: {reason}")
    _say(progress, f"[{status}] {n} workers, results in {writer.path}")
    return RunOutcome(writer.path, status, reasons)


def _start_together(procs, conns) -> int | None:
    """Wait until every worker is ready, then send them one t0; None if a worker died during set-up."""
    from loadgen.run.launch import START_LEAD_NS

    waiting = set(range(len(procs)))
    deadline = time.monotonic() + READY_TIMEOUT_S
    while waiting and time.monotonic() < deadline:
        for w in list(waiting):
            if conns[w].poll(0.05):
                conns[w].recv()
                waiting.discard(w)
            elif not procs[w].is_alive():
                return None
    if waiting:
        return None
    t0 = time.monotonic_ns() + START_LEAD_NS
    for c in conns:
        c.send(t0)
    return t0


def _finish(config: RunConfig, schedule: Schedule, owner: np.ndarray, procs, run_id: str, t0: int | None,
            path: Path, extra: dict | None = None) -> tuple[str, list[str]]:
    """Fill in the rows of workers that died, judge every worker and the whole run, write manifest.json.
    extra: manifest sections and invalid reasons of the launcher (ray_workers.py: the clock skew)."""
    extra = dict(extra or {})
    reasons: list[str] = list(extra.pop("reasons", []))
    workers = []
    for w, p in enumerate(procs):
        part_manifest = _read_json(path / f"manifest.{w}.json")
        finished = (path / f"requests.{w}.parquet").is_file()
        entry = {"worker": w, "pid": p.pid, "exit_code": p.exitcode, "requests": int((owner == w).sum()),
                 "status": part_manifest.get("status") if finished else "died",
                 "invalid_reasons": part_manifest.get("invalid_reasons", []),
                 "generator": part_manifest.get("generator")}
        if not finished:
            dropped = _salvage(path, w, np.flatnonzero(owner == w), run_id, schedule, p.exitcode)
            entry["dropped"] = dropped
            reasons.append(f"worker {w} (pid {p.pid}) died (exit code {p.exitcode}); its {dropped} requests "
                           f"not finished are recorded as dropped")
        reasons += [f"worker {w}: {r}" for r in entry["invalid_reasons"]]
        workers.append(entry)
    requests = _read_parts(path, "requests", REQUEST_SCHEMA)
    sent = requests.filter(pl.col("dispatched_ns").is_not_null()).sort("intended_ns")
    whole, generator = selfcheck.check(sent["intended_ns"].to_numpy(), sent["dispatched_ns"].to_numpy(),
                                       sent["slot_wait_ns"].fill_null(0).to_numpy(), selfcheck.limits_of(config),
                                       measured=(~sent["warmup"]).to_numpy())
    reasons += [f"whole run: {r}" for r in whole]
    gens = [e["generator"] for e in workers if e["generator"]]
    # the client's lateness is that of its latest worker (the stall floor, StallRule.for_run, reads it)
    late = [g["loop_lateness_ms"] for g in gens if (g.get("loop_lateness_ms") or {}).get("p99") is not None]
    if late:
        generator["loop_lateness_ms"] = max(late, key=lambda x: x["p99"])
    cpu_s, chunks = sum(g.get("cpu_s") or 0.0 for g in gens), sum(g.get("chunks") or 0 for g in gens)
    generator.update(workers=len(procs), cpu_s=cpu_s, chunks=chunks,
                     cpu_us_per_chunk=cpu_s * 1e6 / chunks if chunks else None)
    first = _read_json(path / "manifest.0.json")
    statuses = {e["status"] for e in workers}
    status = "interrupted" if "interrupted" in statuses and t0 is not None else "invalid" if reasons else "complete"
    manifest = {k: first[k] for k in ("schema_version", "tool", "version", "config", "seed", "target", "host",
                                      "workload", "calibration") if k in first}
    manifest.update(run_id=run_id, status=status, invalid_reasons=reasons if status != "interrupted" else [],
                    t0=first.get("t0", {"monotonic_ns": t0}), workers=workers, generator=generator,
                    schedule={"requests": len(schedule), "process": config.arrivals.process,
                              "configured_rate_per_s": config.arrivals.rate_per_s,
                              "offered_rate_per_s": schedule.offered_rate_per_s(),
                              "warmup_requests": int(schedule.warmup.sum())},
                    finished={"monotonic_ns": time.monotonic_ns(), "unix_ns": time.time_ns()})
    manifest.update(extra)
    if "schema_version" not in manifest:
        from loadgen.results.folder import SCHEMA_VERSION
        manifest.update(schema_version=SCHEMA_VERSION, config=config.to_manifest())
    write_json(path / "manifest.json", manifest)
    return status, manifest["invalid_reasons"]


def _salvage(path: Path, w: int, mine: np.ndarray, run_id: str, schedule: Schedule, exit_code) -> int:
    """requests.<w>.parquet / tokens.<w>.parquet of a worker that died: its flushed parts, plus a dropped
    row for every one of its requests that no part holds. Returns the number of dropped rows."""
    parts = sorted((path / PARTS).glob(f"requests-{w}-*.parquet"))
    done = pl.concat([pl.read_parquet(f) for f in parts]) if parts else pl.DataFrame(schema=REQUEST_SCHEMA)
    missing = np.setdiff1d(mine, done["idx"].to_numpy())
    n = missing.size
    dropped = {k: pl.Series(k, [None] * n, dtype=t) for k, t in REQUEST_SCHEMA.items()}
    dropped.update(
        request_id=pl.Series([f"{run_id}-{i:06d}" for i in missing], dtype=pl.String),
        idx=pl.Series(missing, dtype=pl.Int64), worker=pl.Series([w] * n, dtype=pl.Int32),
        warmup=pl.Series(schedule.warmup[missing], dtype=pl.Boolean),
        intended_ns=pl.Series(schedule.intended_ns[missing], dtype=pl.Int64),
        planned_prompt_tokens=pl.Series(schedule.prompt_tokens[missing], dtype=pl.Int64),
        max_tokens=pl.Series(schedule.max_tokens[missing], dtype=pl.Int64),
        n_chunks=pl.Series([0] * n, dtype=pl.Int64), outcome=pl.Series([DROPPED] * n, dtype=pl.String),
        error_kind=pl.Series([WORKER_DIED] * n, dtype=pl.String),
        error_detail=pl.Series([f"worker {w} exited with {exit_code} before this request finished"] * n,
                               dtype=pl.String))
    rows = pl.concat([done, pl.DataFrame(dropped, schema=REQUEST_SCHEMA)]).sort("idx")
    write_parquet(path / f"requests.{w}.parquet", rows)
    write_parquet(path / f"tokens.{w}.parquet", _read_parts(path, "tokens", TOKEN_SCHEMA, only=f"{w}-"))
    for f in (path / PARTS).glob(f"*-{w}-*.parquet"):
        f.unlink()
    return int(n)


def _read_parts(path: Path, kind: str, schema: dict, only: str = "") -> pl.DataFrame:
    files = sorted((path / PARTS).glob(f"{kind}-{only}*.parquet"))
    if not only:
        files = sorted(path.glob(f"{kind}.*.parquet")) + files
    return pl.concat([pl.read_parquet(f) for f in files]) if files else pl.DataFrame(schema=schema)


def _read_json(p: Path) -> dict:
    try:
        return orjson.loads(p.read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return {}
