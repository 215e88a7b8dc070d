"""`loadgen run WORKLOAD`: offer a workload to a server and record every request."""
from __future__ import annotations

import argparse
import sys

from loadgen.cli.common import EXAMPLES, NO_LIVE_HELP, RAW, WORKLOAD_HELP, workload_config
from loadgen.config.options import add_options


def add_parser(sub) -> None:
    run = sub.add_parser("run", help="offer a workload to a server and record every request",
                         epilog=EXAMPLES, formatter_class=RAW)
    run.add_argument("workload", nargs="?", help=WORKLOAD_HELP)
    add_options(run, "run")
    run.add_argument("--quiet", action="store_true", help="no progress line")
    run.add_argument("--no-live", action="store_true", help=NO_LIVE_HELP)


def command(args: argparse.Namespace) -> int:
    from loadgen.run.launch import run_workload  # lazy: the launcher pulls in the client (a fast start)

    cfg, client = workload_config(args)
    if cfg.repeat > 1:  # --repeat N: a repeats folder of N runs (loadgen/run/repeat.py)
        from loadgen.run.repeat import run_repeated

        outcome = run_repeated(cfg, progress=None if args.quiet else sys.stderr, client=client)
    else:
        from loadgen.run import liveview

        progress = None if args.quiet else sys.stderr
        if liveview.wanted(progress, cfg, args.no_live):
            with liveview.LiveView(sys.stderr, cfg.max_send_lag_p99_ns / 1e6) as view:
                with view.watching(f"loadgen run {cfg.name}") as feed:
                    outcome = run_workload(cfg, progress=view.stream, client=client, feed=feed)
        else:
            outcome = run_workload(cfg, progress=progress, client=client)
    if args.quiet:  # without progress lines, why a run failed must still be said
        for reason in outcome.invalid_reasons:
            print(f"INVALID RUN: {reason}", file=sys.stderr)
    print(outcome.path)
    return outcome.exit_code
