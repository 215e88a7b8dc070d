"""The command-line options of `run` and `schedule`, in one table: each flag's help, metavar, the commands
that take it, and where its value goes. cli.py builds the parsers from it and config.load() applies the
values, so a flag is added in one place.

`key` is the workload key a flag overrides (`arrivals.rate`): its value is validated with the file's
keys and a bad value is reported under the flag's name. Options with `key = None` are run options that no
workload file holds (`field` names the RunConfig field); config.load() validates them too, so every
problem is reported at once. `client` options say how to talk to the target (headers, TLS, --overwrite):
client_options.ClientOptions takes them.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass

RUN, SCHEDULE, SWEEP = "run", "schedule", "sweep"
BOTH = (RUN, SCHEDULE, SWEEP)        # the workload's own keys
RUNS = (RUN, SWEEP)                  # run options a sweep passes to every point


@dataclass(frozen=True)
class Option:
    flag: str
    help: str
    key: str | None = None           # workload key it overrides
    field: str | None = None         # RunConfig field of a run option (key is None)
    metavar: str | None = None
    commands: tuple[str, ...] = BOTH
    switch: bool = False             # a flag without a value (store_true)
    repeat: bool = False             # may be given several times (a list)
    client: bool = False             # how to talk to the target (client_options.ClientOptions), not RunConfig
    exclusive: str | None = None     # options sharing this name are mutually exclusive
    default: str | None = None

    @property
    def dest(self) -> str:
        return self.flag[2:].replace("-", "_")


OPTIONS = (
    Option("--model", "model name sent in every request", key="model", metavar="NAME"),
    Option("--api", "completions | chat", key="api", metavar="API"),
    Option("--backend", "server API family: openai | ollama | llamacpp (default openai)", key="backend",
           metavar="NAME"),
    Option("--rate", "arrival rate, e.g. 8/s", key="arrivals.rate", metavar="RATE"),
    Option("--requests", "number of requests (replaces the file's duration)", key="run.requests", metavar="N",
           exclusive="bound"),
    Option("--duration", "schedule length, e.g. 60s (replaces the file's requests)", key="run.duration",
           metavar="DURATION", exclusive="bound"),
    Option("--prompt-tokens", "prompt length: N or MIN..MAX (uniform)", key="prompt.tokens", metavar="N"),
    Option("--max-tokens", "output tokens: N or MIN..MAX (uniform)", key="output.tokens", metavar="N"),
    Option("--warmup-requests", "the first N requests are sent but left out of statistics",
           key="run.warmup_requests", metavar="N"),
    Option("--seed", "seed of every random draw of the plan", key="seed", metavar="N"),
    Option("--trace", "replay this trace file (replaces the workload's arrivals and lengths)", key="trace.file",
           metavar="FILE"),
    Option("--trace-format", "azure | mooncake | burstgpt | jsonl (sniffed when omitted)", key="trace.format",
           metavar="FORMAT"),
    Option("--time-scale", "trace replay speed: offsets x this (2 = half speed)", key="trace.time_scale",
           metavar="X"),
    Option("--skip-bad-rows", "drop bad trace rows and count them in the manifest instead of failing",
           key="trace.skip_bad_rows", switch=True),
    Option("--max-concurrency", "at most N requests in flight; later ones wait (recorded as slot_wait)",
           key="run.max_concurrency", metavar="N", commands=RUNS),
    Option("--request-timeout", "cut a request off after this long, e.g. 30s (default 120s)",
           key="run.request_timeout", metavar="DURATION", commands=RUNS),
    Option("--max-send-lag-p99", "send-lag p99 above which the run is invalid (default 5ms)",
           key="run.max_send_lag_p99", metavar="DURATION", commands=RUNS),
    Option("--max-rate-deviation", "achieved vs offered rate (relative) beyond which the run is invalid "
           "(default 0.02)", key="run.max_rate_deviation", metavar="FRACTION", commands=RUNS),
    Option("--max-cv-deviation", "dispatch-gap CV vs the plan's (absolute) beyond which the run is invalid "
           "(default 0.1)", key="run.max_cv_deviation", metavar="X", commands=RUNS),
    Option("--concurrency", "closed loop: N virtual users, each sending when its previous reply ends (needs "
           "--requests; the rate is ignored)", key="run.concurrency", metavar="N", commands=(RUN,)),
    Option("--think-time", "closed loop: a user's pause between a reply and its next request", key="run.think_time",
           metavar="DURATION", commands=(RUN,)),
    # run options: no workload file holds them
    Option("--url", "server base URL; without it the built-in simulator is started", field="url",
           metavar="URL", commands=RUNS),
    Option("--out", "results folder (default results/NAME-TIMESTAMP)", field="out", metavar="DIR",
           commands=(RUN,)),
    Option("--sim-args", "flags for the built-in simulator, e.g. '--ttft 20ms' (split as a shell would)",
           field="sim_args", metavar="ARGS", commands=RUNS),
    Option("--no-calibrate", "skip the idle-server probes; without server timings the report then cannot "
           "split TTFT into queue and prefill", field="calibrate", switch=True, commands=RUNS),
    Option("--scrape-metrics", "sample the server's /metrics during the run", field="scrape_metrics",
           switch=True, commands=RUNS),
    Option("--workers", "split the schedule across N generator processes on this host (auto: by rate); "
           "see docs/scale-out.md", field="workers", metavar="N|auto", commands=(RUN,)),
    Option("--ray", "run the workers as Ray actors on the cluster at ADDRESS (auto: the one `ray start` runs "
           "here); needs pip install 'loadgen[ray]'", field="ray", metavar="auto|ADDRESS", commands=(RUN,)),
    Option("--scrape-interval", "scrape period (default 500ms)", field="scrape_interval_ns", metavar="DURATION",
           commands=RUNS),
    Option("--slo", "service-level objectives, e.g. ttft=500ms,tpot=50ms[,e2e=2s,itl_p99=80ms]: attainment "
           "and goodput (requests/s meeting every SLO) in the summary; recorded in the manifest", field="slo",
           metavar="SPEC", commands=RUNS),
    Option("--overwrite", "replace the run in a non-empty --out folder (kept until the new run has started)",
           field="overwrite", switch=True, commands=(RUN,), client=True),
    # how to talk to the target (client_options.py)
    Option("--header", "send this header with every request (repeatable; secret-looking values are redacted)",
           field="headers", metavar="'K: V'", repeat=True, commands=(RUN,), client=True),
    Option("--insecure", "https: do not verify the server's certificate", field="insecure", switch=True,
           commands=(RUN,), client=True),
    Option("--ca-bundle", "https: verify the server against this CA file", field="ca_bundle", metavar="FILE",
           commands=(RUN,), client=True),
)
BY_FLAG = {o.flag: o for o in OPTIONS}
FLAG_KEYS = {o.flag: o.key for o in OPTIONS if o.key}


def add_options(parser: argparse.ArgumentParser, command: str) -> None:
    groups: dict[str, argparse._MutuallyExclusiveGroup] = {}
    for o in OPTIONS:
        if command not in o.commands:
            continue
        target = parser
        if o.exclusive:
            if o.exclusive not in groups:
                groups[o.exclusive] = parser.add_mutually_exclusive_group()
            target = groups[o.exclusive]
        if o.switch:
            target.add_argument(o.flag, action="store_true", default=None, help=o.help)
        elif o.repeat:
            target.add_argument(o.flag, action="append", metavar=o.metavar, help=o.help)
        else:
            target.add_argument(o.flag, metavar=o.metavar, help=o.help, default=o.default)


def values(args: argparse.Namespace) -> dict[str, object]:
    """{flag: value} of the options of args.command (None = not given)."""
    return {o.flag: getattr(args, o.dest, None) for o in OPTIONS if args.command in o.commands}
