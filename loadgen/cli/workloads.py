"""`loadgen workloads`: the shipped workloads, one line each (config/shipped.py); any of them runs by name."""
from __future__ import annotations

import argparse
import sys

from loadgen.cli.common import RAW
from loadgen.config import shipped
from loadgen.errors import ExitCode

EXAMPLES = """
examples:
  loadgen workloads
  loadgen run quickstart                      # a shipped workload, by name, against the built-in simulator
  loadgen schedule multi-turn-chat --requests 3
"""


def add_parser(sub) -> None:
    sub.add_parser("workloads", help="list the shipped workloads (each runs by name: loadgen run quickstart)",
                   epilog=EXAMPLES, formatter_class=RAW)


def command(args: argparse.Namespace) -> int:
    rows = shipped.listing()
    if not rows:
        print("error: this loadgen ships no workloads (its loadgen/workloads folder is missing)", file=sys.stderr)
        return ExitCode.USAGE
    width = max(len(name) for name, _ in rows)
    for name, line in rows:
        print(f"{name:<{width}}  {line}")
    # where they are, for a user who wants a copy to edit (stderr: stdout is the list)
    print(f"(files in {shipped.folder()}; copy one to edit it)", file=sys.stderr)
    return ExitCode.OK
