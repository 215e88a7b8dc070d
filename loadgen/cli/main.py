"""Thin command line: build the parser from one module per subcommand, dispatch, turn errors into exit
codes (loadgen.errors.ExitCode; the table is in `--help` and docs/cli.md).

Data goes to stdout, logs and progress to stderr. Each subcommand module (run, report, schedule, export,
sweep, compare, twin: fit/predict, sim, workloads) has add_parser(sub) and command(args) -> int, and imports its
heavy modules inside command() so that `loadgen --help` starts fast.
"""
from __future__ import annotations

import argparse
import sys

from loadgen import __version__
from loadgen.cli import compare, export, report, run, schedule, sim, sweep, twin, workloads
from loadgen.cli.common import EXAMPLES, RAW
from loadgen.config.credentials import ScrubbedStream
from loadgen.errors import ExitCode, InputError, LoadgenError, StorageError, exit_table

COMMANDS = {"run": run.command, "report": report.command, "schedule": schedule.command,
            "export": export.command, "sweep": sweep.command, "compare": compare.command,
            "fit": twin.fit_command, "predict": twin.predict_command, "workloads": workloads.command}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # usage errors exit 2 with one clear line (argparse's own code)
        self.print_usage(sys.stderr)
        self.exit(ExitCode.USAGE, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="loadgen", description="Open-loop load generator for LLM inference servers.",
                     epilog=EXAMPLES, formatter_class=RAW)
    parser.add_argument("--version", action="version", version=f"loadgen {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for module in (run, report, schedule, export, sim, sweep, compare, workloads):
        module.add_parser(sub)
    twin.add_parsers(sub)  # fit, predict
    for name, command in sub.choices.items():  # every command's --help ends with the exit codes (not sim's own)
        if name != "sim" and exit_table() not in (command.epilog or ""):
            command.epilog = (command.epilog.rstrip("\n") + "\n\n" if command.epilog else "") + exit_table()
            command.formatter_class = RAW
    return parser


def _glue_sim_args(argv: list[str]) -> list[str]:
    # `--sim-args '--prefix-caching'`: argparse takes a value that starts with '-' for a flag; glue it.
    out, i = [], 0
    while i < len(argv):
        if argv[i] == "--sim-args" and i + 1 < len(argv):
            out.append(f"--sim-args={argv[i + 1]}")
            i += 2
        else:
            out.append(argv[i])
            i += 1
    return out


def main(argv: list[str] | None = None) -> int:
    """The command's exit code. From here on stderr is scrubbed of every secret the run sends
    (config/credentials.ScrubbedStream: progress, errors and a bug's traceback, printed after main
    returns, may quote the server); writes pass through it unchanged otherwise."""
    if not isinstance(sys.stderr, ScrubbedStream):
        sys.stderr = ScrubbedStream(sys.stderr)
    return _main(sys.argv[1:] if argv is None else argv)


def _main(argv: list[str]) -> int:
    if argv and argv[0] == "sim":  # the simulator parses its own flags
        return sim.command(argv[1:])
    args = build_parser().parse_args(_glue_sim_args(argv))
    try:
        return COMMANDS[args.command](args)
    except InputError as e:  # each carries every problem found
        print("invalid input:", *(f"  {p}" for p in e.problems), sep="\n", file=sys.stderr)
        return ExitCode.USAGE
    except StorageError as e:  # a file that could not be written: its own code (a run stops at once)
        print(f"error: {e}", file=sys.stderr)
        return ExitCode.STORAGE
    except LoadgenError as e:
        print(f"error: {e}", file=sys.stderr)
        return ExitCode.USAGE
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return ExitCode.INTERRUPTED
