"""`loadgen run` as a library call: plan, (start the simulator), dispatch, record, write the folder.

run_workload(config) -> RunOutcome. It never prints data; progress goes to the `progress` stream
(stderr from the CLI). The generator checks itself: when its own lateness (send lag minus any wait for
a concurrency slot) has p99 above `max_send_lag_p99_ns`, the run is marked invalid — the numbers would
describe the client, not the server.
"""
from __future__ import annotations

import asyncio
import os
import platform
import secrets
import signal
import socket
import sys
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TextIO

import numpy as np
import uvloop

from loadgen import __version__
from loadgen.backends import make_backend
from loadgen.clock import Clock
from loadgen.config import RunConfig, redact_url
from loadgen.bodies import Bodies
from loadgen.datasets import load_sharegpt
from loadgen.prompts import PromptMaker, synthetic_text
from loadgen.prompts import resolve as resolve_tokenizer
from loadgen.recorder import Recorder, Row
from loadgen.calibrate import fit, probe_record, probe_rows
from loadgen.results import SCHEMA_VERSION, RunWriter, write_json, write_parquet
from loadgen.scrape import Scraper
from loadgen.runner import Runner
from loadgen.schedule import Schedule, build
from loadgen.sim.process import SimProcess
from loadgen.transport import AiohttpTransport

EXIT_OK, EXIT_USAGE, EXIT_INVALID, EXIT_INTERRUPTED = 0, 2, 3, 130
START_LEAD_NS = 100_000_000     # t0 is this far after set-up, so request 0 is not late by construction
FLUSH_EVERY_S = 2.0
MAX_SEND_LAG_P99_NS = 5_000_000


@dataclass
class RunOutcome:
    path: Path
    status: str                      # complete | interrupted | invalid
    invalid_reasons: list[str] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        return {"complete": EXIT_OK, "invalid": EXIT_INVALID}.get(self.status, EXIT_INTERRUPTED)


def default_out(config: RunConfig) -> Path:
    return Path("results") / f"{config.name}-{datetime.now().strftime('%Y%m%d-%H%M%S')}"


def request_bodies(config: RunConfig, schedule: Schedule, backend,
                   url: str | None = None) -> tuple[list[bytes], Bodies, dict]:
    """Every body (later session turns are built at run time by Bodies.next_turn), and the manifest's
    `workload` section: tokenizer used (and any fallback warning), prompt length checks, trace counts."""
    tokenizer, warning = resolve_tokenizer(config.tokenizer, url, config.tokenizer_file)
    maker = PromptMaker(tokenizer)
    convs = load_sharegpt(config.dataset) if config.dataset else None
    bodies = Bodies(schedule, backend, maker, config.seed, convs)
    built = bodies.build_all()
    info = {**schedule.info, "tokenizer": {**tokenizer.describe(), "requested": config.tokenizer,
                                           "warning": warning}, "prompt_checks": maker.summary()}
    return built, bodies, info


def run_workload(config: RunConfig, progress: TextIO | None = sys.stderr) -> RunOutcome:
    schedule = build(config)
    backend = make_backend(config.backend, config.api, config.model, config.extra_body)
    writer = RunWriter(config.out or default_out(config))
    writer.prepare()
    sim = None
    url = config.url
    if url is None:
        sim = SimProcess(args=[*config.sim_args, "--truth", str(writer.path / "sim_truth.parquet")])
        url = sim.start()
        _say(progress, f"started the built-in simulator at {url}")
    try:
        # Bodies after the target is up: the default tokenizer is the target's own /tokenize.
        bodies, shaper, workload_info = request_bodies(config, schedule, backend, url)
        if workload_info["tokenizer"]["warning"]:
            _say(progress, "WARNING: " + workload_info["tokenizer"]["warning"])
        return asyncio.Runner(loop_factory=uvloop.new_event_loop).run(
            _run(config, schedule, backend, bodies, writer, url, sim is not None, progress,
                 shaper, workload_info))
    finally:
        if sim is not None:
            sim.stop()


async def _run(config: RunConfig, schedule: Schedule, backend, bodies, writer: RunWriter, url: str,
               builtin_sim: bool, progress: TextIO | None, shaper: Bodies | None = None,
               workload_info: dict | None = None) -> RunOutcome:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    clock = Clock()
    run_id = secrets.token_hex(4)
    headers = {"Authorization": f"Bearer {config.api_key()}"} if config.api_key() else {}
    # --- explain (issue 6): probe the idle server before t0 ---
    calibration = None
    if config.calibrate:
        calibration = await _calibrate(config, schedule, backend, url, headers, clock, writer, progress, stop)
    else:
        _say(progress, "calibration off (--no-calibrate): unless the server reports per-request timings, the "
                       "report cannot split TTFT into queueing and prefill")
    # --- end explain ---
    mono_now, wall_now = time.monotonic_ns(), time.time_ns()
    t0 = mono_now + START_LEAD_NS
    rows = [Row(i, f"{run_id}-{i:06d}", t0 + int(off), int(p), int(m), bool(w))
            for i, (off, p, m, w) in enumerate(zip(schedule.intended_ns, schedule.prompt_tokens,
                                                   schedule.max_tokens, schedule.warmup))]
    shape_rows(rows, schedule)
    manifest = {
        "schema_version": SCHEMA_VERSION, "tool": "loadgen", "version": __version__, "run_id": run_id,
        "status": "running", "invalid_reasons": [],
        "config": config.to_manifest(), "seed": config.seed,
        "target": {"url": redact_url(url), "backend": config.backend, "api": config.api,
                   "builtin_sim": builtin_sim},
        "t0": {"monotonic_ns": t0, "unix_ns": wall_now + START_LEAD_NS,
               "iso": datetime.fromtimestamp((wall_now + START_LEAD_NS) / 1e9, UTC).isoformat()},
        "host": {"hostname": socket.gethostname(), "platform": platform.platform(),
                 "python": platform.python_version(), "cpus": os.cpu_count()},
        "schedule": {"requests": len(schedule), "process": config.arrivals.process,
                     "configured_rate_per_s": config.arrivals.rate_per_s,
                     "offered_rate_per_s": schedule.offered_rate_per_s(),
                     "warmup_requests": int(schedule.warmup.sum())},
        "workload": workload_info or {},
    }
    writer.manifest(manifest)
    recorder = Recorder(rows)
    scraper = Scraper(url, t0, config.scrape_interval_ns, headers) if config.scrape_metrics else None
    scrape_task = asyncio.create_task(scraper.run()) if scraper else None
    async with AiohttpTransport(url, headers) as transport:
        runner = Runner(rows, bodies, backend, transport, clock, recorder,
                        max_concurrency=config.max_concurrency,
                        request_timeout_ns=config.request_timeout_ns,
                        drain_timeout_ns=config.drain_timeout_ns,
                        next_body=shaper.next_turn if shaper is not None else None)
        flusher = asyncio.create_task(_flush_loop(writer, recorder, t0))
        ticker = asyncio.create_task(_progress_loop(progress, runner, recorder, t0, len(rows)))
        try:
            status = await runner.run(stop)
        finally:
            flusher.cancel()
            ticker.cancel()
            await asyncio.gather(flusher, ticker, return_exceptions=True)
            if scrape_task is not None:
                scrape_task.cancel()
                await asyncio.gather(scrape_task, return_exceptions=True)
                await scraper.final_sample()
    if scraper is not None:
        write_parquet(writer.path / "server_metrics.parquet", scraper.frame())
        manifest["scrape"] = scraper.summary()
        if scraper.errors:
            _say(progress, f"warning: {scraper.errors} of {scraper.errors + scraper.scrapes} /metrics scrapes "
                           f"failed; last: {scraper.last_error}")
    manifest["calibration"] = ("calibration.json" if calibration else
                               "off (--no-calibrate): without server timings, queue and prefill cannot be "
                               "separated" if not config.calibrate else "failed")
    reasons = check_generator(rows) if status == "complete" else []
    if reasons:
        status = "invalid"
    writer.finalize(rows, t0)
    manifest.update(status=status, invalid_reasons=reasons,
                    finished={"monotonic_ns": time.monotonic_ns(), "unix_ns": time.time_ns()})
    writer.manifest(manifest)
    _say(progress, _progress_line(runner, recorder, t0, len(rows)) + f"  [{status}]")
    for reason in reasons:
        _say(progress, f"INVALID RUN: {reason}")
    return RunOutcome(writer.path, status, reasons)


async def _calibrate(config: RunConfig, schedule: Schedule, backend, url: str, headers: dict, clock: Clock,
                     writer: RunWriter, progress: TextIO | None, stop: asyncio.Event) -> dict | None:
    """Sequential probes of the idle server (calibrate.py); writes calibration.json. None if it failed."""
    rows = probe_rows(schedule.prompt_tokens, clock.now_ns())
    rng = np.random.default_rng([config.seed, 0xCA11B])  # probes never share text with the run
    bodies = [backend.body(synthetic_text(r.planned_prompt_tokens, rng), r.max_tokens) for r in rows]
    _say(progress, f"calibrating: {len(rows)} sequential probes of the idle server "
                   f"(prompt lengths {sorted({r.planned_prompt_tokens for r in rows})})")
    async with AiohttpTransport(url, headers) as transport:
        runner = Runner(rows, bodies, backend, transport, clock, Recorder(rows), max_concurrency=1,
                        request_timeout_ns=config.request_timeout_ns,
                        drain_timeout_ns=config.request_timeout_ns * len(rows))
        if await runner.run(stop) == "interrupted":
            return None  # SIGINT/SIGTERM: the measured run will see `stop` and end at once
    try:
        calibration = fit([probe_record(r) for r in rows[1:]])
    except ValueError as e:
        _say(progress, f"warning: calibration failed ({e}); queue and prefill will not be separated")
        return None
    write_json(writer.path / "calibration.json", calibration)
    return calibration


def shape_rows(rows: list[Row], schedule: Schedule) -> None:
    """Copy the plan's workload shape onto the rows (-1 in the plan = not applicable = null)."""
    for r, g, s, t, a, k in zip(rows, schedule.prefix_group.tolist(), schedule.session.tolist(),
                                schedule.turn.tolist(), schedule.after.tolist(), schedule.think_ns.tolist()):
        r.prefix_group, r.session, r.turn = (None if g < 0 else g), (None if s < 0 else s), (None if t < 0 else t)
        if a >= 0:
            r.after, r.think_ns, r.intended_ns = a, k, None  # timed by the previous turn, at run time


def check_generator(rows: list[Row]) -> list[str]:
    lag = np.array([r.dispatched_ns - r.intended_ns - (r.slot_wait_ns or 0)
                    for r in rows if r.dispatched_ns is not None and not r.warmup], dtype=np.int64)
    if len(lag) == 0:
        return []
    p99 = float(np.percentile(lag, 99))
    if p99 > MAX_SEND_LAG_P99_NS:
        return [f"send_lag p99 is {p99 / 1e6:.2f} ms (> {MAX_SEND_LAG_P99_NS / 1e6:g} ms): the generator "
                f"could not keep the schedule, so latencies describe the client, not the server; lower the "
                f"rate or split the schedule over more workers"]
    return []


async def _flush_loop(writer: RunWriter, recorder: Recorder, t0: int) -> None:
    while True:
        await asyncio.sleep(FLUSH_EVERY_S)
        rows = recorder.take_finished()
        if rows:
            await asyncio.to_thread(writer.flush, rows, t0)


def _progress_line(runner: Runner, recorder: Recorder, t0: int, total: int) -> str:
    elapsed_s = max(1e-9, (time.monotonic_ns() - t0) / 1e9)
    ttfts = recorder.ttft_window_ns
    p50 = f"{np.median(ttfts) / 1e6:.1f}ms" if ttfts else "-"
    return (f"[{elapsed_s:7.1f}s] sent {runner.dispatched}/{total}  done {recorder.done}  "
            f"failed {recorder.failed}  in-flight {len(runner.in_flight)}  "
            f"rate {runner.dispatched / elapsed_s:.1f}/s  p50 ttft {p50}")


async def _progress_loop(out: TextIO | None, runner: Runner, recorder: Recorder, t0: int, total: int) -> None:
    if out is None:
        return
    tty = out.isatty()
    while True:
        await asyncio.sleep(1.0 if tty else 5.0)
        line = _progress_line(runner, recorder, t0, total)
        out.write(f"\r{line}\033[K" if tty else line + "\n")
        out.flush()


def _say(out: TextIO | None, text: str) -> None:
    if out is not None:
        if out.isatty():
            out.write("\r\033[K")
        out.write(text + "\n")
        out.flush()
