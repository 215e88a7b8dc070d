"""`loadgen run` as a library call: run_workload(config) -> RunOutcome. The launcher: it checks the
config and the plan, prepares the results folder and the target (the built-in simulator started when
there is no --url, the model and the server kind, prepare.py), picks the mode and hands the run to it:

    single.run_single        one process, the whole plan (no --workers, or one worker)
    workers.run_workers      --workers N: N processes on this host
    ray_workers.run_ray      --ray: Ray actors across a cluster's nodes

Every mode runs its plan (or each share of it) with inprocess.measure and ends the same way
(ending.finish: one manifest builder, one verdict), so the results folder has the same files and
manifest.json the same sections whatever the mode (docs/results.md, docs/scale-out.md). It never prints
data; progress goes to the `progress` stream (stderr from the CLI). The generator checks itself
(selfcheck.py); a run that did not keep its schedule is marked invalid, since its numbers would describe
the client, not the server.
"""
from __future__ import annotations

import secrets
import sys
from typing import TextIO

from loadgen.config.client import ClientOptions, target_url_and_headers
from loadgen.config.workload import ConfigError, RunConfig, with_overrides
from loadgen.plan.limits import check_config, check_images, check_schedule
from loadgen.plan.schedule import Schedule, build
from loadgen.results.folder import RunWriter
from loadgen.run import ray_workers
from loadgen.run.outcome import RunOutcome, say
from loadgen.run.prepare import default_out, fit_plan, resolve_target
from loadgen.run.live import Feed
from loadgen.run.single import run_single
from loadgen.run.workers import count_for, run_workers
from loadgen.sim.process import SimProcess

__all__ = ["RunOutcome", "default_out", "run_workload"]


def plan_line(schedule: Schedule) -> str | None:
    """With [session], what run.requests / run.duration counted (conversations) and the requests it planned."""
    sessions = schedule.info.get("sessions")
    if sessions is None:
        return None
    return (f"planned {sessions} conversations = {len(schedule)} requests (with [session], --requests and "
            f"--duration count conversations; each turn is a request)")


def say_plan(progress: TextIO | None, schedule: Schedule) -> None:
    line = plan_line(schedule)
    if line:
        say(progress, line)


def run_workload(config: RunConfig, progress: TextIO | None = sys.stderr,
                 client: ClientOptions | None = None, feed: Feed | None = None) -> RunOutcome:
    """The run of a workload, from its config to its ending. With `feed`, a one-process run publishes a
    Snapshot every second into it (live.py); runs with workers publish nothing (the feed stays empty)."""
    if config.ray is not None and not ray_workers.available():
        # checked when the run starts: Ray is needed only by a run that uses it
        raise ConfigError([ray_workers.INSTALL_HINT])
    client = client or ClientOptions()
    if config.prompt_salt is None:  # every run is cold unless it asks to share (plan/bodies.py)
        config = with_overrides(config, "run", prompt_salt=secrets.randbits(63))
    url, headers = target_url_and_headers(config, client)  # the URL without credentials from here on
    check_config(config)
    schedule = build(config)
    check_schedule(schedule.prompt_tokens, schedule.max_tokens)  # before any prompt text exists
    check_images(schedule)
    say_plan(progress, schedule)
    n = count_for(config, schedule) if config.ray is not None or config.workers != 1 else 1
    if config.ray is not None or n > 1:  # the workers write into the folder: it is named in their config
        if config.workers and n < config.workers:
            say(progress, f"{n} workers, not {config.workers}: each needs one of the run's "
                          f"{config.concurrency or config.max_concurrency} users or slots")
        config = with_overrides(config, "--workers", workers=n, out=str(config.out or default_out(config)))
    writer = RunWriter(config.out or default_out(config))
    writer.prepare(client.overwrite)
    sim = None
    try:
        if url is None:
            sim = SimProcess(args=[*config.sim_args, "--truth", str(writer.path / "sim_truth.parquet")])
            url = sim.start()
            say(progress, f"started the built-in simulator at {url}")
        target = resolve_target(config, url, headers, client, sim is not None, progress)
        schedule = fit_plan(schedule, target.config, progress)  # before anything is sent (plan/context.py)
        run_id = secrets.token_hex(4)
        if feed is not None:  # the target's URL without credentials (target_url_and_headers)
            feed.describe(run_id=run_id, workload=config.name, target=target.url, model=target.config.model)
        if config.ray is not None:
            return ray_workers.run_ray(target, schedule, n, writer, run_id, progress)
        if n > 1:
            return run_workers(target, schedule, n, writer, run_id, progress)
        return run_single(target, schedule, writer, run_id, progress, feed)
    except BaseException:
        if sim is not None:
            sim.stop()  # first: it writes its truth file into the folder when it stops
        writer.abandon()  # failed before it started: the folder is as it was (no-op once started)
        raise
    finally:
        if sim is not None:
            sim.stop()
