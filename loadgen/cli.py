"""Thin command line: parse flags, call the library. Data to stdout, logs to stderr."""
from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "sim":
        from loadgen.sim.cli import main as sim_main

        return sim_main(argv[1:])
    print("usage: loadgen {run,report,sim,schedule} ...", file=sys.stderr)
    return 2
