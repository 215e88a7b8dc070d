"""Thin command line: parse flags into one frozen RunConfig, call the library.

Data goes to stdout, logs and progress to stderr. Exit codes: 0 ok; 2 usage or invalid input; 3 run
invalid (the generator could not keep the schedule); 4 a `compare --fail-if` rule held; 130 interrupted
(results still written).
"""
from __future__ import annotations

import argparse
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
  loadgen sim --mode fixed --ttft 50ms --itl 10ms --port 0
  loadgen run workloads/quickstart.toml --concurrency 8 --requests 200     # closed loop: 8 users
  loadgen sweep workloads/quickstart.toml --start 1/s --refine 3             # to the saturation knee
  loadgen compare results/a results/b --fail-if "p99 ttft > +10%"
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


SLO_HELP = ("service-level objectives, e.g. ttft=500ms,tpot=50ms[,e2e=2s,itl_p99=80ms]: adds attainment and "
            "goodput (requests/s meeting every SLO) to the summary")


def _loop_flags(p: argparse.ArgumentParser) -> None:
    # issue 10: closed loop and SLOs (workload keys run.concurrency / run.think_time)
    p.add_argument("--concurrency", help="closed loop: N virtual users, each sending when its previous reply "
                                         "ends (needs --requests; the rate is ignored)")
    p.add_argument("--think-time", help="closed loop: a user's pause between a reply and its next request")
    p.add_argument("--slo", help=SLO_HELP + "; recorded in the manifest for `loadgen report`")


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
    run.add_argument("--sim-args", default="", help="flags for the built-in simulator, e.g. '--ttft 20ms'")
    run.add_argument("--max-send-lag-p99", help="send-lag p99 above which the run is invalid (default 5ms)")
    run.add_argument("--quiet", action="store_true", help="no progress line")
    # --- explain (issue 6) ---
    run.add_argument("--no-calibrate", action="store_true",
                     help="skip the idle-server probes; without server timings the report then cannot "
                          "split TTFT into queue and prefill")
    run.add_argument("--scrape-metrics", action="store_true", help="sample the server's /metrics during the run")
    run.add_argument("--scrape-interval", default="500ms", help="scrape period (default 500ms)")
    # --- end explain ---
    _loop_flags(run)
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
    rep.add_argument("--slo", help=SLO_HELP)
    sch = sub.add_parser("schedule", help="dry run: print the planned requests as JSON lines",
                         epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    _workload_flags(sch)
    sch.add_argument("--out", help="write the plan to FILE.jsonl or FILE.parquet instead of stdout")
    sub.add_parser("sim", help="the built-in simulated server (see `loadgen sim --help`)", add_help=False)
    _sweep_and_compare_parsers(sub, run)  # issue 10
    return parser


def _sweep_and_compare_parsers(sub, run: argparse.ArgumentParser) -> None:
    sw = sub.add_parser("sweep", help="run a workload at a series of rates: the saturation knee, max goodput",
                        description="One results folder per rate, a sweep manifest and summary "
                                    "(docs/sweep-and-compare.md).", epilog=SWEEP_EXAMPLES,
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    _workload_flags(sw)
    # The target and run options are run's own flags (same actions, so they cannot drift apart).
    for action in run._actions:
        if set(action.option_strings) & SWEEP_SHARED:
            sw._add_action(action)
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


SWEEP_SHARED = {"--url", "--sim-args", "--max-concurrency", "--max-send-lag-p99", "--quiet", "--no-calibrate",
                "--scrape-metrics", "--scrape-interval", "--slo"}
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
    from loadgen import config

    overrides = {flag: getattr(args, flag[2:].replace("-", "_"), None) for flag in config.FLAG_KEYS}
    cfg = config.load(args.workload, overrides, url=getattr(args, "url", None),
                      out=getattr(args, "out", None) if args.command == "run" else None,
                      sim_args=tuple(getattr(args, "sim_args", "").split()))
    # --- explain (issue 6): run options that are not part of a workload ---
    if getattr(args, "scrape_metrics", None) is not None:
        from loadgen.units import parse_duration_ns

        try:
            interval_ns = parse_duration_ns(args.scrape_interval)
        except ValueError as e:
            raise config.ConfigError([f"--scrape-interval: {e}"]) from None
        if interval_ns <= 0:
            raise config.ConfigError([f"--scrape-interval: must be > 0, got {args.scrape_interval!r}"])
        cfg = config.with_overrides(cfg, calibrate=not args.no_calibrate, scrape_metrics=args.scrape_metrics,
                                    scrape_interval_ns=interval_ns)
    # --- end explain ---
    slo = _slo(args)  # issue 10
    if slo:
        cfg = config.with_overrides(cfg, slo=tuple(slo.items()))
    return cfg


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "sim":
        from loadgen.sim.cli import main as sim_main

        return sim_main(argv[1:])
    args = build_parser().parse_args(argv)
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
        if args.command == "sweep":
            return _sweep(args)
        if args.command == "compare":
            return _compare(args)
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

    cfg = _config(args)
    try:
        outcome = run_workload(cfg, progress=None if args.quiet else sys.stderr)
    except SimStartError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(outcome.path)
    return outcome.exit_code


def _report(args: argparse.Namespace) -> int:
    from loadgen.analysis.explain import ExplainOptions
    from loadgen.analysis.report_summary import build
    from loadgen.analysis.roofline import RooflineError
    from loadgen.report import to_json, to_text
    from loadgen.units import parse_duration_ns

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
        summary = build(args.run_dir, opts, slo)  # summary, explanation, goodput; writes summary.json
    except (RooflineError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    text = to_json(summary) if args.format == "json" else to_text(summary)
    if args.out:
        Path(args.out).write_text(text)
    else:
        sys.stdout.write(text)
    return 0


def _slo(args: argparse.Namespace) -> dict[str, float] | None:
    # issue 10: --slo ttft=500ms,tpot=50ms -> {metric: bound ms}; a bad spec is a ConfigError (exit 2)
    if not getattr(args, "slo", None):
        return None
    from loadgen.analysis.goodput import parse_slo
    from loadgen.config import ConfigError

    try:
        return parse_slo(args.slo)
    except ValueError as e:
        raise ConfigError([f"--slo: {e}"]) from None


def _sweep(args: argparse.Namespace) -> int:
    from loadgen.sim.process import SimStartError
    from loadgen.sweep import SweepError, default_sweep_out, run_sweep
    from loadgen.sweep_args import ArgError, spec_from_args

    try:
        spec = spec_from_args(args, _slo(args))
        cfg = _config(args)
        out = Path(args.out) if args.out else default_sweep_out(cfg)
        outcome = run_sweep(cfg, spec, out, resume=args.resume, progress=None if args.quiet else sys.stderr)
    except (ArgError, SweepError, SimStartError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    from loadgen.sweep import SUMMARY_TXT

    sys.stderr.write((outcome.path / SUMMARY_TXT).read_text())
    print(outcome.path)
    return outcome.exit_code


def _compare(args: argparse.Namespace) -> int:
    from loadgen.compare import CompareError, compare_cli

    try:
        return compare_cli(args, _slo(args))
    except CompareError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


def _schedule(args: argparse.Namespace) -> int:
    from loadgen.schedule import build, plan_records

    records = plan_records(build(_config(args)))
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
    for r in records:
        w.write(orjson.dumps(r) + b"\n")
    return 0
