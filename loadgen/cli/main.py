"""Thin command line: parse flags into one frozen RunConfig, call the library.

Data goes to stdout, logs and progress to stderr. Exit codes: 0 ok; 2 usage or invalid input; 3 run
invalid (the generator could not keep the schedule); 4 a `compare --fail-if` rule held; 130 interrupted
(results still written).
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import orjson

from loadgen import __version__
from loadgen.config.options import add_options, values

EXIT_CODES = """\
exit codes:
  0    ok
  2    bad usage or input (every problem is listed, naming the file and key or the flag)
  3    run invalid: its numbers do not describe the asked workload (the generator fell behind, or the
       prompt lengths are not exact): reasons in manifest.json and the report
  130  interrupted (SIGINT/SIGTERM): the results folder is still complete and readable
"""

EXAMPLES = EXIT_CODES + """
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


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # usage errors exit 2 with one clear line (argparse's own code)
        self.print_usage(sys.stderr)
        self.exit(2, f"{self.prog}: error: {message}\n")


SLO_HELP = ("service-level objectives, e.g. ttft=500ms,tpot=50ms[,e2e=2s,itl_p99=80ms]: adds attainment and "
            "goodput (requests/s meeting every SLO) to the summary")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="loadgen", description="Open-loop load generator for LLM inference servers.",
                     epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"loadgen {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    run = sub.add_parser("run", help="offer a workload to a server and record every request",
                         epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    run.add_argument("workload", help="workload file (TOML), e.g. workloads/quickstart.toml")
    add_options(run, "run")
    run.add_argument("--quiet", action="store_true", help="no progress line")
    rep = sub.add_parser("report", help="summarize a results folder",
                         epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    rep.add_argument("run_dir")
    rep.add_argument("--format", choices=("text", "json", "html", "md"), default="text",
                     help="html: one self-contained file with plots (docs/html-report.md); md: for issues and PRs")
    rep.add_argument("--out", help="write the report to this file instead of stdout")
    rep.add_argument("--device", help="device name for the roofline (see loadgen/data/devices.json), e.g. h100-sxm")
    rep.add_argument("--bandwidth", help="memory bandwidth instead of --device, e.g. 3350GB/s")
    rep.add_argument("--model-config", help="the model's config.json (Hugging Face layout) for the roofline")
    rep.add_argument("--window", default="5s", help="time window of the decomposition over the run (default 5s)")
    rep.add_argument("--slo", help=SLO_HELP)
    sch = sub.add_parser("schedule", help="dry run: print the planned requests as JSON lines",
                         epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    sch.add_argument("workload", help="workload file (TOML), e.g. workloads/quickstart.toml")
    add_options(sch, "schedule")
    sch.add_argument("--out", help="write the plan to FILE.jsonl or FILE.parquet instead of stdout")
    exp = sub.add_parser("export", help="per-request rows of a results folder as CSV or JSON lines")
    exp.add_argument("run_dir")
    exp.add_argument("--format", choices=("csv", "jsonl"), default="csv")
    exp.add_argument("--out", help="write to this file instead of stdout")
    sub.add_parser("sim", help="the built-in simulated server (see `loadgen sim --help`)", add_help=False)
    _sweep_and_compare_parsers(sub)
    from loadgen.cli.twin import add_parsers

    add_parsers(sub)  # fit, predict
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


def _sweep_and_compare_parsers(sub) -> None:
    sw = sub.add_parser("sweep", help="run a workload at a series of rates: the saturation knee, max goodput",
                        description="One results folder per rate, a sweep manifest and summary "
                                    "(docs/sweep-and-compare.md).", epilog=SWEEP_EXAMPLES,
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    sw.add_argument("workload", help="workload file (TOML), e.g. workloads/quickstart.toml")
    add_options(sw, "sweep")  # the workload's flags and the run options a sweep passes to every point
    sw.add_argument("--quiet", action="store_true", help="no progress lines")
    sw.add_argument("--rates", help="rates to measure, e.g. 2,4,8/s (a unit on the last one applies to all)")
    sw.add_argument("--start", help="geometric series: first rate, e.g. 1/s (until saturation)")
    sw.add_argument("--factor", default="2", help="geometric series: ratio between rates (default 2)")
    sw.add_argument("--max-rate", help="geometric series: never above this rate")
    sw.add_argument("--max-points", default="12", help="at most this many points (default 12)")
    sw.add_argument("--refine", default="0", help="bisection steps between the last good and first bad rate")
    sw.add_argument("--max-goodput", action="store_true",
                    help="search the highest rate at which --attainment of requests meet every --slo")
    sw.add_argument("--attainment", default="0.9", help="target share of requests meeting every SLO (0.9)")
    sw.add_argument("--knee-tolerance", default="5%", help="completion rate may fall this far below the "
                                                           "offered rate and still keep up (default 5%%)")
    sw.add_argument("--ttft-factor", default="3", help="ttft knee: p99 TTFT within this factor of the "
                                                       "lowest rate's (default 3)")
    sw.add_argument("--out", help="sweep folder (default results/NAME-sweep-TIMESTAMP)")
    sw.add_argument("--resume", action="store_true", help="continue the sweep in --out, keeping finished points")
    cmp = sub.add_parser("compare", help="compare runs or sweeps: same-work check, CIs, verdicts",
                         description="A is the baseline; each other input is compared with it.",
                         epilog=COMPARE_EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    cmp.add_argument("inputs", nargs="+", metavar="RUN_OR_SWEEP", help="results folders or sweep folders (2+)")
    cmp.add_argument("--format", choices=("text", "json"), default="text")
    cmp.add_argument("--out", help="write the comparison to this file instead of stdout")
    cmp.add_argument("--fail-if", action="append", default=[], metavar="RULE",
                     help="e.g. 'p99 ttft > +10%%' or 'throughput < -5%%' or 'p50 itl > +2ms'; exit 4 when a "
                          "rule holds (repeatable)")
    cmp.add_argument("--slo", help=SLO_HELP)
    cmp.add_argument("--resamples", default="1000", help="bootstrap resamples (default 1000)")
    cmp.add_argument("--seed", default="0", help="bootstrap seed (default 0)")
    cmp.add_argument("--min-effect", default="5%", help="smaller changes are called indistinguishable even "
                                                        "when resolved (default 5%%: run-to-run noise)")


SWEEP_EXAMPLES = """\
examples:
  loadgen sweep workloads/quickstart.toml --rates 2,4,8,16/s
  loadgen sweep workloads/quickstart.toml --start 1/s --factor 2 --refine 3 --out results/qs-sweep
  loadgen sweep workloads/quickstart.toml --start 2/s --slo ttft=500ms,tpot=50ms --max-goodput --refine 4
  loadgen sweep workloads/quickstart.toml --start 1/s --out results/qs-sweep --resume
"""
COMPARE_EXAMPLES = """\
examples:
  loadgen compare results/vllm results/sglang
  loadgen compare results/base results/new --fail-if "p99 ttft > +10%" --fail-if "throughput < -5%"
  loadgen compare results/sweep-a results/sweep-b --format json
"""


def _config(args: argparse.Namespace):
    from loadgen.config import workload as config
    from loadgen.plan import traces
    from loadgen.plan.limits import check_config

    try:
        cfg = config.load(args.workload, values(args))
    except config.ConfigError as e:
        # Every problem in one pass: with a trace, its bad rows too.
        path = getattr(args, "trace", None)
        more: list[str] = []
        if path:
            try:
                traces.read(path, args.trace_format or "", skip_bad_rows=bool(args.skip_bad_rows))
            except traces.TraceError as t:
                more = t.problems
        raise config.ConfigError(e.problems + more) from None
    check_config(cfg)
    return cfg


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "sim":
        from loadgen.sim.cli import main as sim_main

        return sim_main(argv[1:])
    args = build_parser().parse_args(_glue_sim_args(argv))
    from loadgen.errors import InputError, LoadgenError

    try:
        if args.command == "run":
            return _run(args)
        if args.command == "report":
            return _report(args)
        if args.command == "schedule":
            return _schedule(args)
        if args.command == "sweep":
            return _sweep(args)
        if args.command == "compare":
            return _compare(args)
        if args.command in ("fit", "predict"):
            from loadgen.cli.twin import fit_command, predict_command

            return (fit_command if args.command == "fit" else predict_command)(args)
        if args.command == "export":
            from loadgen.results.export import export

            try:
                export(args.run_dir, args.format, args.out)
            except BrokenPipeError:  # `loadgen export RUN | head`
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 0
    except InputError as e:  # each carries every problem found
        print("invalid input:", *(f"  {p}" for p in e.problems), sep="\n", file=sys.stderr)
        return 2
    except LoadgenError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    return 2


def _run(args: argparse.Namespace) -> int:
    from loadgen.config.client import ClientOptions
    from loadgen.run.launch import run_workload

    cfg = _config(args)
    client = ClientOptions.from_flags(args.header, args.insecure, args.ca_bundle, args.overwrite)
    outcome = run_workload(cfg, progress=None if args.quiet else sys.stderr, client=client)
    if args.quiet:  # without progress lines, why a run failed must still be said
        for reason in outcome.invalid_reasons:
            print(f"INVALID RUN: {reason}", file=sys.stderr)
    print(outcome.path)
    return outcome.exit_code


def _report(args: argparse.Namespace) -> int:
    from loadgen.analysis.explain import ExplainOptions
    from loadgen.analysis.report_summary import build
    from loadgen.report import to_json, to_text
    from loadgen.config.units import parse_duration_ns

    if args.format in ("html", "md"):  # a sweep's or a comparison's page
        from loadgen.report.pages import render_sweep_or_compare

        page = render_sweep_or_compare(args.run_dir, args.format)
        if page is not None:
            Path(args.out).write_text(page) if args.out else sys.stdout.write(page)
            return 0
    if bool(args.device or args.bandwidth) != bool(args.model_config):
        print("error: the roofline needs --model-config and one of --device / --bandwidth", file=sys.stderr)
        return 2
    slo = _slo(args)
    try:
        try:
            window_ns = parse_duration_ns(args.window)
        except ValueError as e:
            raise ValueError(f"--window: {e}") from None
        opts = ExplainOptions(args.device, args.bandwidth, args.model_config, window_ns)
        # summary, explanation, goodput; writes summary.json and decomposition.parquet
        run, summary, decomposition = build(args.run_dir, opts, slo)
    except ValueError as e:  # RooflineError is one
        print(f"error: {e}", file=sys.stderr)
        return 2
    text = to_json(summary) if args.format == "json" else to_text(summary)
    if args.format in ("html", "md"):
        from loadgen.report.pages import render_run_page

        text = render_run_page(args.format, summary, run, decomposition)
    if args.out:
        Path(args.out).write_text(text)
    else:
        sys.stdout.write(text)
    return 0


def _slo(args: argparse.Namespace) -> dict[str, float] | None:
    # --slo ttft=500ms,tpot=50ms -> {metric: bound ms}; a bad spec is a ConfigError (exit 2)
    if not getattr(args, "slo", None):
        return None
    from loadgen.config.slo import parse_slo
    from loadgen.config.workload import ConfigError

    try:
        return parse_slo(args.slo)
    except ValueError as e:
        raise ConfigError([f"--slo: {e}"]) from None


def _sweep(args: argparse.Namespace) -> int:
    from loadgen.sim.process import SimStartError
    from loadgen.run.sweep import SweepError, default_sweep_out, run_sweep
    from loadgen.cli.sweep_args import ArgError, spec_from_args

    try:
        spec = spec_from_args(args, _slo(args))
        cfg = _config(args)
        out = Path(args.out) if args.out else default_sweep_out(cfg)
        outcome = run_sweep(cfg, spec, out, resume=args.resume, progress=None if args.quiet else sys.stderr)
    except (ArgError, SweepError, SimStartError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    from loadgen.run.sweep import SUMMARY_TXT

    sys.stderr.write((outcome.path / SUMMARY_TXT).read_text())
    print(outcome.path)
    return outcome.exit_code


def _compare(args: argparse.Namespace) -> int:
    from loadgen.analysis.compare import CompareError
    from loadgen.cli.compare import compare_cli

    try:
        return compare_cli(args, _slo(args))
    except CompareError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


def _schedule(args: argparse.Namespace) -> int:
    from loadgen.plan.limits import check_schedule
    from loadgen.plan.schedule import build, plan_records

    schedule = build(_config(args))
    check_schedule(schedule.prompt_tokens, schedule.max_tokens)
    records = plan_records(schedule)
    if args.out:
        out = Path(args.out)
        if out.suffix == ".parquet":
            import polars as pl

            pl.DataFrame(records, schema={"request_id": pl.String, "intended_ns": pl.Int64,
                                          "prompt_tokens": pl.Int64, "max_tokens": pl.Int64,
                                          "prefix_group": pl.Int64, "session": pl.Int64, "turn": pl.Int64,
                                          "after": pl.Int64, "think_ns": pl.Int64,
                                          "warmup": pl.Boolean}).write_parquet(out)
        elif out.suffix == ".jsonl":
            out.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))
        else:
            print(f"--out: {out}: must end in .jsonl or .parquet", file=sys.stderr)
            return 2
        print(out)
        return 0
    w = sys.stdout.buffer
    try:
        for r in records:
            w.write(orjson.dumps(r) + b"\n")
        w.flush()
    except BrokenPipeError:  # `loadgen schedule ... | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
    return 0
