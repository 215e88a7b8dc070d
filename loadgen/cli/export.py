"""`loadgen export RUN_DIR`: one row per request, as CSV or JSON lines."""
from __future__ import annotations

import argparse
import os
import sys

from loadgen.cli.common import add_out, out_file
from loadgen.errors import ExitCode


def add_parser(sub) -> None:
    exp = sub.add_parser("export", help="per-request rows of a results folder as CSV or JSON lines")
    exp.add_argument("run_dir")
    exp.add_argument("--format", choices=("csv", "jsonl"), default="csv")
    add_out(exp, "write to this file instead of stdout")


def command(args: argparse.Namespace) -> int:
    from loadgen.results.export import export  # lazy: polars (a fast start)

    out = out_file(args)  # never over the run's own files
    try:
        export(args.run_dir, args.format, str(out) if out else None)
    except BrokenPipeError:  # `loadgen export RUN | head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return ExitCode.OK
