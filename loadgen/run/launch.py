"""`loadgen run` as a library call: plan, (start the simulator), dispatch, record, write the folder.

run_workload(config) -> RunOutcome. It never prints data; progress goes to the `progress` stream
(stderr from the CLI). The generator checks itself (loadgen/run/selfcheck.py: send-lag p99, achieved rate,
arrival shape); a run that did not keep its schedule is marked invalid, since its numbers would describe
the client, not the server. Event-loop lateness is probed all along and written to the manifest.

While the run goes, a tick every second (aligned to t0) hands the rows finished since the last tick to a
worker thread, which records them into the interval histograms (`*.hlog`, intervals.py) and, every
FLUSH_EVERY_TICKS ticks, writes them as a parquet part and drops them (Recorder.release: the part is
then their only copy, so memory stays flat over a long run; at the end, RunWriter.finalize reads the
parts back with the rows not yet flushed, and the end-of-run checks read that frame). The thread runs
numpy/polars code that mostly releases the GIL; the interpreter's switch interval is lowered for the run
so that a busy thread cannot hold the dispatcher off for the default 5 ms.
"""
from __future__ import annotations

import asyncio
import gc
import os
import platform
import secrets
import signal
import socket
import ssl
import sys
import time
from array import array
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TextIO

import numpy as np
import polars as pl
import uvloop

from loadgen import __version__, metrics
from loadgen.errors import ExitCode
from loadgen.run import selfcheck
from loadgen.client.backends import make_backend
from loadgen.config.client import ClientOptions, target_url_and_headers
from loadgen.client.clock import Clock, TimerfdClock, make_clock
from loadgen.config.workload import ConfigError, RunConfig, redact_url, with_overrides
from loadgen.probe.discover import DISCOVER_TIMEOUT_S, discover_model
from loadgen.plan.bodies import Bodies
from loadgen.plan.datasets import load_sharegpt
from loadgen.plan.limits import check_config, check_schedule
from loadgen.run.intervals import INTERVAL_NS, LiveHistograms
from loadgen.plan.prompts import PromptMaker, synthetic_text
from loadgen.probe.server_tokenizer import resolve as resolve_tokenizer
from loadgen.plan.prompts import usage_check, verdict
from loadgen.probe.servers import detect as detect_server
from loadgen.client.rawhttp import RawHttpTransport
from loadgen.probe.reachability import unreachable_reason
from loadgen.client.recorder import Recorder, Row
from loadgen.probe.calibrate import fit, probe_record, probe_rows
from loadgen.config.slo import slo_keys
from loadgen.client.closedloop import ClosedLoopRunner, load_model
from loadgen.results.folder import SCHEMA_VERSION, RunWriter, write_json, write_parquet
from loadgen.probe.scrape import Scraper
from loadgen.client.runner import Runner
from loadgen.plan.schedule import Schedule, build
from loadgen.sim.process import SimProcess
from loadgen.client.transport import AiohttpTransport

START_LEAD_NS = 100_000_000     # t0 is this far after set-up, so request 0 is not late by construction
FLUSH_EVERY_TICKS = 2           # parquet parts every 2 s; hlog lines every 1 s
SWITCH_INTERVAL_S = 0.00005     # GIL hand-over bound while the run goes (Python's default: 5 ms)
LOOP_PROBE_NS = 20_000_000      # event-loop lateness probe period
PROBE_TIMEOUT_NS = 10_000_000_000        # each calibration probe (an idle server answers one far sooner)
CALIBRATION_BUDGET_NS = 60_000_000_000   # all calibration probes together


@dataclass
class RunOutcome:
    path: Path
    status: str                      # complete | interrupted | invalid
    invalid_reasons: list[str] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        return {"complete": ExitCode.OK, "invalid": ExitCode.INVALID}.get(self.status, ExitCode.INTERRUPTED)


def default_out(config: RunConfig) -> Path:
    return Path("results") / f"{config.name}-{datetime.now().strftime('%Y%m%d-%H%M%S')}"


def request_bodies(config: RunConfig, schedule: Schedule, backend, url: str | None = None,
                   progress: TextIO | None = None,
                   headers: dict[str, str] | None = None) -> tuple[list[bytes], Bodies, dict]:
    """Every body (later session turns are built at run time by Bodies.next_turn), and the manifest's
    `workload` section: tokenizer used (and any fallback warning), prompt length checks and verdict
    (`prompt_lengths`, prompts.verdict), trace counts."""
    tokenizer, warning = resolve_tokenizer(config.tokenizer, url, config.tokenizer_file, config.api,
                                           config.model, progress, headers)
    maker = PromptMaker(tokenizer)
    convs = load_sharegpt(config.dataset) if config.dataset else None
    bodies = Bodies(schedule, backend, maker, config.seed, convs)
    built = bodies.build_all()
    checks = maker.summary()
    info = {**schedule.info, "tokenizer": {**tokenizer.describe(), "requested": config.tokenizer,
                                           "warning": warning}, "prompt_checks": checks,
            "prompt_lengths": verdict(tokenizer, checks, config.tokenizer)}
    return built, bodies, info


def run_workload(config: RunConfig, progress: TextIO | None = sys.stderr,
                 client: ClientOptions | None = None) -> RunOutcome:
    if config.ray is not None:
        from loadgen.run.ray_workers import INSTALL_HINT, available, run_ray  # Ray actors (--ray)

        if not available():  # checked when the run starts: Ray is needed only by a run that uses it
            raise ConfigError([INSTALL_HINT])
        return run_ray(config, progress)
    if config.workers != 1:
        from loadgen.run.workers import run_workers  # several processes (--workers)
        return run_workers(config, progress, client)
    client = client or ClientOptions()
    url, headers = target_url_and_headers(config, client)  # the URL without credentials from here on
    check_config(config)
    schedule = build(config)
    check_schedule(schedule.prompt_tokens, schedule.max_tokens)  # before any prompt text exists
    writer = RunWriter(config.out or default_out(config))
    writer.prepare(client.overwrite)
    sim = None
    try:
        if url is None:
            sim = SimProcess(args=[*config.sim_args, "--truth", str(writer.path / "sim_truth.parquet")])
            url = sim.start()
            _say(progress, f"started the built-in simulator at {url}")
        if not config.model:
            _say(progress, f"model not given: asking {redact_url(url)}/v1/models (up to {DISCOVER_TIMEOUT_S:g}s)")
            config = with_overrides(config, "/v1/models", model=discover_model(url, headers, client.ssl_context()))
            _say(progress, f"model: {config.model} (the one the target serves)")
        backend = make_backend(config.backend, config.api, config.model, config.extra_body)
        # Bodies after the target is up: the default tokenizer is the target's own /tokenize.
        server = detect_server(url, headers, progress=progress)
        _say(progress, f"server kind: {server['kind']}" + (f" {server['version']}" if server["version"] else ""))
        bodies, shaper, workload_info = request_bodies(config, schedule, backend, url, progress, headers)
        workload_info["server"] = server
        if workload_info["tokenizer"]["warning"]:
            _say(progress, "WARNING: " + workload_info["tokenizer"]["warning"])
        _say_lengths(progress, workload_info["prompt_lengths"])
        return asyncio.Runner(loop_factory=uvloop.new_event_loop).run(
            _run(config, schedule, backend, bodies, writer, url, sim is not None, progress,
                 shaper, workload_info, (client, headers)))
    except BaseException:
        if sim is not None:
            sim.stop()  # first: it writes its truth file into the folder when it stops
        writer.abandon()  # failed before it started: the folder is as it was (no-op once started)
        raise
    finally:
        if sim is not None:
            sim.stop()


async def _run(config: RunConfig, schedule: Schedule, backend, bodies, writer: RunWriter, url: str,
               builtin_sim: bool, progress: TextIO | None, shaper: Bodies | None = None,
               workload_info: dict | None = None,
               client_headers: tuple[ClientOptions, dict] | None = None, part=None) -> RunOutcome:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    clock = make_clock()
    client, headers = client_headers or (ClientOptions(), target_url_and_headers(config, ClientOptions())[1])
    tls = client.ssl_context()
    # Probe the idle server before t0.
    calibration = None
    if config.calibrate:
        calibration = await _calibrate(config, schedule, backend, url, headers, clock, writer, progress, stop,
                                       tls)
    else:
        _say(progress, "calibration off (--no-calibrate): unless the server reports per-request timings, the "
                       "report cannot split TTFT into queueing and prefill")
    transport = make_transport(url, headers, tls, clock)
    await transport.__aenter__()
    _say(progress, f"opening a connection to {redact_url(url)} (GET /v1/models, at most 2s)")
    await transport.warm()  # before t0: the transport's first-request costs must not delay request 0 or 1
    run_id = part.run_id if part else secrets.token_hex(4)
    mono_now, wall_now = clock.now_ns(), time.time_ns()
    # a worker of a --workers run (workers.py) gets the shared t0 from its driver once every worker is ready
    t0 = part.wait_for_t0() if part else mono_now + START_LEAD_NS
    wall_now += t0 - mono_now - START_LEAD_NS
    rows = [Row(i, f"{run_id}-{i:06d}", t0 + int(off), int(p), int(m), bool(w))
            for i, (off, p, m, w) in enumerate(zip(schedule.intended_ns, schedule.prompt_tokens,
                                                   schedule.max_tokens, schedule.warmup))]
    shape_rows(rows, schedule)
    if part:  # its share of the plan only
        rows, bodies, shaper = part.select(rows, bodies, shaper)
    manifest = {
        "schema_version": SCHEMA_VERSION, "tool": "loadgen", "version": __version__, "run_id": run_id,
        "status": "running", "invalid_reasons": [],
        "config": config.to_manifest(), "seed": config.seed,
        "target": {"url": redact_url(url), "backend": config.backend, "api": config.api,
                   "builtin_sim": builtin_sim, "server": (workload_info or {}).pop("server", None)},
        "t0": {"monotonic_ns": t0, "unix_ns": wall_now + START_LEAD_NS,
               "iso": datetime.fromtimestamp((wall_now + START_LEAD_NS) / 1e9, UTC).isoformat()},
        "host": {"hostname": socket.gethostname(), "pid": os.getpid(), "platform": platform.platform(),
                 "python": platform.python_version(), "cpus": os.cpu_count()},
        "schedule": {"requests": len(schedule), "process": config.arrivals.process,
                     "configured_rate_per_s": config.arrivals.rate_per_s,
                     "offered_rate_per_s": schedule.offered_rate_per_s(),
                     "warmup_requests": int(schedule.warmup.sum())},
        "workload": workload_info or {},
        "client": client.manifest(headers),
        "load": load_model(config),                                  # open or closed loop
        **({"slo": slo_keys(dict(config.slo))} if config.slo else {}),  # read by `report`
    }
    writer.manifest(manifest)
    recorder = Recorder(rows)
    hists = LiveHistograms(writer.path, t0, (wall_now + START_LEAD_NS) / 1e9, worker=part.worker if part else None)
    lateness_ns = array("q")  # one sample per LOOP_PROBE_NS: 8 bytes each, not a Python int
    # Everything built so far (rows, bodies, modules) lives for the whole run: move it out of the
    # collector's sight, so a full collection during the run scans only what the run allocates
    # (otherwise each one blocks the loop for milliseconds).
    gc.collect()
    gc.freeze()
    old_switch = sys.getswitchinterval()
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    # Sample /metrics during the run (bytes only; parsed afterwards).
    scraper = (Scraper(url, t0, config.scrape_interval_ns, headers, tls, now_ns=clock.now_ns)
               if config.scrape_metrics else None)
    scrape_task = asyncio.create_task(scraper.run()) if scraper else None
    try:
        async with transport:
            # --concurrency N is a closed loop of N users (closedloop.py)
            closed = {"users": config.concurrency, "think_ns": config.think_ns} if config.concurrency else {}
            runner = (ClosedLoopRunner if closed else Runner)(
                            rows, bodies, backend, transport, clock, recorder, **closed,
                            max_concurrency=config.max_concurrency,
                            request_timeout_ns=config.request_timeout_ns,
                            drain_timeout_ns=config.drain_timeout_ns,
                            next_body=shaper.next_turn if shaper is not None else None)
            flusher = asyncio.create_task(_tick_loop(writer, recorder, hists, t0, clock.now_ns))
            probe = asyncio.create_task(_probe_loop(lateness_ns))
            ticker = asyncio.create_task(_progress_loop(progress, runner, recorder, t0, len(rows), clock.now_ns))
            cpu0 = os.times()
            try:
                status = await runner.run(stop)
            finally:
                for t in (flusher, probe, ticker):
                    t.cancel()
                await asyncio.gather(flusher, probe, ticker, return_exceptions=True)
                clock.close()
                cpu1 = os.times()
    finally:
        sys.setswitchinterval(old_switch)
        gc.unfreeze()
    if scrape_task is not None:
        scrape_task.cancel()
        await asyncio.gather(scrape_task, return_exceptions=True)
        await scraper.final_sample()
        write_parquet(writer.path / "server_metrics.parquet", scraper.frame())
        manifest["scrape"] = scraper.summary()
        if scraper.errors:
            _say(progress, f"warning: {scraper.errors} of {scraper.errors + scraper.scrapes} /metrics scrapes "
                           f"failed; last: {scraper.last_error}")
    manifest["calibration"] = ("calibration.json" if calibration else
                               "off (--no-calibrate): without server timings, queue and prefill cannot be "
                               "separated" if not config.calibrate else "failed")
    rest = recorder.take_finished()
    hists.record_interval(rest, clock.now_ns() - t0)
    histograms = hists.close()
    # Every row, flushed or not, as written to requests.parquet (times ns from t0): what the checks read.
    requests = writer.finalize(recorder.unflushed(), t0)
    reasons, generator = check_generator(requests, selfcheck.limits_of(config),
                                         open_loop=load_model(config)["loop"] == "open")
    if status != "complete":
        reasons = []
    unreachable = unreachable_reason(requests) if status == "complete" else None
    if unreachable:
        reasons = [unreachable]  # the generator's checks (and their advice) say nothing about such a run
    if reasons:
        status = "invalid"
    generator["loop_lateness_ms"] = _lateness(lateness_ns)
    # The client's CPU over the run (dispatch, streams, parsing after each stream, histograms, flushes):
    # the cost per streamed chunk is what limits the rate one process can drive.
    chunks = int(requests["n_chunks"].sum())
    cpu_s = (cpu1.user - cpu0.user) + (cpu1.system - cpu0.system)
    generator.update(cpu_s=cpu_s, chunks=chunks, cpu_us_per_chunk=cpu_s * 1e6 / chunks if chunks else None)
    generator["out_of_range"] = {m: h["out_of_range"] for m, h in histograms.items()}
    lengths = manifest["workload"].get("prompt_lengths")
    if lengths is not None:  # the server's own counts of what was sent
        ok = requests.filter(pl.col("outcome") == "ok")
        usage_check(lengths, list(zip(ok["planned_prompt_tokens"].to_list(), ok["prompt_tokens"].to_list())))
        _say_lengths(progress, lengths)
        if status == "complete" and not lengths["exact"] and not lengths["asked_approximate"]:
            # the server was offered other prompts than the plan's: the run does not describe the workload
            status = "invalid"
            reasons.append(f"prompt lengths are not the planned ones: {lengths['reason']}")
    manifest.update(status=status, invalid_reasons=reasons, generator=generator,
                    finished={"monotonic_ns": clock.now_ns(), "unix_ns": time.time_ns()})
    writer.manifest(manifest)
    _say(progress, _progress_line(runner, recorder, t0, len(rows), clock.now_ns) + f"  [{status}]")
    for reason in reasons:
        _say(progress, f"INVALID RUN: {reason}")
    return RunOutcome(writer.path, status, reasons)


async def _calibrate(config: RunConfig, schedule: Schedule, backend, url: str, headers: dict, clock: Clock,
                     writer: RunWriter, progress: TextIO | None, stop: asyncio.Event,
                     tls: ssl.SSLContext | bool = True) -> dict | None:
    """Sequential probes of the idle server (calibrate.py); writes calibration.json. None if it failed."""
    rows = probe_rows(schedule.prompt_tokens, clock.now_ns(), secrets.token_hex(4))
    if not rows:
        return None
    rng = np.random.default_rng([config.seed, 0xCA11B])  # probes never share text with the run
    bodies = [backend.body(synthetic_text(r.planned_prompt_tokens, rng), r.max_tokens) for r in rows]
    probe_ns = min(config.request_timeout_ns, PROBE_TIMEOUT_NS)
    _say(progress, f"calibrating: {len(rows)} sequential probes of the idle server at {redact_url(url)} "
                   f"(prompt lengths {sorted({r.planned_prompt_tokens for r in rows})}; each waits at most "
                   f"{probe_ns / 1e9:g}s, all {CALIBRATION_BUDGET_NS / 1e9:g}s; --no-calibrate skips this)")
    async with make_transport(url, headers, tls, clock) as transport:
        # The warm-up probe alone first: a server that does not answer it is not probed 15 more times.
        for part, drain_ns in ((slice(0, 1), probe_ns), (slice(1, None), CALIBRATION_BUDGET_NS)):
            runner = Runner(rows[part], bodies[part], backend, transport, clock,
                            Recorder(rows[part]), max_concurrency=1, request_timeout_ns=probe_ns,
                            drain_timeout_ns=drain_ns)
            if await runner.run(stop) == "interrupted":
                return None  # SIGINT/SIGTERM: the measured run will see `stop` and end at once
            if rows[0].outcome != "ok":
                _say(progress, f"warning: calibration skipped: the first probe ended {rows[0].outcome} "
                               f"({rows[0].error_kind}); queue and prefill will not be separated")
                return None
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


def make_transport(url: str, headers: dict[str, str], tls: ssl.SSLContext | bool = True,
                   clock: Clock | None = None):
    # Plain http: the raw protocol transport (stamps in the protocol callback, on the run's clock; see
    # rawhttp.py). https, or LOADGEN_TRANSPORT=aiohttp: aiohttp (tls: client_options.ClientOptions.ssl_context).
    now_ns = clock.now_ns if clock is not None else time.monotonic_ns
    if url.startswith("http://") and os.environ.get("LOADGEN_TRANSPORT", "raw") == "raw":
        return RawHttpTransport(url, headers, now_ns=now_ns)
    return AiohttpTransport(url, headers, tls, now_ns=now_ns)


def check_generator(requests: pl.DataFrame, limits: selfcheck.Limits | None = None,
                    open_loop: bool = True) -> tuple[list[str], dict]:
    # requests: results.REQUEST_SCHEMA frame in plan (idx) order, times int64 ns from any one origin (t0);
    # the self-check reads only differences of them
    sent = requests.filter(pl.col("dispatched_ns").is_not_null())
    return selfcheck.check(sent["intended_ns"].to_numpy(), sent["dispatched_ns"].to_numpy(),
                           sent["slot_wait_ns"].fill_null(0).to_numpy(), limits or selfcheck.Limits(),
                           measured=(~sent["warmup"]).to_numpy(), open_loop=open_loop)


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


async def _tick_loop(writer: RunWriter, recorder: Recorder, hists: LiveHistograms, t0: int, now_ns) -> None:
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
        work = asyncio.get_running_loop().run_in_executor(None, _tick_work, writer, recorder, hists, rows, end_ns,
                                                          flush, t0)
        try:
            await asyncio.shield(work)
        except asyncio.CancelledError:
            await work  # the run's end must not write the same files while this thread still does
            raise


def _tick_work(writer: RunWriter, recorder: Recorder, hists: LiveHistograms, rows: list, end_ns: int, flush: list,
               t0: int) -> None:
    # Runs at the event loop's own CPU priority, never lower: this thread holds the GIL in its Python
    # parts, and a lowered (nice 19) holder beside CPU-bound processes is not scheduled for hundreds of
    # ms while the loop waits for the GIL (priority inversion; measured beside a 2-job compile at 400
    # req/s: send-lag p99 160-220 ms at nice 19, 4.2 ms at nice 0, the bare client 4.9 ms). The
    # GIL switch interval bounds how long it holds the loop off only while it is running.
    hists.record_interval(rows, end_ns)
    rows.clear()
    if flush:
        writer.flush(flush, t0)
        recorder.release(flush)
        flush.clear()  # the last references: the rows are freed here, off the event loop's thread


def _progress_line(runner: Runner, recorder: Recorder, t0: int, total: int, now_ns) -> str:
    elapsed_s = max(1e-9, (now_ns() - t0) / 1e9)
    ttfts = recorder.ttft_window_ns
    p50 = f"{metrics.quantiles(ttfts, (0.5,))[0] / 1e6:.1f}ms" if ttfts else "-"
    return (f"[{elapsed_s:7.1f}s] sent {runner.dispatched}/{total}  done {recorder.done}  "
            f"failed {recorder.failed}  in-flight {len(runner.in_flight)}  "
            f"rate {runner.dispatched / elapsed_s:.1f}/s  p50 ttft {p50}")


async def _progress_loop(out: TextIO | None, runner: Runner, recorder: Recorder, t0: int, total: int,
                         now_ns) -> None:
    if out is None:
        return
    tty = out.isatty()
    while True:
        await asyncio.sleep(1.0 if tty else 5.0)
        line = _progress_line(runner, recorder, t0, total, now_ns)
        out.write(f"\r{line}\033[K" if tty else line + "\n")
        out.flush()


def _say_lengths(out: TextIO | None, lengths: dict) -> None:
    # A warning is not progress: on stderr with --quiet too (the note for an asked-for approximation is).
    if lengths["exact"]:
        return
    if lengths["asked_approximate"]:
        _say(out, f"note: prompt lengths are NOT exact: {lengths['reason']}")
    else:
        _say(out or sys.stderr, f"WARNING: prompt lengths are NOT exact: {lengths['reason']} (the run is "
                                f"invalid, exit code {ExitCode.INVALID:d}, unless prompt.tokenizer = \"approximate\")")


def _say(out: TextIO | None, text: str) -> None:
    if out is not None:
        if out.isatty():
            out.write("\r\033[K")
        out.write(text + "\n")
        out.flush()
