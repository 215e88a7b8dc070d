"""The one ending of every run, whatever the mode (single process, --workers, --ray): the manifest and
the verdict.

- run_manifest() builds manifest.json whole (every section, docs/results.md), once with status `running`
  at t0 and once at the end; the launcher's own sections (`workers`, `ray`) are added where they apply.
- judge() is the invalid-run rule, applied once to all the run's rows (times ns from t0, plan order):
  the generator's self-check (selfcheck.py; its rate and shape rules only for an open loop, from the
  load model), then an unreachable target (reachability.py: that reason alone), else the error rate
  (analysis/failures.py, --max-error-rate; first, as it says most), then the prompt-length
  verdict (prompts.verdict, with the server's usage counts). The launcher's own reasons (a worker that
  died, Ray's clock skew) come first. A run that was interrupted has no reasons.
- finish() joins them: judges, writes manifest.json, says the status and the reasons, returns the outcome.
Each process of the run hands in what it measured as a `process record` (inprocess.Measured, or a
worker's part manifest): status, t0, and its generator figures (loop lateness, CPU, chunks, histogram
out-of-range counts), which are combined here: the worst loop lateness (the stall floor reads it), the
summed CPU and chunks, the summed out-of-range counts.
"""
from __future__ import annotations

import os
import platform
import socket
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import polars as pl

from loadgen import __version__, metrics
from loadgen.analysis import failures
from loadgen.client.closedloop import load_model
from loadgen.config.options import POOLING_APIS
from loadgen.config.slo import slo_keys
from loadgen.config.workload import RunConfig, redact_url
from loadgen.plan.prompts import usage_check
from loadgen.plan.schedule import Schedule
from loadgen.probe.reachability import unreachable_reason
from loadgen.results.folder import SCHEMA_VERSION, Manifest, RunWriter, saved_row_count
from loadgen.run import selfcheck
from loadgen.run.outcome import RunOutcome, say, say_lengths
from loadgen.run.prepare import Target

CALIBRATION_OFF = ("off (--no-calibrate): without server timings, queue and prefill cannot be separated")
# api = embeddings | rerank: the probes time a first token, which a pooling answer does not have
CALIBRATION_POOLING = "off: a pooling API (embeddings, rerank) answers with no first token for the probes to time"


@dataclass
class RunFacts:
    """What is known of the run before t0, in every mode: the manifest's run-wide sections."""
    target: Target
    schedule: Schedule
    run_id: str
    workload: dict = field(default_factory=dict)   # prepare.request_bodies' `workload` section

    @property
    def config(self) -> RunConfig:
        return self.target.config


@dataclass
class Verdict:
    status: str                    # complete | invalid | interrupted | write_failed
    reasons: list[str]
    generator: dict                # the self-check's figures (selfcheck.check)


def pool_section(schedule: Schedule, scheduled: int | None, records: Sequence[dict] = ()) -> dict | None:
    """The manifest's `schedule.pool` of a closed loop bounded by a duration (plan/pool.py), None for any
    other run: what the pool held (`requests`, `per_user`, `max_user_rate_per_s`), how many of its rows the
    run scheduled (`scheduled`, = schedule.requests; None while it runs) and `unused`, and whether the
    users used it up before the deadline (`exhausted`; `exhausted_at_s`: s from t0 when the first user of
    any process found it empty)."""
    pool = schedule.info.get("pool")
    if pool is None:
        return None
    at = [r["pool_exhausted_at_s"] for r in records if r.get("pool_exhausted_at_s") is not None]
    return {**pool, "scheduled": scheduled, "unused": None if scheduled is None else pool["requests"] - scheduled,
            "exhausted": bool(at), "exhausted_at_s": min(at) if at else None}


def pool_warning(config: RunConfig, pool: dict | None) -> str | None:
    """The WARNING of a pool used up before the deadline (the run ended early), None otherwise."""
    if not pool or not pool["exhausted"]:
        return None
    return (f"the closed loop's pool of {pool['requests']} requests ({pool['per_user']} per user: "
            f"--max-user-rate {pool['max_user_rate_per_s']:g}/s x --duration {(config.duration_ns or 0) / 1e9:g}s) "
            f"ran out {pool['exhausted_at_s']:.1f}s after t0, before the deadline: the users sent faster than "
            f"that and the run ended early; raise --max-user-rate (run.max_user_rate)")


def run_manifest(facts: RunFacts, t0: dict, status: str = "running", reasons: list[str] | None = None,
                 pool: dict | None = None, **sections: Any) -> Manifest:
    """manifest.json. pool: pool_section at the end of a duration-bounded closed loop (None: while it runs,
    or another run). sections: scrape, telemetry, calibration, generator, finished, workers, ray (None = left out)."""
    config, target, schedule = facts.config, facts.target, facts.schedule
    pool = pool or pool_section(schedule, None)
    load = load_model(config)
    if pool is not None and pool["exhausted"]:
        load["pool_exhausted_at_s"] = pool["exhausted_at_s"]   # the report's CLOSED LOOP line says so
    manifest: Manifest = {
        "schema_version": SCHEMA_VERSION, "tool": "loadgen", "version": __version__, "run_id": facts.run_id,
        "status": status, "invalid_reasons": list(reasons or []),
        "config": config.to_manifest(), "seed": config.seed,
        "target": {"url": redact_url(target.url), "backend": config.backend, "api": config.api,
                   "builtin_sim": target.builtin_sim, "server": target.server},
        "t0": t0,
        # the driver's: the process that runs the whole run (analysis/completeness.py looks for its pid)
        "host": {"hostname": socket.gethostname(), "pid": os.getpid(), "platform": platform.platform(),
                 "python": platform.python_version(), "cpus": os.cpu_count()},
        # requests: the rows the run scheduled (completeness.py holds requests.parquet to it); a pool's
        # are known at the end only (None while it runs)
        "schedule": {"requests": len(schedule) if pool is None else pool["scheduled"],
                     "process": config.arrivals.process,
                     "configured_rate_per_s": config.arrivals.rate_per_s,
                     "offered_rate_per_s": schedule.offered_rate_per_s(),
                     "warmup_requests": int(schedule.warmup.sum())},
        "workload": facts.workload,
        "client": target.client.manifest(target.headers),
        "load": load,                                                # open or closed loop
    }
    if pool is not None:
        manifest["schedule"]["pool"] = pool
    if config.slo:
        manifest["slo"] = slo_keys(dict(config.slo))  # read by `report`
    for key, value in sections.items():
        if value is not None:
            manifest[key] = value  # type: ignore[literal-required]  # each a Manifest key (the docstring's)
    return manifest


def check_generator(requests: pl.DataFrame, limits: selfcheck.Limits | None = None,
                    open_loop: bool = True, host: dict | None = None) -> tuple[list[str], dict]:
    # requests: results.REQUEST_SCHEMA frame in plan (idx) order, times int64 ns from any one origin (t0);
    # the self-check reads only differences of them. host: hostload.delta of the process (the cause).
    sent = metrics.latency_columns(requests.filter(pl.col("dispatched_ns").is_not_null()), unit_ns=1,
                                   names=("ttft", "e2e"))
    ok = sent["outcome"] == "ok"
    latency = {m: sent[m].cast(pl.Float64).zip_with(ok, pl.Series([None], dtype=pl.Float64))
               .fill_null(float("nan")).to_numpy() for m in ("ttft", "e2e")}
    return selfcheck.check(sent["intended_ns"].to_numpy(), sent["dispatched_ns"].to_numpy(),
                           sent["slot_wait_ns"].fill_null(0).to_numpy(), limits or selfcheck.Limits(),
                           measured=(~sent["warmup"]).to_numpy(), open_loop=open_loop, latency_ns=latency,
                           host=host)


def worst_host(records: list[dict]) -> dict | None:
    """The process whose event loop waited longest for a CPU (hostload.delta figures), or None."""
    hosts = [r["generator"]["host"] for r in records if (r.get("generator") or {}).get("host")]
    return max(hosts, key=lambda h: h.get("loop_runqueue_share") or 0.0) if hosts else None


def judge(config: RunConfig, requests: pl.DataFrame, status: str, lengths: dict | None,
          launcher_reasons: list[str] | tuple[str, ...] = (), host: dict | None = None) -> Verdict:
    """The invalid-run rule (module docstring). lengths: the workload's `prompt_lengths`, given the
    server's usage counts here (usage_check, in place); None: no prompt-length verdict."""
    reasons, generator = check_generator(requests, selfcheck.limits_of(config),
                                         open_loop=load_model(config)["loop"] == "open", host=host)
    unreachable = unreachable_reason(requests) if status == "complete" else None
    if unreachable:
        reasons = [unreachable]  # the generator's checks (and their advice) say nothing about such a run
    else:
        errors = failures.reason(failures.summarize(requests), config.max_error_rate)
        reasons = [errors, *reasons] if errors else reasons
    reasons = [*launcher_reasons, *reasons] if status == "complete" else []
    if reasons:
        status = "invalid"
    if lengths is not None:  # the server's own counts of what was sent
        # a row with images ([image]) is left out: its server count adds the server's image tokens to the
        # planned text (summary `images` reports them)
        ok = requests.filter((pl.col("outcome") == "ok") & pl.col("images").is_null())
        if config.api == "rerank":  # the server counts each (query, document) pair with its own special tokens
            ok = ok.clear()         # and separators: not the plan's text (its truth is checked in the tests)
        usage_check(lengths, list(zip(ok["planned_prompt_tokens"].to_list(), ok["prompt_tokens"].to_list())))
        if status == "complete" and not lengths["exact"] and not lengths["asked_approximate"]:
            # the server was offered other prompts than the plan's: the run does not describe the workload
            status = "invalid"
            reasons.append(f"prompt lengths are not the planned ones: {lengths['reason']}")
    return Verdict(status, reasons, generator)


def combined_status(statuses: list[str]) -> str:
    """The run's status before judging: write_failed when a process could not save its results, else
    interrupted when any process was; a process that died is the launcher's reason, not a status."""
    for status in ("write_failed", "interrupted"):
        if status in statuses:
            return status
    return "complete"


def write_error(writer: RunWriter, requests: pl.DataFrame) -> tuple[list[str], dict | None]:
    """A run whose results could not all be saved: (its one reason, the manifest's `write_error`)."""
    e = writer.failure
    if e is None:
        return [], None
    saved = saved_rows(writer)
    reason = (f"the results could not be saved: {e}; {saved} of {requests.height} planned requests have a "
              f"saved row (the rest are lost)")
    return [reason], {"path": e.path, "errno": e.errno, "error": e.errno_name, "message": str(e),
                      "rows_saved": saved}


def saved_rows(writer: RunWriter) -> int:
    """Rows in the run's saved files: the merged requests.parquet, else its parts under _parts/."""
    return saved_row_count(writer.path)


def combine_generators(verdict: Verdict, records: list[dict]) -> dict:
    """The self-check's figures with the processes' own: worst loop lateness, summed CPU, chunks, out-of-range,
    the session turns built during the run (session_turns)."""
    gens = [r["generator"] for r in records if r.get("generator")]
    generator = dict(verdict.generator)
    late = [g["loop_lateness_ms"] for g in gens if (g.get("loop_lateness_ms") or {}).get("p99") is not None]
    generator["loop_lateness_ms"] = max(late, key=lambda x: x["p99"]) if late else {"samples": 0}
    cpu_s, chunks = sum(g.get("cpu_s") or 0.0 for g in gens), sum(g.get("chunks") or 0 for g in gens)
    generator.update(cpu_s=cpu_s, chunks=chunks, cpu_us_per_chunk=cpu_s * 1e6 / chunks if chunks else None)
    out: dict[str, int] = {}
    for g in gens:
        for m, n in (g.get("out_of_range") or {}).items():
            out[m] = out.get(m, 0) + int(n or 0)
    generator["out_of_range"] = out
    turns = session_turns(records)
    if turns:
        generator["session_turns"] = turns
    if generator.get("host") is None:
        generator["host"] = worst_host(records)
    return generator


def session_turns(records: list[dict]) -> dict | None:
    """The processes' `generator.session_turns` (inprocess.py) summed: turns built during the run (their
    bodies fitted to the server's count of the history, runner.py), the time that took, impossible fits."""
    parts = [r["generator"]["session_turns"] for r in records if (r.get("generator") or {}).get("session_turns")]
    if not parts:
        return None
    built = sum(p["built"] for p in parts)
    return {"built": built, "prepare_mean_ms": sum(p["prepare_mean_ms"] * p["built"] for p in parts) / built,
            "prepare_max_ms": max(p["prepare_max_ms"] for p in parts),
            "impossible": sum(p["impossible"] for p in parts)}


def calibration_note(config: RunConfig, path: Path, records: list[dict] | None = None) -> str:
    """The manifest's `calibration`: the file the fit went to (written by the process that calibrated), or
    why none: `failed: WHY` with the calibrating process's reason (its record's calibration_failed)."""
    if (path / "calibration.json").is_file():
        return "calibration.json"
    if config.api in POOLING_APIS:
        return CALIBRATION_POOLING
    if not config.calibrate:
        return CALIBRATION_OFF
    why = next((r["calibration_failed"] for r in records or () if r.get("calibration_failed")), None)
    return f"failed: {why}" if why else "failed"


def finish(facts: RunFacts, writer: RunWriter, t0: dict, requests: pl.DataFrame, records: list[dict], *,
           progress: TextIO | None, final_line: str, launcher_reasons: list[str] | tuple[str, ...] = (),
           workers: list[dict] | None = None, ray: dict | None = None) -> RunOutcome:
    """Judge the run, write manifest.json, say how it ended. requests: every row of the run (one per
    scheduled request, plan order, times ns from t0); records: one per process (module docstring)."""
    path = writer.path
    status = combined_status([r["status"] for r in records])
    lengths = facts.workload.get("prompt_lengths")
    impossible = (session_turns(records) or {}).get("impossible")
    if lengths is not None and impossible:
        lengths["turns_impossible"] = impossible  # named in the usage check's reason
    said = lengths["reason"] if lengths else None  # say_workload said it before the run: judge() may add the usage's
    verdict = judge(facts.config, requests, status, lengths, launcher_reasons, host=worst_host(records))
    failed_reasons, failed_write = write_error(writer, requests)
    if failed_write is not None:
        verdict = Verdict("write_failed", failed_reasons, verdict.generator)
    generator = combine_generators(verdict, records)
    if workers is not None:
        generator["workers"] = len(workers)
    pool = pool_section(facts.schedule, requests.height, records)
    warning = pool_warning(facts.config, pool)
    if warning:
        say(progress or sys.stderr, f"WARNING: {warning}")
    scrape = next((r["scrape"] for r in records if r.get("scrape")), None)
    telemetry = next((r["telemetry"] for r in records if r.get("telemetry")), None)
    cache = next((r["prefix_cache"] for r in records if r.get("prefix_cache")), None)
    manifest = run_manifest(facts, t0, verdict.status, verdict.reasons, pool, scrape=scrape, telemetry=telemetry,
                            prefix_cache=cache,
                            calibration=calibration_note(facts.config, path, records), generator=generator,
                            finished={"monotonic_ns": time.monotonic_ns(), "unix_ns": time.time_ns()},
                            workers=workers, ray=ray, write_error=failed_write)
    writer.manifest(manifest)
    if lengths is not None and lengths["reason"] != said:  # once: only news from the server's usage counts
        say_lengths(progress, lengths)
    say(progress, f"{final_line}  [{verdict.status}]")
    failed = failures.summarize(requests)
    if failed["failed"]:  # shown whatever the verdict: a valid run with a few errors says so too
        say(progress or sys.stderr, f"failures: {failures.describe(failed)}")
    for reason in verdict.reasons:
        say(progress, f"INVALID RUN: {reason}")
    return RunOutcome(path, verdict.status, verdict.reasons)
