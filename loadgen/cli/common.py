"""What the subcommands share: the workload's config from a file and flags (run, schedule, sweep), the
--slo flag, the help epilog, and the one rule of where a command may write its --out file (out_file,
write_out: report, export, schedule, compare). Light imports only: `loadgen --help` must start fast."""
from __future__ import annotations

import argparse
from contextlib import contextmanager
from pathlib import Path
from typing import TextIO

from loadgen.config.options import values
from loadgen.errors import ConfigError, exit_table

SLO_HELP = ("service-level objectives, e.g. ttft=500ms,tpot=50ms[,ttfa=2s,e2e=2s,itl_p99=80ms]: adds attainment and "
            "goodput (requests/s meeting every SLO) to the summary")

EXAMPLES = exit_table() + """
examples:
  loadgen run workloads/quickstart.toml                       # against the built-in simulator
  loadgen run workloads/quickstart.toml --url http://127.0.0.1:8000 --rate 8/s --duration 60s
  loadgen report "$(loadgen run workloads/quickstart.toml)"
  loadgen report results/quickstart --format json
  loadgen run workloads/quickstart.toml --url http://127.0.0.1:11434 --backend ollama --scrape-metrics
  loadgen report results/quickstart --device h100-sxm --model-config config.json   # + decode roofline
  loadgen schedule workloads/quickstart.toml --requests 5
  loadgen export results/quickstart --format csv > requests.csv
  loadgen sim --mode fixed --ttft 50ms --itl 10ms --port 0
  loadgen run workloads/quickstart.toml --concurrency 8 --requests 200     # closed loop: 8 users
  loadgen sweep workloads/quickstart.toml --start 1/s --refine 3             # to the saturation knee
  loadgen compare results/a results/b --fail-if "p99 ttft > +10%"
"""
RAW = argparse.RawDescriptionHelpFormatter
NO_LIVE_HELP = ("no live terminal view: the plain progress line even on a terminal (so does LOADGEN_LIVE=0; "
                "pipes, CI, --workers, --ray and --repeat always get the plain line)")
WORKLOAD_HELP = ("workload file (TOML), or a shipped workload's name (`loadgen workloads` lists them); omitted: "
                 "the flags describe it (--rate, --prompt-tokens, --max-tokens, --requests or --duration)")


def workload_config(args: argparse.Namespace):
    """(RunConfig, ClientOptions) from the workload file and the flags (plan/checked.py: every problem at
    once, as one ConfigError)."""
    from loadgen.plan.checked import load_checked  # lazy: the config and plan modules (a fast start)

    return load_checked(args.workload, values(args))


@contextmanager
def serving(cfg, progress: TextIO | None):
    """--metrics-port: the command's Exporter (run/exporter.py) while its runs go, None without the flag.
    A command that ends normally lets it linger for a last scrape; an interrupted one stops it at once."""
    if cfg.metrics_port is None:
        yield None
        return
    from loadgen.run.exporter import Exporter  # lazy: the launcher (a fast start)

    exporter = Exporter(cfg.metrics_host, cfg.metrics_port, progress)
    ended = False
    try:
        yield exporter
        ended = True
    finally:
        exporter.close(linger=ended)


def slo(args: argparse.Namespace) -> dict[str, float] | None:
    """--slo ttft=500ms,tpot=50ms -> {metric: bound ms}; a bad spec is a ConfigError (exit 2)."""
    if not getattr(args, "slo", None):
        return None
    from loadgen.config.slo import parse_slo

    try:
        return parse_slo(args.slo)
    except ValueError as e:
        raise ConfigError([f"--slo: {e}"]) from None


OVERWRITE_HELP = "replace an existing --out file (never a results folder's own files)"


def add_out(parser: argparse.ArgumentParser, help_text: str, metavar: str = "FILE") -> None:
    """--out FILE and --overwrite, as every command that writes one file has them (out_file's rule)."""
    parser.add_argument("--out", metavar=metavar, help=help_text)
    parser.add_argument("--overwrite", action="store_true", help=OVERWRITE_HELP)


def out_file(args: argparse.Namespace, flag: str = "--out") -> Path | None:
    """Where this command may write its output: None for stdout; else the file. A ConfigError (exit 2)
    naming the file and the flag when it is a results folder's own file (results/folder.owned_by:
    manifest.json, requests.parquet, *.hlog, _parts/..., whatever --overwrite says), a folder, under a
    missing folder, or an existing file without --overwrite. Checked before anything is computed."""
    if not args.out:
        return None
    from loadgen.results.folder import owned_by  # lazy: polars (a fast start)

    p = Path(args.out)
    run = owned_by(p.resolve())  # resolved: a link to a run's file is that file
    if run is not None:
        raise ConfigError([f"{flag} {args.out}: is a file of the results folder {run} (written only by `loadgen "
                           f"run` and `loadgen report`); --overwrite does not replace it: choose another file"])
    if p.is_dir():
        raise ConfigError([f"{flag} {args.out}: is a folder; name a file"])
    if not p.resolve().parent.is_dir():
        raise ConfigError([f"{flag} {args.out}: no folder {p.parent}"])
    if p.exists() and not getattr(args, "overwrite", False):
        raise ConfigError([f"{flag} {args.out}: exists; pass --overwrite to replace it, or choose another file"])
    return p


def write_out(path: Path, data: bytes) -> None:
    """Write the output file whole or not at all (a temporary name, then a rename); a failed write is a
    StorageError (exit 5) naming the file."""
    from loadgen.results.folder import write_bytes_durably  # lazy: polars (a fast start)

    write_bytes_durably(path, data)
