"""The single-process run (no --workers, or --workers 1): the whole plan on this process's event loop.

Builds the bodies of the plan (prepare.request_bodies), runs them (inprocess.measure: the running
manifest is written at t0), and ends the run the common way (ending.finish).
"""
from __future__ import annotations

from typing import TextIO

from loadgen.plan.schedule import Schedule
from loadgen.results.folder import RunWriter
from loadgen.run.ending import RunFacts, finish, run_manifest
from loadgen.run.inprocess import Job
from loadgen.run.live import Feed
from loadgen.run.loop import run_job
from loadgen.run.outcome import RunOutcome
from loadgen.run.prepare import Target, request_bodies, say_workload


def run_single(target: Target, schedule: Schedule, writer: RunWriter, run_id: str,
               progress: TextIO | None, feed: Feed | None = None) -> RunOutcome:
    config = target.config
    backend = target.backend()
    # Bodies after the target is up: the default tokenizer is the target's own /tokenize.
    bodies, shaper, workload = request_bodies(config, schedule, backend, target.url, progress, target.headers,
                                               target.client.ssl_context())
    say_workload(progress, workload)
    facts = RunFacts(target, schedule, run_id, workload)
    job = Job(target, schedule, backend, bodies, shaper, writer, run_id, progress,
              on_t0=lambda t0: writer.manifest(run_manifest(facts, t0)), feed=feed)
    measured = run_job(job)  # also from inside a running event loop (a notebook: loop.py)
    return finish(facts, writer, measured.t0, measured.requests, [measured.record()], progress=progress,
                  final_line=measured.progress_line)
