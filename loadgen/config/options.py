"""Every option of a run, one row each: its workload key (TOML) and/or its flag, the RunConfig field it
sets, its kind (kinds.py: parser, check, unit), its default, its help. The row is the one owner of the
default: RunConfig's field defaults are DEFAULTS (workload.py), `--help` appends "(default X)" from it,
the self-check's limits read it, and a unit test holds docs/cli.md to it (tests/unit/test_options.py).
Adding an option = one row + the code that uses its value.

`key` is the workload key a flag overrides (`arrivals.rate`): its value is validated with the file's
keys and a bad value is reported under the flag's name. Rows with `key = None` are run options that no
workload file holds; rows with `flag = None` are keys only a file sets. `client` rows say how to talk to
the target (headers, TLS, --overwrite): config/client.py's ClientOptions takes them. `field` is the
RunConfig field (dotted for a part: `arrivals.rate_per_s`); `default` is written as a user writes it
("5ms") and `kind.parse` turns it into the field's value (5_000_000 ns).
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

from loadgen.config import kinds
from loadgen.config.kinds import (DURATION, ENDPOINTS, FLAG, FRACTION, PAUSE, POSITIVE, RATE, SLO, TEXT, WORDS, WORKERS,
                                  Kind)

RUN, SCHEDULE, SWEEP = "run", "schedule", "sweep"
BOTH = (RUN, SCHEDULE, SWEEP)        # the workload's own keys
RUNS = (RUN, SWEEP)                  # run options a sweep passes to every point
TARGETED = (RUN, SWEEP, "fit")       # how to talk to the target: every command that asks it
APIS = ("completions", "chat", "responses", "messages", "embeddings", "rerank")
# The event-stream APIs (OpenAI's /v1/responses, Anthropic's /v1/messages): OpenAI-compatible servers only
EVENT_APIS = ("responses", "messages")
# The pooling APIs (/v1/embeddings, /v1/rerank): one JSON answer, no generated token, so no TTFT/ITL/TPOT
# (docs/metrics.md); OpenAI-compatible servers only (config/pooling.py refuses what they cannot carry)
POOLING_APIS = ("embeddings", "rerank")
BACKENDS = ("openai", "ollama", "llamacpp")   # loadgen/client/backends/
TOKENIZERS = ("auto", "server", "approximate", "local")
TRACE_FORMATS = ("azure", "mooncake", "burstgpt", "jsonl")
OVER_CONTEXT = ("error", "clip", "drop")       # loadgen/plan/context.py


@dataclass(frozen=True)
class Option:
    flag: str | None
    help: str
    key: str | None = None           # workload key (a flag overrides it)
    field: str | None = None         # RunConfig field it sets (dotted: a part's field)
    kind: Kind = TEXT
    default: Any = None              # as a user writes it; None: no default (the file's, or absent)
    metavar: str | None = None
    commands: tuple[str, ...] = BOTH
    switch: bool = False             # a flag without a value (store_true)
    invert: bool = False             # a switch that turns the field off (--no-calibrate)
    repeat: bool = False             # may be given several times (a list)
    client: bool = False             # how to talk to the target (config/client.py), not RunConfig
    exclusive: str | None = None     # options sharing this name are mutually exclusive

    @property
    def dest(self) -> str:
        return (self.flag or "")[2:].replace("-", "_")

    @property
    def run_field(self) -> str:
        """The field of an option no workload key holds (a run or client option: the table gives each one)."""
        assert self.field is not None, f"{self.flag}: a run or client option names its field"
        return self.field

    @property
    def value(self) -> Any:
        """The field's default value (parsed: ns, a tuple, a bool)."""
        if self.switch and self.default is None:
            return self.invert
        return None if self.default is None else self.kind.parse(self.default)

    @property
    def shown_default(self) -> str | None:
        """The default as --help and docs/cli.md show it (switches: `off`)."""
        if self.switch:
            return "off"
        return None if self.default is None else str(self.default)


def takes_messages(api: str) -> bool:
    """The API sends a message list that the server renders through its chat template (every API but
    completions and the pooling APIs, whose input is raw text): prompts are counted as chat messages
    (plan/prompts.py, probe/server_tokenizer.py)."""
    return api not in ("completions", *POOLING_APIS)


def _o(flag, help, **kw) -> Option:
    return Option(flag, help, **kw)


OPTIONS = (
    _o("--model", "model name sent in every request (asked of the target's /v1/models when absent)",
       key="model", field="model", metavar="NAME"),
    _o("--api", "completions | chat | responses (OpenAI /v1/responses) | messages (Anthropic /v1/messages) | "
       "embeddings (/v1/embeddings) | rerank (/v1/rerank; [rerank] table)",
       key="api", field="api", kind=kinds.choice(APIS), default="completions",
       metavar="API"),
    _o("--backend", "server API family: openai | ollama | llamacpp", key="backend", field="backend",
       kind=kinds.choice(BACKENDS), default="openai", metavar="NAME"),
    _o("--rate", "arrival rate, e.g. 8/s", key="arrivals.rate", field="arrivals.rate_per_s",
       kind=kinds.custom("rate", "per_s"), metavar="RATE"),
    _o("--requests", "number of requests (with a [session] table: of conversations, each of several requests; "
       "the run says how many requests that plans); replaces the file's duration", key="run.requests",
       field="requests",
       kind=kinds.integer(1), metavar="N", exclusive="bound"),
    _o("--duration", "schedule length, e.g. 60s (replaces the file's requests)", key="run.duration",
       field="duration_ns", kind=DURATION, metavar="DURATION", exclusive="bound"),
    _o("--prompt-tokens", "prompt length: N or MIN..MAX (uniform)", key="prompt.tokens", field="prompt_tokens",
       kind=kinds.custom("lengths"), metavar="N"),
    _o("--max-tokens", "output tokens: N or MIN..MAX (uniform)", key="output.tokens", field="output_tokens",
       kind=kinds.custom("lengths"), metavar="N"),
    _o("--warmup-requests", "the first N requests are sent but left out of statistics",
       key="run.warmup_requests", field="warmup_requests", kind=kinds.integer(0), default=0, metavar="N"),
    _o("--seed", "seed of every random draw of the plan", key="seed", field="seed", kind=kinds.integer(0),
       default=0, metavar="N"),
    _o("--trace", "replay this trace file (replaces the workload's arrivals and lengths)", key="trace.file",
       field="trace.file", kind=kinds.custom("file"), metavar="FILE"),
    _o("--trace-format", "azure | mooncake | burstgpt | jsonl (sniffed when omitted)", key="trace.format",
       field="trace.format", kind=kinds.choice(TRACE_FORMATS), metavar="FORMAT"),
    _o("--time-scale", "trace replay speed: offsets x this (2 = half speed)", key="trace.time_scale",
       field="trace.time_scale", kind=POSITIVE, metavar="X"),
    _o("--skip-bad-rows", "drop bad trace rows and count them in the manifest instead of failing",
       key="trace.skip_bad_rows", field="trace.skip_bad_rows", kind=FLAG, switch=True),
    _o("--max-concurrency", "at most N requests in flight; later ones wait (recorded as slot_wait)",
       key="run.max_concurrency", field="max_concurrency", kind=kinds.integer(0), default=0, metavar="N",
       commands=RUNS),
    _o("--request-timeout", "cut a request off after this long, e.g. 30s", key="run.request_timeout",
       field="request_timeout_ns", kind=DURATION, default="120s", metavar="DURATION", commands=RUNS),
    _o(None, "after the last intended send, in-flight requests get this long", key="run.drain_timeout",
       field="drain_timeout_ns", kind=DURATION, default="30s", commands=()),
    _o("--max-send-lag-p99", "send-lag p99 above which the run is invalid whatever its latencies (the "
       "proportional rule, --max-lag-share, decides below it)", key="run.max_send_lag_p99",
       field="max_send_lag_p99_ns", kind=DURATION, default="50ms", metavar="DURATION", commands=RUNS),
    _o("--max-lag-share", "share of a reported TTFT/e2e percentile (p50, p99) the client's send lag may "
       "move it by before the run is invalid (or --lag-floor, whichever is larger)", key="run.max_lag_share",
       field="max_lag_share", kind=FRACTION, default=0.05, metavar="FRACTION", commands=RUNS),
    _o("--lag-floor", "a move of a reported percentile by the send lag up to this is tolerated whatever "
       "the percentile's size", key="run.lag_floor", field="lag_floor_ns", kind=DURATION, default="2ms",
       metavar="DURATION", commands=RUNS),
    _o("--max-error-rate", "share of the measured requests that may fail (HTTP errors, timeouts, resets, "
       "malformed streams, drops by --max-concurrency) before the run is invalid, e.g. 0.01 or 1%",
       key="run.max_error_rate", field="max_error_rate", kind=FRACTION, default=0.01, metavar="FRACTION",
       commands=RUNS),
    _o("--max-rate-deviation", "achieved vs offered rate (relative) beyond which the run is invalid",
       key="run.max_rate_deviation", field="max_rate_deviation", kind=POSITIVE, default=0.02,
       metavar="FRACTION", commands=RUNS),
    _o("--max-cv-deviation", "dispatch-gap CV vs the plan's (absolute) beyond which the run is invalid",
       key="run.max_cv_deviation", field="max_cv_deviation", kind=POSITIVE, default=0.1, metavar="X",
       commands=RUNS),
    _o("--concurrency", "closed loop: N virtual users, each sending when its previous reply ends, for "
       "--requests N in all or until --duration has passed (no request starts after it); the rate is ignored",
       key="run.concurrency", field="concurrency", kind=kinds.integer(0), default=0, metavar="N", commands=(RUN,)),
    _o("--think-time", "closed loop: a user's pause between a reply and its next request", key="run.think_time",
       field="think_ns", kind=PAUSE, default="0s", metavar="DURATION", commands=(RUN,)),
    _o("--max-user-rate", "closed loop bounded by --duration: each user's pool of requests, built before t0, "
       "holds duration x this many (fewer with a think time); a user faster than this on average uses its "
       "pool up before the deadline, which the run reports", key="run.max_user_rate",
       field="max_user_rate_per_s", kind=RATE, default="10/s", metavar="RATE", commands=(RUN,)),
    _o("--prompt-salt", "salt of the prompt texts (default: random per run, recorded in the manifest): the "
       "same salt and seed send the same texts, so a prefix cache hits; another salt keeps the lengths and "
       "times but not one shared token", key="prompt.salt", field="prompt_salt", kind=kinds.integer(0),
       metavar="N"),
    # the flag also takes a tokenizer.json's path: prompt.tokenizer = "local" with that tokenizer_file
    # (workload.py _tokenizer_flag; relative to the working directory, as --trace is)
    _o("--tokenizer", "how prompt lengths are counted: auto (the target's /tokenize, else approximate with a "
       "warning, the run invalid) | server (its /tokenize, else exit 2) | approximate (a word = a token, asked "
       "for: the run stays valid) | FILE (a local tokenizer.json)", key="prompt.tokenizer", field="tokenizer",
       kind=kinds.choice(TOKENIZERS), default="auto", metavar="auto|server|approximate|FILE"),
    # run options: no workload file holds them
    _o("--url", "server base URL; without it the built-in simulator is started", field="url",
       kind=kinds.custom("URL"), metavar="URL", commands=RUNS),
    _o("--out", "results folder (default results/NAME-TIMESTAMP)", field="out", kind=kinds.custom("folder"),
       metavar="DIR", commands=(RUN,)),
    _o("--repeat", "run the workload N times (the same seed, one after another) into --out/repeat-1..N, "
       "with each figure's across-run spread and t CI in --out/repeats.json (docs/results.md)", field="repeat",
       kind=kinds.integer(1, 100), default=1, metavar="N", commands=RUNS),
    _o("--sim-args", "flags for the built-in simulator, e.g. '--ttft 20ms' (split as a shell would)",
       field="sim_args", kind=WORDS, default="", metavar="ARGS", commands=RUNS),
    _o("--no-calibrate", "skip the idle-server probes; without server timings the report then cannot "
       "split TTFT into queue and prefill", field="calibrate", kind=FLAG, switch=True, invert=True,
       commands=RUNS),
    _o("--over-context", "requests whose prompt + max tokens exceed the target's context limit: error (exit 2, "
       "each named) | clip (shorten them) | drop (remove them from the plan); counted in the manifest",
       field="over_context", kind=kinds.choice(OVER_CONTEXT), default="error", metavar="error|clip|drop",
       commands=RUNS),
    _o("--scrape-metrics", "sample the server's /metrics during the run", field="scrape_metrics", kind=FLAG,
       switch=True, commands=RUNS),
    _o("--metrics-port", "serve the run's live figures for Prometheus at http://HOST:PORT/metrics (0: a free port, "
       "said on progress and recorded in the manifest); see docs/live-metrics.md", field="metrics_port",
       kind=kinds.integer(0, 65535), metavar="PORT", commands=RUNS),
    _o("--metrics-host", "the address --metrics-port listens on", field="metrics_host", kind=TEXT,
       default="127.0.0.1", metavar="HOST", commands=RUNS),
    _o("--scrape", "also sample this Prometheus endpoint during the run, on the run's clock (a DCGM or node "
       "exporter, e.g. http://gpu-host:9400/metrics; repeatable; a URL without a path gets /metrics): "
       "telemetry.parquet, GPU figures in the summary and the report", key="run.scrape", field="scrape",
       kind=ENDPOINTS, metavar="URL", repeat=True, commands=RUNS),
    _o("--workers", "split the schedule across N generator processes on this host (auto: by rate); "
       "see docs/scale-out.md", field="workers", kind=WORKERS, default=1, metavar="N|auto", commands=(RUN,)),
    _o("--ray", "run the workers as Ray actors on the cluster at ADDRESS (auto: the one `ray start` runs "
       "here); needs pip install 'loadgen[ray]'", field="ray", kind=kinds.custom("address"),
       metavar="auto|ADDRESS", commands=(RUN,)),
    _o("--scrape-interval", "scrape period", field="scrape_interval_ns", kind=DURATION, default="500ms",
       metavar="DURATION", commands=RUNS),
    _o("--slo", "service-level objectives, e.g. ttft=500ms,tpot=50ms[,ttfa=2s,e2e=2s,itl_p99=80ms]: attainment "
       "and goodput (requests/s meeting every SLO) in the summary; recorded in the manifest. METRIC=BOUND@CLASS "
       "(e.g. ttft=200ms@interactive) bounds one [[mix]] class's requests instead", field="slo",
       kind=SLO, metavar="SPEC", commands=RUNS),
    _o("--overwrite", "replace the run in a non-empty --out folder (kept until the new run has started)",
       field="overwrite", kind=FLAG, switch=True, commands=(RUN,), client=True),
    # how to talk to the target (config/client.py)
    _o("--header", "send this header with every request (repeatable; secret-looking values are redacted)",
       field="headers", kind=kinds.custom("'K: V'"), metavar="'K: V'", repeat=True, commands=TARGETED,
       client=True),
    _o("--insecure", "https: do not verify the server's certificate", field="insecure", kind=FLAG, switch=True,
       commands=TARGETED, client=True),
    _o("--ca-bundle", "https: verify the server against this CA file", field="ca_bundle",
       kind=kinds.custom("file"), metavar="FILE", commands=TARGETED, client=True),
)
BY_FLAG = {o.flag: o for o in OPTIONS if o.flag}
BY_KEY = {o.key: o for o in OPTIONS if o.key}
BY_FIELD = {o.field: o for o in OPTIONS if o.field and not o.client}
FLAG_KEYS = {o.flag: o.key for o in OPTIONS if o.flag and o.key}


def default(field: str) -> Any:
    """The default value of a RunConfig field (or a part's, dotted) as the table has it."""
    return BY_FIELD[field].value


def help_text(o: Option) -> str:
    shown = None if o.switch else o.shown_default
    # argparse formats help with %: a literal % in a row's help must be doubled
    return o.help.replace("%", "%%") + (f" (default {shown})" if shown not in (None, "") else "")


def add_options(parser: argparse.ArgumentParser, command: str) -> None:
    groups: dict[str, argparse._MutuallyExclusiveGroup] = {}
    for o in OPTIONS:
        if o.flag is None or command not in o.commands:
            continue
        target: Any = parser
        if o.exclusive:
            if o.exclusive not in groups:
                groups[o.exclusive] = parser.add_mutually_exclusive_group()
            target = groups[o.exclusive]
        # default None: "not given", so the file's value (or the row's default) applies (values())
        if o.switch:
            target.add_argument(o.flag, action="store_true", default=None, help=help_text(o))
        elif o.repeat:
            target.add_argument(o.flag, action="append", metavar=o.metavar, help=help_text(o))
        else:
            target.add_argument(o.flag, metavar=o.metavar, help=help_text(o))


def values(args: argparse.Namespace) -> dict[str, object]:
    """{flag: value} of the options of args.command (None = not given)."""
    return {o.flag: getattr(args, o.dest, None) for o in OPTIONS if o.flag and args.command in o.commands}
