"""One process's run on its own event loop: calibrate, connect, wait for t0, dispatch, record, flush.

measure(job) -> Measured runs the whole plan (the single process) or one worker's share of it (job.part,
workers.py / ray_workers.py). It neither judges the run nor writes manifest.json: the common ending
(ending.py) does both, the same way in every mode, from what this returns. Progress goes to
job.progress (None = quiet).

While the run goes, a tick every second (aligned to t0) hands the rows finished since the last tick to a
worker thread, which records them into the interval histograms (`*.hlog`, intervals.py) and, every
FLUSH_EVERY_TICKS ticks, writes them as a parquet part and drops them (Recorder.release: the part is
then their only copy, so memory stays flat over a long run; at the end, writer.finalize reads the
parts back with the rows not yet flushed, and the end-of-run checks read that frame). The thread runs
numpy/polars code that mostly releases the GIL; the interpreter's switch interval is lowered for the run
so that a busy thread cannot hold the dispatcher off for the default 5 ms. Event-loop lateness is probed
all along (Measured.generator `loop_lateness_ms`).

A write that fails (disk full, quota, read-only: StorageError) stops the run at once, as a signal would:
nothing more could be saved. The writer keeps the error (RunWriter.failure), nothing more is written
but the final manifest, and the run's status is `write_failed`: the parts flushed before the error stay
readable, so at most the last flush interval is lost.
"""
from __future__ import annotations

import asyncio
import gc
import os
import secrets
import signal
import ssl
import sys
import threading
import time
from array import array
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Protocol, TextIO

import numpy as np
import polars as pl

from loadgen import metrics
from loadgen.client.backends.base import Backend
from loadgen.client.clock import Clock, TimerfdClock, make_clock
from loadgen.client.closedloop import ClosedLoopRunner
from loadgen.client.rawhttp import RawHttpTransport
from loadgen.client.recorder import Recorder, Row
from loadgen.client.runner import Runner
from loadgen.client.transport import AiohttpTransport, grow_fd_table
from loadgen.config.credentials import remember_sent, split_url
from loadgen.config.options import POOLING_APIS
from loadgen.config.workload import RunConfig, redact_url
from loadgen.errors import StorageError
from loadgen.plan.bodies import Bodies
from loadgen.plan.pool import is_pooled
from loadgen.plan.prompts import ApproximateTokenizer, PromptMaker
from loadgen.plan.schedule import Schedule
from loadgen.probe import prefix_cache
from loadgen.probe.calibrate import fit, probe_failure, probe_record, probe_rows
from loadgen.probe.scrape import Scraper, metrics_url, telemetry_frame
from loadgen.results import hdr
from loadgen.results.folder import (RunWriter, parquet_bytes, requests_frame, scrub_strings, tokens_frame, write_json,
                                    write_parquet)
from loadgen.run import hostload
from loadgen.run.intervals import INTERVAL_NS, LiveHistograms, metric_values_ns
from loadgen.run.live import Feed, Tracker
from loadgen.run.outcome import ViewStream, say
from loadgen.run.pacing import Pacer
from loadgen.run.prepare import Target

START_LEAD_NS = 100_000_000     # t0 is this far after set-up, so request 0 is not late by construction
FLUSH_EVERY_TICKS = 2           # parquet parts every 2 s; hlog lines every 1 s
SWITCH_INTERVAL_S = 0.00005     # GIL hand-over bound while the run goes (Python's default: 5 ms)
RELEASE_ROWS = 256              # flushed rows freed between two of the flush thread's pauses
# Event-loop lateness probe period. Each wake costs ~65-95 µs of CPU on this VM (a plain 20-ms asyncio.sleep
# loop costs as much: it is the wake-up, not the probe), so 50 ms: 1.4 ms of CPU a second instead of 3.5.
# A stall's share of the samples is its share of the run whatever the period (a blocked loop's missed
# dues fire one after another, each later by one period less), so the p99 means the same.
LOOP_PROBE_NS = 50_000_000
PROBE_TIMEOUT_NS = 10_000_000_000        # each calibration probe (an idle server answers one far sooner)
CALIBRATION_BUDGET_NS = 60_000_000_000   # all calibration probes together


class Share(Protocol):
    """One worker's part of the plan (workers.Part): its number, the shared t0, its rows."""
    worker: int

    def wait_for_t0(self) -> int: ...

    def select(self, rows: list[Row], bodies: list[bytes], shaper): ...


@dataclass
class Job:
    """What one process's run needs; everything before it (target, bodies) is set up already."""
    target: Target
    schedule: Schedule
    backend: Backend
    bodies: list[bytes]
    shaper: Bodies | None
    writer: RunWriter                 # the run's folder, or a worker's share of it (workers.PartWriter)
    run_id: str
    progress: TextIO | None = None
    part: Share | None = None         # None: the whole plan, t0 = set-up end + START_LEAD_NS
    on_t0: Callable[[dict], None] | None = None   # called with the t0 section (t0_section) once t0 is set
    calibration_failed: str | None = None         # why calibration could not run (set before t0)
    feed: Feed | None = None          # watched live (live.py): a Snapshot published every second
    # called with the run's event loop and its stop event as it starts: a stop asked from another thread
    # (loop.py, where the run has a thread of its own)
    on_loop: Callable[[asyncio.AbstractEventLoop, asyncio.Event], None] | None = None


@dataclass
class Measured:
    """What the run of one process left, for the ending (ending.py) to judge and describe."""
    status: str                       # complete | interrupted
    t0: dict                          # t0_section: this process's t0
    requests: pl.DataFrame            # its rows as written (results.REQUEST_SCHEMA, times ns from t0)
    generator: dict                   # loop_lateness_ms, cpu_s, chunks, out_of_range (per metric)
    scrape: dict | None = None        # Scraper.summary(), with --scrape-metrics
    telemetry: list[dict] | None = None   # Scraper.summary() of each --scrape endpoint
    progress_line: str = ""           # the last progress line (the ending adds the status)
    calibration_failed: str | None = None   # why this process's calibration could not run
    prefix_cache: dict | None = None  # prefix_cache.delta over the run (the first process only)
    write_error: dict | None = None   # StorageError.record() of the write that stopped the run
    pool_exhausted_at_s: float | None = None  # s from t0: its closed loop's pool ran out before the deadline

    def record(self) -> dict:
        """The process record the ending reads (ending.py; a worker's is its part manifest)."""
        return {"status": self.status, "t0": self.t0, "generator": self.generator, "scrape": self.scrape,
                "telemetry": self.telemetry,
                "calibration_failed": self.calibration_failed, "prefix_cache": self.prefix_cache,
                "write_error": self.write_error, "pool_exhausted_at_s": self.pool_exhausted_at_s}


def t0_section(t0_ns: int, unix_ns: int) -> dict:
    """The manifest's `t0`: CLOCK_MONOTONIC ns (the origin of every *_ns column) and the wall clock then."""
    return {"monotonic_ns": t0_ns, "unix_ns": unix_ns, "iso": datetime.fromtimestamp(unix_ns / 1e9, UTC).isoformat()}


async def measure(job: Job) -> Measured:
    config, part, writer, progress = job.target.config, job.part, job.writer, job.progress
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    if threading.current_thread() is threading.main_thread():  # Python's rule for signal handlers
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
    if job.on_loop is not None:
        job.on_loop(loop, stop)
    clock = make_clock()
    url, headers = job.target.url, job.target.headers
    tls = job.target.client.ssl_context()
    transport = await _before_t0(job, clock, stop, tls)
    warm_flush_path()
    # The server's prefix-cache counters, before t0 and after the run (after calibration: its probes
    # are not the run's): one process reads them for the whole run.
    counts = part is None or part.worker == 0
    cache_before = await prefix_cache.snapshot(url, headers, tls) if counts else None
    # The server's /metrics (--scrape-metrics) and every --scrape endpoint: a first sample of each before
    # t0, so that their samples bracket the measured window from its start (a counter's increase over the
    # run: the first request's count must not race the first scrape); t0 is set below
    scraper = (Scraper(metrics_url(url), 0, config.scrape_interval_ns, headers, tls, now_ns=clock.now_ns)
               if config.scrape_metrics else None)
    telemetry = telemetry_scrapers(config, tls, clock.now_ns)
    samplers = ([scraper] if scraper else []) + telemetry
    await asyncio.gather(*(sc.sample() for sc in samplers))
    mono_now, wall_now = clock.now_ns(), time.time_ns()
    # a worker of a --workers run (workers.py) gets the shared t0 from its driver once every worker is ready
    t0 = part.wait_for_t0() if part else mono_now + START_LEAD_NS
    wall_now += t0 - mono_now - START_LEAD_NS
    rows, bodies, shaper = plan_rows(job, t0)
    started = t0_section(t0, wall_now + START_LEAD_NS)
    if job.on_t0 is not None:
        job.on_t0(started)
    recorder = Recorder(rows)
    hists = LiveHistograms(writer.hlog_dir, t0, (wall_now + START_LEAD_NS) / 1e9,
                           worker=part.worker if part else None)
    lateness_ns = array("q")  # one sample per LOOP_PROBE_NS: 8 bytes each, not a Python int
    # The kernel grows the descriptor table as connections open, and each growth past 256, 512, ... stalls
    # the whole client for a grace period (transport.grow_fd_table): grown now, before t0, not during the run.
    grow_fd_table()
    # Everything built so far (rows, bodies, modules) lives for the whole run: move it out of the
    # collector's sight, so a full collection during the run scans only what the run allocates
    # (otherwise each one blocks the loop for milliseconds).
    gc.collect()
    gc.freeze()
    old_switch = sys.getswitchinterval()
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    # Sample /metrics during the run (bytes only; parsed afterwards), and every --scrape endpoint.
    for sc in samplers:
        sc.t0_ns = t0
    scrape_task = asyncio.create_task(scraper.run()) if scraper else None
    telemetry_tasks = [asyncio.create_task(sc.run()) for sc in telemetry]
    try:
        async with transport:
            # --concurrency N is a closed loop of N users (closedloop.py)
            # (mypy cannot match the splatted users/think_ns, ClosedLoopRunner's own keywords, to a signature)
            # bounded by a duration, no request starts after t0 + duration (closedloop.py)
            deadline_ns = t0 + config.duration_ns if is_pooled(config) and config.duration_ns else None
            closed = ({"users": config.concurrency, "think_ns": config.think_ns, "deadline_ns": deadline_ns}
                      if config.concurrency else {})
            runner = (ClosedLoopRunner if closed else Runner)(
                            rows, bodies, job.backend, transport, clock, recorder, **closed,  # type: ignore[arg-type]
                            max_concurrency=config.max_concurrency,
                            request_timeout_ns=config.request_timeout_ns,
                            drain_timeout_ns=config.drain_timeout_ns,
                            next_body=shaper.next_turn if shaper is not None else None,
                            next_body_blocks=shaper is not None and shaper.blocking)
            if job.feed is not None:
                hists.tracker = _tracker(job.feed, runner, rows, t0, bool(closed), deadline_ns is not None,
                                         lateness_ns, scraper)
            flusher = asyncio.create_task(_tick_loop(writer, recorder, hists, t0, clock.now_ns, stop))
            probe = asyncio.create_task(_probe_loop(lateness_ns))
            ticker = asyncio.create_task(_progress_loop(progress, runner, recorder, t0, len(rows), clock.now_ns))
            cpu0, host0 = os.times(), hostload.sample()
            try:
                status = await runner.run(stop)
            finally:
                for t in (flusher, probe, ticker):
                    t.cancel()
                await asyncio.gather(flusher, probe, ticker, return_exceptions=True)
                clock.close()
                cpu1, host1 = os.times(), hostload.sample()
    finally:
        sys.setswitchinterval(old_switch)
        gc.unfreeze()
    scrape = await _end_scrape(scraper, scrape_task, writer, progress)
    telemetry_summary = await _end_telemetry(telemetry, telemetry_tasks, writer, progress)
    cache = prefix_cache.delta(cache_before, await prefix_cache.snapshot(url, headers, tls)) if counts else None
    rest = recorder.take_finished()
    saving(writer, lambda: hists.record_interval(rest, clock.now_ns() - t0))
    saving(writer, hists.close)  # its last lines synced; after a failed write only the totals are needed
    histograms = hists.summary()
    # Every row of the run, flushed or not (times ns from t0): what the checks read. A closed loop's pool
    # rows that its users never reached are not the run's (closedloop.py): they yield no row.
    unreached = {r.idx for r in runner.unreached()}
    requests = writer.finalize([r for r in recorder.unflushed() if r.idx not in unreached], t0)
    if writer.failure is not None:
        status = "write_failed"
        say(progress, f"error: {writer.failure}: the run stopped; the rows saved so far are in {writer.path}")
    # The client's CPU over the run (dispatch, streams, parsing after each stream, histograms, flushes):
    # the cost per streamed chunk is what limits the rate one process can drive.
    cpu_s = (cpu1.user - cpu0.user) + (cpu1.system - cpu0.system)
    generator = {"loop_lateness_ms": _lateness(lateness_ns), "cpu_s": cpu_s,
                 "chunks": int(requests["n_chunks"].sum()),
                 "out_of_range": {m: h["out_of_range"] for m, h in histograms.items()},
                 "host": hostload.delta(host0, host1)}   # starved or saturated? (selfcheck.cause)
    prepared = getattr(runner, "prepare_ns", None)  # session turns built during the run (runner.py)
    if prepared and shaper is not None:
        generator["session_turns"] = {"built": len(prepared), "prepare_mean_ms": sum(prepared) / len(prepared) / 1e6,
                                      "prepare_max_ms": max(prepared) / 1e6, "impossible": shaper.turns_impossible}
    exhausted_ns = getattr(runner, "exhausted_ns", None)  # a duration-bounded closed loop's pool used up
    return Measured(status, started, requests, generator, scrape, telemetry_summary,
                    _progress_line(runner, recorder, t0, len(rows), clock.now_ns), job.calibration_failed, cache,
                    writer.failure.record() if writer.failure else None,
                    (exhausted_ns - t0) / 1e9 if exhausted_ns is not None else None)


async def _before_t0(job: Job, clock: Clock, stop: asyncio.Event, tls: ssl.SSLContext | bool):
    """Calibrate the idle server (when asked), then open and warm the run's transport; returns it, entered."""
    config, url, headers, progress = job.target.config, job.target.url, job.target.headers, job.progress
    if config.calibrate:
        job.calibration_failed = await _calibrate(config, job.schedule, job.backend, url, headers, clock,
                                                  job.writer, progress, stop, tls,
                                                  job.shaper.maker if job.shaper is not None else None)
    elif config.api in POOLING_APIS:
        say(progress, f"calibration off: api = {config.api} answers with no first token for the probes to time")
    else:
        say(progress, "calibration off (--no-calibrate): unless the server reports per-request timings, the "
                      "report cannot split TTFT into queueing and prefill")
    transport = make_transport(url, headers, tls, clock)
    await transport.__aenter__()
    say(progress, f"opening a connection to {redact_url(url)} (GET /v1/models, at most 2s)")
    await transport.warm()  # before t0: the transport's first-request costs must not delay request 0 or 1
    return transport


async def _end_scrape(scraper: Scraper | None, task: asyncio.Task | None, writer: RunWriter,
                      progress: TextIO | None) -> dict | None:
    """Stop the /metrics sampler, write server_metrics.parquet; the manifest's `scrape` section."""
    if scraper is None or task is None:
        return None
    scraper.stop()
    await asyncio.gather(task, return_exceptions=True)
    await scraper.sample()
    frame = scraper.frame()
    saving(writer, lambda: write_parquet(writer.path / "server_metrics.parquet", frame))
    if scraper.errors:
        say(progress, f"warning: {scraper.errors} of {scraper.errors + scraper.scrapes} /metrics scrapes "
                      f"failed; last: {scraper.last_error}")
    return scraper.summary()


def telemetry_scrapers(config: RunConfig, tls: ssl.SSLContext | bool, now_ns) -> list[Scraper]:
    """A Scraper per --scrape endpoint, on the run's clock (its t0_ns set once t0 is). A URL's credentials
    are sent as Basic auth (and scrubbed from what is written, as the target's are); the target's --header
    values are not sent: an exporter is another host, not the target."""
    out = []
    for raw in config.scrape:
        url, auth = split_url(raw)
        remember_sent(auth)
        out.append(Scraper(url, 0, config.scrape_interval_ns, auth, tls, now_ns=now_ns, source=redact_url(raw)))
    return out


async def _end_telemetry(scrapers: list[Scraper], tasks: list[asyncio.Task], writer: RunWriter,
                         progress: TextIO | None) -> list[dict] | None:
    """Stop the --scrape samplers, write telemetry.parquet; the manifest's `telemetry` section (None
    without endpoints). A failing endpoint is counted and said, never fatal."""
    if not scrapers:
        return None
    for sc in scrapers:
        sc.stop()
    await asyncio.gather(*tasks, return_exceptions=True)
    await asyncio.gather(*(sc.sample() for sc in scrapers))
    frame = telemetry_frame(scrapers)
    saving(writer, lambda: write_parquet(writer.path / "telemetry.parquet", frame))
    for sc in scrapers:
        if sc.errors:
            say(progress, f"warning: {sc.errors} of {sc.errors + sc.scrapes} scrapes of {sc.source} failed; "
                          f"last: {sc.last_error}")
    return [sc.summary() for sc in scrapers]


async def _calibrate(config: RunConfig, schedule: Schedule, backend, url: str, headers: dict, clock: Clock,
                     writer: RunWriter, progress: TextIO | None, stop: asyncio.Event,
                     tls: ssl.SSLContext | bool = True, maker: PromptMaker | None = None) -> str | None:
    """Sequential probes of the idle server (calibrate.py); writes calibration.json. Returns why it could
    not calibrate (said loudly on progress; the manifest's `calibration` records it), None otherwise.
    maker: the run's prompt maker, so probes are counted by the run's tokenizer (exact lengths)."""
    rows = probe_rows(schedule.prompt_tokens, clock.now_ns(), secrets.token_hex(4), config.context_limit)
    if not rows:
        return "no probe fits the target's context" if len(schedule) else None
    # probes never share text with the run, nor with another run's probes (the run's salt, bodies.py)
    rng = np.random.default_rng([config.seed, 0xCA11B, *([] if config.prompt_salt is None else [config.prompt_salt])])
    maker = maker or PromptMaker(ApproximateTokenizer())
    bodies = [backend.body(maker.text(r.planned_prompt_tokens, rng, whole=True), r.max_tokens) for r in rows]
    probe_ns = min(config.request_timeout_ns, PROBE_TIMEOUT_NS)
    say(progress, f"calibrating: {len(rows)} sequential probes of the idle server at {redact_url(url)} "
                  f"(prompt lengths {sorted({r.planned_prompt_tokens for r in rows})}; each waits at most "
                  f"{probe_ns / 1e9:g}s, all {CALIBRATION_BUDGET_NS / 1e9:g}s; --no-calibrate skips this)")
    why = None
    async with make_transport(url, headers, tls, clock) as transport:
        # The warm-up probe alone first: a server that does not answer it is not probed 15 more times.
        for part, drain_ns in ((slice(0, 1), probe_ns), (slice(1, None), CALIBRATION_BUDGET_NS)):
            runner = Runner(rows[part], bodies[part], backend, transport, clock,
                            Recorder(rows[part]), max_concurrency=1, request_timeout_ns=probe_ns,
                            drain_timeout_ns=drain_ns)
            if await runner.run(stop) == "interrupted":
                return None  # SIGINT/SIGTERM: the measured run will see `stop` and end at once
            if rows[0].outcome != "ok":
                why = f"the first probe ({rows[0].planned_prompt_tokens} prompt tokens) ended {probe_failure(rows[0])}"
                break
    try:
        calibration = fit([probe_record(r) for r in rows[1:]]) if why is None else None
    except ValueError as e:
        why = f"{e} ({'; '.join(sorted({probe_failure(r) for r in rows[1:] if r.outcome != 'ok'}))})"
    if why is not None or calibration is None:
        say(progress, f"WARNING: calibration failed: {why}; the report cannot split TTFT into queue and prefill "
                      f"for this run")
        return why
    write_json(writer.path / "calibration.json", calibration)
    return None


def plan_rows(job: Job, t0: int) -> tuple[list[Row], list[bytes], Bodies | None]:
    """The rows of the plan (or of the job's share of it), due at t0 + their planned offsets."""
    schedule, bodies, shaper = job.schedule, job.bodies, job.shaper
    rows = [Row(i, f"{job.run_id}-{i:06d}", t0 + int(off), int(p), int(m), bool(w))
            for i, (off, p, m, w) in enumerate(zip(schedule.intended_ns, schedule.prompt_tokens,
                                                   schedule.max_tokens, schedule.warmup))]
    shape_rows(rows, schedule, job.target.config)
    if job.part:  # its share of the plan only
        rows, bodies, shaper = job.part.select(rows, bodies, shaper)
    return rows, bodies, shaper


def shape_rows(rows: list[Row], schedule: Schedule, config: RunConfig) -> None:
    """Copy the plan's workload shape onto the rows (-1 in the plan = not applicable = null), and each row's
    [[mix]] class with the model and priority its body carries (plan/bodies.py)."""
    mix = config.mix
    for r, j in zip(rows, schedule.mix_class.tolist()):
        c = mix[j] if j >= 0 and mix else None
        r.mix_class = c.name if c else None
        r.model = (c.model if c and c.model else None) or config.model or None
        r.priority = c.priority if c else None
    for r, g, s, t, a, k, an, at in zip(rows, schedule.prefix_group.tolist(), schedule.session.tolist(),
                                        schedule.turn.tolist(), schedule.after.tolist(), schedule.think_ns.tolist(),
                                        schedule.abandon_ns.tolist(), schedule.abandon_tokens.tolist()):
        r.prefix_group, r.session, r.turn = (None if g < 0 else g), (None if s < 0 else s), (None if t < 0 else t)
        if a >= 0:
            r.after, r.think_ns, r.intended_ns = a, k, None  # timed by the previous turn, at run time
        if an >= 0:
            r.abandon_after_ns = an
        if at >= 0:
            r.abandon_after_tokens = at
    for r, n, w, h in zip(rows, schedule.images.tolist(), schedule.image_width.tolist(),
                          schedule.image_height.tolist()):
        if n:
            r.images, r.image_width, r.image_height = n, w, h
    if schedule.max_tool_rounds:  # agentic sessions: a first turn sends a user message (tool round 0); a
        # later turn's round is decided when it is built (client/runner.py), its drawn latency kept till then
        for r, t, lat in zip(rows, schedule.turn.tolist(), schedule.tool_latency_ns.tolist()):
            if t == 0:
                r.tool_round = 0
            elif lat >= 0:
                r.tool_latency_ns = lat


def make_transport(url: str, headers: dict[str, str], tls: ssl.SSLContext | bool = True,
                   clock: Clock | None = None):
    # Plain http: the raw protocol transport (stamps in the protocol callback, on the run's clock; see
    # rawhttp.py). https, or LOADGEN_TRANSPORT=aiohttp: aiohttp (tls: client_options.ClientOptions.ssl_context).
    now_ns = clock.now_ns if clock is not None else time.monotonic_ns
    if url.startswith("http://") and os.environ.get("LOADGEN_TRANSPORT", "raw") == "raw":
        return RawHttpTransport(url, headers, now_ns=now_ns)
    return AiohttpTransport(url, headers, tls, now_ns=now_ns)


def _lateness(samples_ns: array) -> dict:
    if not samples_ns:
        return {"samples": 0}
    a = np.asarray(samples_ns, dtype=np.int64)
    p50, p99 = metrics.quantiles(a, (0.5, 0.99))
    return {"samples": int(a.size), "p50": float(p50) / 1e6, "p99": float(p99) / 1e6, "max": float(a.max()) / 1e6,
            "probe_period_ms": LOOP_PROBE_NS / 1e6}


async def _probe_loop(out: array) -> None:
    # How late the loop runs a timer (kernel wake-up included, ~50-100 µs on a VM): a blocked loop shows here
    # even between dispatches. Own timerfd, no spin, so it costs one wake-up per period.
    try:
        probe = TimerfdClock(spin_ns=0)
    except (OSError, AttributeError):
        return
    try:
        due = probe.now_ns() + LOOP_PROBE_NS
        while True:
            await probe.sleep_until(due)
            out.append(probe.now_ns() - due)
            due += LOOP_PROBE_NS
    finally:
        probe.close()


def warm_flush_path() -> None:
    """Run the flush thread's work once on two made-up rows, before t0, and throw the result away.

    Why: the first time that work runs, it imports modules (Polars' numpy path imports numpy.ma: ~150 ms)
    and builds Polars' and the Parquet writer's state; in the first tick of the run that held the event
    loop off for ~70 ms about 1 s after t0 (measured: loop lateness 69 ms at 400 req/s; issue 29's early
    stall). Done here, the cost falls in set-up, where nothing is timed."""
    rows = [Row(i, f"warm-{i}", 0, 1, 2) for i in range(2)]
    for r in rows:
        r.outcome = "ok"
        r.dispatched_ns = r.connected_ns = r.sent_ns = r.response_ns = 1_000
        r.first_token_ns = r.first_answer_ns = 2_000
        r.last_token_ns = r.done_ns = 3_000
        r.slot_wait_ns, r.prompt_tokens, r.output_tokens, r.n_chunks = 0, 1, 2, 2
        r.chunk_t_ns.extend((2_000, 3_000))
        r.chunk_tokens.extend((1, 1))
    for values_ns in metric_values_ns(rows).values():
        hist = hdr.new_histogram()
        hdr.record_ns(hist, values_ns)
        hist.encode()   # as an interval log line does
    parquet_bytes(scrub_strings(requests_frame(rows, 0)))
    parquet_bytes(scrub_strings(tokens_frame(rows, 0)))


def saving(writer: RunWriter, write: Callable[[], object]) -> object:
    """Run one write of the run's files unless one already failed; a failure (any OSError) is kept in the
    writer (RunWriter.fail) and not raised: the run ends the way of a failed write. Returns what
    `write` returned, None when it did not run or failed."""
    if writer.failure is not None:
        return None
    try:
        return write()
    except StorageError as e:
        writer.fail(e)
    except OSError as e:
        writer.fail(StorageError(str(getattr(e, "filename", None) or writer.path), e))
    return None


async def _tick_loop(writer: RunWriter, recorder: Recorder, hists: LiveHistograms, t0: int, now_ns,
                     stop: asyncio.Event | None = None) -> None:
    """Every second the interval's histograms, every FLUSH_EVERY_TICKS a part; a failed write sets
    `stop` (the run ends) and ends the loop."""
    tick = 0
    pending: list = []
    while True:
        tick += 1
        end_ns = tick * INTERVAL_NS
        delay_ns = t0 + end_ns - now_ns()
        if delay_ns > 0:
            await asyncio.sleep(delay_ns / 1e9)
        if end_ns <= hists.next_start_ns:
            continue
        rows = recorder.take_finished()
        pending.extend(rows)
        flush, pending = (pending, []) if tick % FLUSH_EVERY_TICKS == 0 else ([], pending)
        work = asyncio.get_running_loop().run_in_executor(None, tick_work, writer, recorder, hists, rows, end_ns,
                                                          flush, t0)
        try:
            await asyncio.shield(work)
        except asyncio.CancelledError:
            await asyncio.gather(work, return_exceptions=True)  # the run's end must not write the same
            raise                                                # files while this thread still does
        if writer.failure is not None:
            if stop is not None:
                stop.set()
            return


def tick_work(writer: RunWriter, recorder: Recorder, hists: LiveHistograms, rows: list, end_ns: int, flush: list,
              t0: int) -> None:
    """One tick's work, in the flush thread: the interval's histograms, and every FLUSH_EVERY_TICKS a part."""
    # Runs at the event loop's own CPU priority, never lower: this thread holds the GIL in its Python
    # parts, and a lowered (nice 19) holder beside CPU-bound processes is not scheduled for hundreds of
    # ms while the loop waits for the GIL (priority inversion; measured beside a 2-job compile at 400
    # req/s: send-lag p99 160-220 ms at nice 19, 4.2 ms at nice 0, the bare client 4.9 ms). The
    # GIL switch interval bounds how long it holds the loop off only while it is running, and the pacer
    # (run/pacing.py) how much of the loop's core and GIL it takes while it works.
    pause = Pacer()
    saving(writer, lambda: hists.record_interval(rows, end_ns, pause))
    rows.clear()
    if flush and writer.failure is None:
        try:
            writer.flush(flush, t0, pause=pause)
        except StorageError:
            return  # kept in writer.failure; the rows stay in the recorder, unflushed
        # the last references: the rows are released and freed here, off the event loop's thread, a few
        # hundred at a time (freeing thousands of rows is milliseconds of the GIL)
        while flush:
            recorder.release(flush[-RELEASE_ROWS:])
            del flush[-RELEASE_ROWS:]
            pause()


def _tracker(feed: Feed, runner: Runner, rows: list[Row], t0: int, closed: bool, bounded_pool: bool,
             lateness_ns: array, scraper: Scraper | None) -> Tracker:
    # the planned count: a duration-bounded closed loop's pool is not its count (closedloop.py)
    return Tracker(feed, None if bounded_pool else len(rows),
                   None if closed else np.fromiter((r.intended_ns - t0 for r in rows), np.int64, len(rows)),
                   lambda: (runner.dispatched, len(runner.in_flight)), lateness_ns,
                   scraper.latest_gauges if scraper is not None else dict)


def _progress_line(runner: Runner, recorder: Recorder, t0: int, total: int, now_ns) -> str:
    elapsed_s = max(1e-9, (now_ns() - t0) / 1e9)
    ttfts = recorder.ttft_window_ns
    # answers without a token (embeddings, rerank) have no TTFT: their e2e is shown instead
    name, window = ("ttft", ttfts) if ttfts or not recorder.e2e_window_ns else ("e2e", recorder.e2e_window_ns)
    p50 = f"{metrics.quantiles(np.asarray(window), (0.5,))[0] / 1e6:.1f}ms" if window else "-"
    # a duration-bounded closed loop sends what its users reach of its pool (closedloop.py)
    sent = (f"{runner.dispatched} (pool {total})" if getattr(runner, "deadline_ns", None) is not None
            else f"{runner.dispatched}/{total}")
    return (f"[{elapsed_s:7.1f}s] sent {sent}  done {recorder.done}  "
            f"failed {recorder.failed}  in-flight {len(runner.in_flight)}  "
            f"rate {runner.dispatched / elapsed_s:.1f}/s  p50 {name} {p50}")


async def _progress_loop(out: TextIO | None, runner: Runner, recorder: Recorder, t0: int, total: int,
                         now_ns) -> None:
    if out is None or isinstance(out, ViewStream):  # the live view (run/liveview.py) replaces the line
        return
    tty = out.isatty()
    while True:
        await asyncio.sleep(1.0 if tty else 5.0)
        line = _progress_line(runner, recorder, t0, total, now_ns)
        out.write(f"\r{line}\033[K" if tty else line + "\n")
        out.flush()
