"""`loadgen sweep WORKLOAD`: the workload at a series of rates, to the saturation knee or max goodput
(the flags -> SweepSpec: loadgen/run/sweep_args.py; the sweep itself: loadgen/run/sweep.py)."""
from __future__ import annotations

import argparse
import sys
from functools import partial
from pathlib import Path

from loadgen.cli.common import NO_LIVE_HELP, RAW, serving, slo, workload_config
from loadgen.config.options import add_options
from loadgen.errors import ExitCode
from loadgen.run.sweep_args import SPEC_OPTIONS

SWEEP_EXAMPLES = """\
examples:
  loadgen sweep workloads/quickstart.toml --rates 2,4,8,16/s
  loadgen sweep workloads/quickstart.toml --start 1/s --factor 2 --refine 3 --out results/qs-sweep
  loadgen sweep workloads/quickstart.toml --start 2/s --slo ttft=500ms,tpot=50ms --max-goodput --refine 4
  loadgen sweep workloads/quickstart.toml --start 1/s --out results/qs-sweep --resume
"""


def add_parser(sub) -> None:
    sw = sub.add_parser("sweep", help="run a workload at a series of rates: the saturation knee, max goodput",
                        description="One results folder per rate, a sweep manifest and summary "
                                    "(docs/sweep-and-compare.md).", epilog=SWEEP_EXAMPLES, formatter_class=RAW)
    sw.add_argument("workload", help="workload file (TOML) or a shipped workload's name (`loadgen workloads`)")
    add_options(sw, "sweep")  # the workload's flags and the run options a sweep passes to every point
    sw.add_argument("--quiet", action="store_true", help="no progress lines")
    sw.add_argument("--no-live", action="store_true", help=NO_LIVE_HELP)
    for flag, default, help_text in SPEC_OPTIONS:  # the spec's own flags (run/sweep_args.py)
        if default is False:
            sw.add_argument(flag, action="store_true", help=help_text)
        else:
            sw.add_argument(flag, default=default, help=help_text.replace("%", "%%"))
    sw.add_argument("--out", help="sweep folder (default results/NAME-sweep-TIMESTAMP)")
    sw.add_argument("--resume", action="store_true", help="continue the sweep in --out, keeping finished points")


def command(args: argparse.Namespace) -> int:
    # lazy: the sweep pulls in the launcher and the analysis (a fast start for the other commands)
    from loadgen.run.sweep_args import ArgError, spec_from_args
    from loadgen.run import liveview
    from loadgen.run.sweep import SUMMARY_TXT, SweepError, default_sweep_out, run_sweep
    from loadgen.sim.process import SimStartError

    try:
        spec = spec_from_args(args, slo(args))
        cfg, client = workload_config(args)  # client: --header, --insecure, --ca-bundle for every point
        out = Path(args.out) if args.out else default_sweep_out(cfg)
        progress = None if args.quiet else sys.stderr
        with serving(cfg, progress) as exporter:  # --metrics-port: each point's live figures, labelled `rate`
            run_one = partial(exporter.run_workload, point=True) if exporter is not None else None
            if liveview.wanted(progress, cfg, args.no_live):
                with liveview.LiveView(sys.stderr, cfg.max_send_lag_p99_ns / 1e6) as view:
                    outcome = run_sweep(cfg, spec, out, resume=args.resume, progress=view.stream, client=client,
                                        run_one=run_one, live=view)
            else:
                outcome = run_sweep(cfg, spec, out, resume=args.resume, progress=progress, client=client,
                                    run_one=run_one)
    except (ArgError, SweepError, SimStartError) as e:
        print(f"error: {e}", file=sys.stderr)
        return ExitCode.USAGE
    sys.stderr.write((outcome.path / SUMMARY_TXT).read_text())
    print(outcome.path)
    return outcome.exit_code
