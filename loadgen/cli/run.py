"""`loadgen run WORKLOAD`: offer a workload to a server and record every request."""
from __future__ import annotations

import argparse
import sys

from loadgen.cli.common import EXAMPLES, NO_LIVE_HELP, RAW, WORKLOAD_HELP, serving, workload_config
from loadgen.config.options import add_options


def add_parser(sub) -> None:
    run = sub.add_parser("run", help="offer a workload to a server and record every request",
                         epilog=EXAMPLES, formatter_class=RAW)
    run.add_argument("workload", nargs="?", help=WORKLOAD_HELP)
    add_options(run, "run")
    run.add_argument("--quiet", action="store_true", help="no progress line")
    run.add_argument("--no-live", action="store_true", help=NO_LIVE_HELP)


def command(args: argparse.Namespace) -> int:
    # lazy: the launcher pulls in the client (a fast start); --repeat N: a repeats folder of N runs
    from loadgen.run.repeat import run_config

    cfg, client = workload_config(args)
    from loadgen.run import liveview
    from loadgen.run.launch import run_workload

    progress = None if args.quiet else sys.stderr
    with serving(cfg, progress) as exporter:  # --metrics-port: each run's live figures (run/exporter.py)
        run_one = exporter.run_workload if exporter is not None else run_workload
        if liveview.wanted(progress, cfg, args.no_live):   # (one process, one run: a feed to watch)
            with liveview.LiveView(sys.stderr, cfg.max_send_lag_p99_ns / 1e6) as view:
                with view.watching(f"loadgen run {cfg.name}") as feed:
                    outcome = run_one(cfg, progress=view.stream, client=client, feed=feed)
        else:
            outcome = run_config(cfg, progress=progress, client=client, run_one=run_one)
    if args.quiet:  # without progress lines, why a run failed must still be said
        for reason in outcome.invalid_reasons:
            print(f"INVALID RUN: {reason}", file=sys.stderr)
    print(outcome.path)
    return outcome.exit_code
