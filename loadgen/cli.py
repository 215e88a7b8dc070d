"""Thin command line: parse flags into one frozen RunConfig, call the library.

Data goes to stdout, logs and progress to stderr. Exit codes: 0 ok; 2 usage or invalid input; 3 run
invalid (the generator could not keep the schedule); 130 interrupted (results still written).
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import orjson

from loadgen import __version__
from loadgen.options import add_options, values

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
"""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # usage errors exit 2 with one clear line (argparse's own code)
        self.print_usage(sys.stderr)
        self.exit(2, f"{self.prog}: error: {message}\n")


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
    from loadgen.twin_cli import add_parsers

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


def _config(args: argparse.Namespace):
    from loadgen import config, traces
    from loadgen.limits import check_config

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
        if args.command in ("fit", "predict"):
            from loadgen.twin_cli import fit_command, predict_command

            return (fit_command if args.command == "fit" else predict_command)(args)
        if args.command == "export":
            from loadgen.export import export

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
    from loadgen.client_options import ClientOptions
    from loadgen.execute import run_workload

    cfg = _config(args)
    client = ClientOptions.from_flags(args.header, args.insecure, args.ca_bundle, args.overwrite)
    outcome = run_workload(cfg, progress=None if args.quiet else sys.stderr, client=client)
    if args.quiet:  # without progress lines, why a run failed must still be said
        for reason in outcome.invalid_reasons:
            print(f"INVALID RUN: {reason}", file=sys.stderr)
    print(outcome.path)
    return outcome.exit_code


def _report(args: argparse.Namespace) -> int:
    from loadgen.analysis.summary import summarize
    from loadgen.report import to_json, to_text
    from loadgen.results import read_run

    if args.format in ("html", "md"):  # a sweep's or a comparison's page
        from loadgen.report.pages import render_sweep_or_compare

        page = render_sweep_or_compare(args.run_dir, args.format)
        if page is not None:
            Path(args.out).write_text(page) if args.out else sys.stdout.write(page)
            return 0
    run = read_run(args.run_dir)
    summary = summarize(run)
    # decomposition, diagnosis, roofline; decomposition.parquet
    from loadgen.analysis.explain import ExplainOptions, explain
    from loadgen.units import parse_duration_ns

    if bool(args.device or args.bandwidth) != bool(args.model_config):
        print("error: the roofline needs --model-config and one of --device / --bandwidth", file=sys.stderr)
        return 2
    try:
        try:
            window_ns = parse_duration_ns(args.window)
        except ValueError as e:
            raise ValueError(f"--window: {e}") from None
        opts = ExplainOptions(args.device, args.bandwidth, args.model_config, window_ns)
        section, decomposition = explain(run, opts)
    except ValueError as e:  # RooflineError is one
        print(f"error: {e}", file=sys.stderr)
        return 2
    summary.update(section)
    run.write_decomposition(decomposition)
    summary.setdefault("config", run.manifest.get("config"))  # the resolved config, shown by every format
    run.write_summary(summary)
    text = to_json(summary) if args.format == "json" else to_text(summary)
    if args.format in ("html", "md"):
        from loadgen.report.pages import render_run_page

        text = render_run_page(args.format, summary, run, decomposition)
    if args.out:
        Path(args.out).write_text(text)
    else:
        sys.stdout.write(text)
    return 0


def _schedule(args: argparse.Namespace) -> int:
    from loadgen.limits import check_schedule
    from loadgen.schedule import build, plan_records

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
