"""`loadgen run WORKLOAD`: offer a workload to a server and record every request."""
from __future__ import annotations

import argparse
import sys

from loadgen.cli.common import EXAMPLES, RAW, WORKLOAD_HELP, serving, workload_config
from loadgen.config.options import add_options


def add_parser(sub) -> None:
    run = sub.add_parser("run", help="offer a workload to a server and record every request",
                         epilog=EXAMPLES, formatter_class=RAW)
    run.add_argument("workload", nargs="?", help=WORKLOAD_HELP)
    add_options(run, "run")
    run.add_argument("--quiet", action="store_true", help="no progress line")


def command(args: argparse.Namespace) -> int:
    # lazy: the launcher pulls in the client (a fast start); --repeat N: a repeats folder of N runs
    from loadgen.run.repeat import run_config

    cfg, client = workload_config(args)
    progress = None if args.quiet else sys.stderr
    with serving(cfg, progress) as exporter:  # --metrics-port: each run's live figures (run/exporter.py)
        outcome = run_config(cfg, progress=progress, client=client,
                             run_one=exporter.run_workload if exporter is not None else None)
    if args.quiet:  # without progress lines, why a run failed must still be said
        for reason in outcome.invalid_reasons:
            print(f"INVALID RUN: {reason}", file=sys.stderr)
    print(outcome.path)
    return outcome.exit_code
