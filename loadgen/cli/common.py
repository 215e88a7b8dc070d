"""What the subcommands share: the workload's config from a file and flags (run, schedule, sweep), the
--slo flag, the help epilog. Light imports only: `loadgen --help` must start fast."""
from __future__ import annotations

import argparse

from loadgen.config.options import values
from loadgen.errors import ConfigError, exit_table

SLO_HELP = ("service-level objectives, e.g. ttft=500ms,tpot=50ms[,e2e=2s,itl_p99=80ms]: adds attainment and "
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
WORKLOAD_HELP = ("workload file (TOML), or a shipped workload's name (`loadgen workloads` lists them); omitted: "
                 "the flags describe it (--rate, --prompt-tokens, --max-tokens, --requests or --duration)")


def workload_config(args: argparse.Namespace):
    """(RunConfig, ClientOptions) from the workload file and the flags: one ConfigError with every problem
    of the file, the flags, the client options and, with a trace, its bad rows."""
    # lazy: the config and plan modules are not needed by `--help` (a fast start)
    from loadgen.config import workload as config
    from loadgen.plan import traces
    from loadgen.plan.limits import check_config

    try:
        cfg, client = config.load_run(args.workload, values(args))
    except ConfigError as e:
        path = getattr(args, "trace", None)
        more: list[str] = []
        if path:
            try:
                traces.read(path, args.trace_format or "", skip_bad_rows=bool(args.skip_bad_rows))
            except traces.TraceError as t:
                more = t.problems
        raise ConfigError(e.problems + more) from None
    check_config(cfg)
    return cfg, client


def slo(args: argparse.Namespace) -> dict[str, float] | None:
    """--slo ttft=500ms,tpot=50ms -> {metric: bound ms}; a bad spec is a ConfigError (exit 2)."""
    if not getattr(args, "slo", None):
        return None
    from loadgen.config.slo import parse_slo

    try:
        return parse_slo(args.slo)
    except ValueError as e:
        raise ConfigError([f"--slo: {e}"]) from None
