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

EXAMPLES = """\
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


def _workload_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("workload", help="workload file (TOML), e.g. workloads/quickstart.toml")
    p.add_argument("--model")
    p.add_argument("--api", help="completions | chat")
    p.add_argument("--backend", help="server API family: openai | ollama | llamacpp (default openai)")
    p.add_argument("--rate", help="arrival rate, e.g. 8/s")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--requests", help="number of requests")
    g.add_argument("--duration", help="schedule length, e.g. 60s")
    p.add_argument("--prompt-tokens", help="N or MIN..MAX (uniform)")
    p.add_argument("--max-tokens", help="output tokens: N or MIN..MAX (uniform)")
    p.add_argument("--warmup-requests", help="first N requests are left out of statistics")
    p.add_argument("--seed")
    p.add_argument("--trace", help="replay this trace file (replaces the workload's arrivals and lengths)")
    p.add_argument("--trace-format", help="azure | mooncake | burstgpt | jsonl (sniffed when omitted)")
    p.add_argument("--time-scale", help="trace replay speed: offsets x this (2 = half speed)")
    p.add_argument("--skip-bad-rows", action="store_true", default=None,
                   help="drop bad trace rows and count them in the manifest instead of failing")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="loadgen", description="Open-loop load generator for LLM inference servers.",
                     epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    run = sub.add_parser("run", help="offer a workload to a server and record every request",
                         epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    _workload_flags(run)
    run.add_argument("--url", help="server base URL; without it the built-in simulator is started")
    run.add_argument("--out", help="results folder (default results/NAME-TIMESTAMP)")
    run.add_argument("--max-concurrency", help="at most N requests in flight; later ones wait (recorded)")
    run.add_argument("--header", action="append", metavar="'K: V'",
                     help="send this header with every request (repeatable; secret-looking values are redacted)")
    run.add_argument("--insecure", action="store_true", help="https: do not verify the server's certificate")
    run.add_argument("--ca-bundle", metavar="FILE", help="https: verify the server against this CA file")
    run.add_argument("--request-timeout", help="cut a request off after this long, e.g. 30s (default 120s)")
    run.add_argument("--overwrite", action="store_true",
                     help="replace the run in a non-empty --out folder (kept until the new run has started)")
    run.add_argument("--sim-args", default="", help="flags for the built-in simulator, e.g. '--ttft 20ms' "
                                                   "(split like a shell would)")
    run.add_argument("--max-send-lag-p99", help="send-lag p99 above which the run is invalid (default 5ms)")
    run.add_argument("--quiet", action="store_true", help="no progress line")
    # --- explain (issue 6) ---
    run.add_argument("--no-calibrate", action="store_true",
                     help="skip the idle-server probes; without server timings the report then cannot "
                          "split TTFT into queue and prefill")
    run.add_argument("--scrape-metrics", action="store_true", help="sample the server's /metrics during the run")
    run.add_argument("--scrape-interval", default="500ms", help="scrape period (default 500ms)")
    # --- end explain ---
    rep = sub.add_parser("report", help="summarize a results folder",
                         epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    rep.add_argument("run_dir")
    rep.add_argument("--format", choices=("text", "json"), default="text")
    rep.add_argument("--out", help="write the report to this file instead of stdout")
    # --- explain (issue 6) ---
    rep.add_argument("--device", help="device name for the roofline (see loadgen/data/devices.json), e.g. h100-sxm")
    rep.add_argument("--bandwidth", help="memory bandwidth instead of --device, e.g. 3350GB/s")
    rep.add_argument("--model-config", help="the model's config.json (Hugging Face layout) for the roofline")
    rep.add_argument("--window", default="5s", help="time window of the decomposition over the run (default 5s)")
    # --- end explain ---
    sch = sub.add_parser("schedule", help="dry run: print the planned requests as JSON lines",
                         epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    _workload_flags(sch)
    sch.add_argument("--out", help="write the plan to FILE.jsonl or FILE.parquet instead of stdout")
    exp = sub.add_parser("export", help="per-request rows of a results folder as CSV or JSON lines")
    exp.add_argument("run_dir")
    exp.add_argument("--format", choices=("csv", "jsonl"), default="csv")
    exp.add_argument("--out", help="write to this file instead of stdout")
    sub.add_parser("sim", help="the built-in simulated server (see `loadgen sim --help`)", add_help=False)
    return parser


def _sim_args(text: str) -> tuple[str, ...]:
    import shlex

    from loadgen.config import ConfigError

    try:
        return tuple(shlex.split(text))
    except ValueError as e:
        raise ConfigError([f"--sim-args: {e}"]) from None


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
    from loadgen import config

    # Every problem in one pass: the workload and flags, --scrape-interval, and (when any of those is
    # wrong) the trace's rows too.
    problems: list[str] = []
    interval_ns = None
    if getattr(args, "scrape_metrics", None) is not None:
        interval_ns = _scrape_interval_ns(args.scrape_interval, problems)
    overrides = {flag: getattr(args, flag[2:].replace("-", "_"), None) for flag in config.FLAG_KEYS}
    cfg = None
    try:
        cfg = config.load(args.workload, overrides, url=getattr(args, "url", None),
                          out=getattr(args, "out", None) if args.command == "run" else None,
                          sim_args=_sim_args(getattr(args, "sim_args", "")))
    except config.ConfigError as e:
        problems[:0] = e.problems
    if problems:
        raise config.ConfigError(problems + _trace_problems(cfg, args))
    # --- explain (issue 6): run options that are not part of a workload ---
    if interval_ns is not None:
        cfg = config.with_overrides(cfg, calibrate=not args.no_calibrate, scrape_metrics=args.scrape_metrics,
                                    scrape_interval_ns=interval_ns)
    # --- end explain ---
    from loadgen.limits import check_config

    check_config(cfg)
    return cfg


def _scrape_interval_ns(text: str, problems: list[str]) -> int | None:
    from loadgen.units import parse_duration_ns

    try:
        interval_ns = parse_duration_ns(text)
    except ValueError as e:
        problems.append(f"--scrape-interval: {e}")
        return None
    if interval_ns <= 0:
        problems.append(f"--scrape-interval: must be > 0, got {text!r}")
    return interval_ns


def _trace_problems(cfg, args: argparse.Namespace) -> list[str]:
    from loadgen import traces

    spec = cfg.trace if cfg is not None else None
    path = spec.file if spec is not None else getattr(args, "trace", None)
    if not path:
        return []
    try:
        traces.read(path, (spec.format if spec else args.trace_format) or "",
                    skip_bad_rows=bool(spec.skip_bad_rows if spec else args.skip_bad_rows))
    except traces.TraceError as e:
        return e.problems
    return []


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "sim":
        from loadgen.sim.cli import main as sim_main

        return sim_main(argv[1:])
    args = build_parser().parse_args(_glue_sim_args(argv))
    from loadgen.config import ConfigError
    from loadgen.results import ResultsError
    from loadgen.datasets import DatasetError
    from loadgen.prompts import TokenizerError
    from loadgen.traces import TraceError

    try:
        if args.command == "run":
            return _run(args)
        if args.command == "report":
            return _report(args)
        if args.command == "schedule":
            return _schedule(args)
        if args.command == "export":
            from loadgen.export import export

            try:
                export(args.run_dir, args.format, args.out)
            except BrokenPipeError:  # `loadgen export RUN | head`
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 0
    except (ConfigError, TraceError, DatasetError) as e:  # each carries every problem found
        print("invalid input:", *(f"  {p}" for p in e.problems), sep="\n", file=sys.stderr)
        return 2
    except (TokenizerError, ResultsError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    return 2


def _run(args: argparse.Namespace) -> int:
    from loadgen.execute import run_workload
    from loadgen.sim.process import SimStartError

    from loadgen.client_options import ClientOptions

    cfg = _config(args)
    client = ClientOptions.from_flags(args.header, args.insecure, args.ca_bundle, args.overwrite)
    try:
        outcome = run_workload(cfg, progress=None if args.quiet else sys.stderr, client=client)
    except SimStartError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.quiet:  # without progress lines, why a run failed must still be said
        for reason in outcome.invalid_reasons:
            print(f"INVALID RUN: {reason}", file=sys.stderr)
    print(outcome.path)
    return outcome.exit_code


def _report(args: argparse.Namespace) -> int:
    from loadgen.analysis.summary import summarize
    from loadgen.report import to_json, to_text
    from loadgen.results import read_run, write_json

    run = read_run(args.run_dir)
    summary = summarize(run)
    # --- explain (issue 6): decomposition, diagnosis, roofline; decomposition.parquet ---
    from loadgen.analysis.explain import ExplainOptions, explain
    from loadgen.analysis.roofline import RooflineError
    from loadgen.results import write_parquet
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
    except (RooflineError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    summary.update(section)
    write_parquet(Path(args.run_dir) / "decomposition.parquet", decomposition)
    # --- end explain ---
    write_json(Path(args.run_dir) / "summary.json", summary)
    text = to_json(summary) if args.format == "json" else to_text(summary)
    if args.out:
        Path(args.out).write_text(text)
    else:
        sys.stdout.write(text)
    return 0


def _schedule(args: argparse.Namespace) -> int:
    from loadgen.schedule import build, plan_records

    from loadgen.limits import check_schedule

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
