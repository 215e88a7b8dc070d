"""Workload files (TOML) and flags -> the one frozen RunConfig a run is described by (runconfig.py).

A workload file (see workloads/quickstart.toml):

    name = "quickstart"            # optional, defaults to the file's stem
    model = "NAME"                 # optional: the one the target serves (/v1/models) when absent
    api = "chat"                   # completions | chat | responses | messages | embeddings | rerank
    backend = "openai"             # openai | ollama | llamacpp (the server's API family)
    seed = 42

    [arrivals]
    process = "poisson"            # poisson | constant | gamma
    rate = "8/s"                   # or "inf": every request due at t0, paced only by max_concurrency
    burstiness = 1.0               # gamma only: CV of the gaps = 1/sqrt(burstiness)

    [run]
    requests = 200                 # or duration = "30s" (exactly one of them)
    warmup_requests = 0            # the first N requests are sent but left out of statistics
    max_concurrency = 0            # 0 = unlimited (pure open loop)
    request_timeout = "120s"
    drain_timeout = "30s"          # after the last intended send, in-flight requests get this long
    max_send_lag_p99 = "50ms"      # above it the run is invalid whatever its latencies (selfcheck.py)
    max_lag_share = 0.05           # the send lag may move a TTFT/e2e p50/p99 by this share of it
    lag_floor = "2ms"              # ... or by this much, whichever is larger; beyond, the run is invalid
    max_error_rate = 0.01          # failed (and dropped) share of the measured requests; beyond, invalid
    max_rate_deviation = 0.02      # achieved vs offered rate, relative; beyond it the run is invalid
    max_cv_deviation = 0.1         # dispatch-gap CV vs the plan's, absolute; beyond it the run is invalid
    concurrency = 0                # > 0: closed loop of N users (bounded by requests or duration; arrivals ignored)
    think_time = "0s"              # closed loop: each user's pause between a reply and its next request
    max_user_rate = "10/s"         # closed loop with duration: each user's pool holds duration x this (plan/pool.py)

    [prompt]
    tokens = 128                   # or { dist = "uniform", min = 64, max = 512 }

    [output]
    tokens = 64                    # sent as max_tokens, same forms as prompt.tokens

    [request]
    api_key_env = "OPENAI_API_KEY" # the key is read from this variable, never written anywhere
    extra_body = { ignore_eos = true }
    tools = "tools.json"           # OpenAI tool definitions (or { generate = 4, parameters = 6 }); chat only
    tool_choice = "required"       # auto | required | none | a declared function's name
    response_format = "schema.json"  # a JSON schema sent as response_format (or { properties = 8 })
                                   # every reply is judged: valid JSON / valid calls (config/structured.py)

Production-shaped workloads add:

    [arrivals]
    process = "ramp"               # also: stages, trace (implied by a [trace] table)
    rate_from = "1/s"              # ramp: the rate at t=0; `rate` is the rate reached after `ramp`
    ramp = "60s"
    base = "poisson"               # ramp/stages: poisson or constant spacing under the varying rate
    stages = [ { duration = "30s", rate = "2/s" }, { duration = "60s", rate = "2/s", to = "20/s" } ]

    [trace]                        # replay: arrivals (and by default lengths) come from a trace file
    file = "traces/burstgpt_synthetic.csv"   # relative to the workload file
    format = "burstgpt"            # azure | mooncake | burstgpt | jsonl; sniffed when omitted
    time_scale = 1.0               # or rate = "5/s": a target mean rate, same gap shape (see arrivals.replay)
    start = "0s"                   # skip the trace's first seconds
    limit = 1000                   # at most this many requests
    skip_bad_rows = false          # true: drop bad rows and count them in the manifest
    lengths = true                 # false: keep [prompt]/[output] lengths, take only the times

    [prompt]                       # tokens: any form in loadgen/config/lengths.py (normal, lognormal, mixture...)
    tokenizer = "auto"             # auto | server | approximate | local (with tokenizer_file)
    tokenizer_file = "tokenizer.json"
    dataset = "data/sharegpt.json" # ShareGPT conversations as the prompt text source
    salt = 7                       # the texts' salt (default: random per run, so no run warms another's cache)

    [[mix]]                        # joint classes: weight, prompt and output lengths drawn together
    name = "interactive"           # the rows' `class` (default mix<i>); unique; no spaces, '@', ',', '=', '.'
    weight = 0.7
    prompt = { dist = "lognormal", median = 150, sigma = 0.6 }
    output = { dist = "normal", mean = 200, sd = 60, min = 16, max = 512 }
    model = "sql-lora"             # optional: the class's own model (e.g. a LoRA adapter), checked against
                                   # /v1/models before the run; default: the workload's model
    priority = 0                   # optional: an int64 sent as the body's `priority` (vLLM serves lower
                                   # first under --scheduling-policy priority); only the openai backend
                                   # sends one (ollama/llamacpp: exit 2); default: none sent

    [prefix]                       # shared system prompts
    tokens = 1000                  # K: the shared prefix's length (part of each prompt's token count;
                                   # with [session], added to each turn's user message instead)
    groups = 4                     # how many distinct prefixes
    fraction = 0.8                 # share of requests that carry one (the rest carry none)

    [session]                      # multi-turn: each arrival starts a conversation; [prompt] tokens
                                   # is then each turn's new user message (prefix and history on top)
    turns = { dist = "uniform", min = 2, max = 6 }   # any length form; >= 1 (requests, tool rounds included)
    think_ms = { dist = "lognormal", median = 3000, sigma = 0.5 }  # think time after each reply
    max_tool_rounds = 3            # agentic (optional; [request] tools, chat): a reply's tool calls are
                                   # answered by the next request, at most this many in a row (1..64)
    tool_latency_ms = 300          # the tool's latency before that request (any length form; default 200)
    tool_result_tokens = 128       # the tool results' tokens (any length form; default 64)

    [abandon]                      # users who give up: a share of requests cut off (outcome abandoned)
    share = 0.2                    # each request abandoned with this probability (drawn from the seed)
    after_ms = { dist = "uniform", min = 500, max = 3000 }   # ms after its dispatch, or instead:
    # after_tokens = 16            # once this many output tokens' events have arrived

    [image]                        # chat requests with generated PNG images (plan/images.py)
    share = 0.5                    # each request carries images with this probability
    count = 1                      # images per request, width and height in pixels: any length form
    width = 448
    height = 448
    fill = "noise"                 # noise | flat

    [rerank]                       # api = "rerank" only (config/pooling.py): each request's documents
    documents = 8                  # documents per request (any length form; default 8)
    document_tokens = { dist = "uniform", min = 32, max = 256 }   # each document's length in tokens

validate() runs every section's validation (sections.py, parts.py) and the client options' (client.py)
and raises one ConfigError with every problem, each naming the file and key (or the CLI flag that set
it). A field changed after loading goes through with_overrides(), which validates it again.
"""
from __future__ import annotations

import os
from dataclasses import fields, replace
from pathlib import Path
from types import UnionType
from typing import Any, Union, get_args, get_origin, get_type_hints
import tomllib

from loadgen.errors import ConfigError
from loadgen.config import parts, pooling, sections, shipped, structured
from loadgen.config.client import ClientOptions, client_options
from loadgen.config.credentials import redact_url, url_problems
from loadgen.config.kinds import is_file
from loadgen.config.lengths import Lengths, problems as lengths_problems
from loadgen.config.options import BACKENDS, BY_FIELD, BY_FLAG, FLAG_KEYS, POOLING_APIS, TOKENIZERS
from loadgen.config.runconfig import (Arrivals, MixClass, PrefixSpec, RunConfig, SessionSpec,  # noqa: F401
                                      TraceSpec)
from loadgen.config.runconfig import PROCESSES
from loadgen.config.units import parse_rate_per_s

# re-exported: the names callers have always imported from here
__all__ = ["ConfigError", "Lengths", "RunConfig", "Arrivals", "TraceSpec", "MixClass", "PrefixSpec",
           "SessionSpec", "BACKENDS", "redact_url", "load", "load_run", "validate", "with_overrides"]


def load(path: str | Path | None, overrides: dict[str, Any] | None = None, *, url: str | None = None,
         out: str | None = None, sim_args: tuple[str, ...] = ()) -> RunConfig:
    """Read a workload file (a path, or a shipped workload's name: config/shipped.py; None: the flags
    alone describe it, FLAGS_ONLY), apply command-line options ({flag: value}, see options.py), validate;
    raise ConfigError with every problem."""
    return load_run(path, overrides, url=url, out=out, sim_args=sim_args)[0]


def load_run(path: str | Path | None, overrides: dict[str, Any] | None = None, *, url: str | None = None,
             out: str | None = None, sim_args: tuple[str, ...] = ()) -> tuple[RunConfig, ClientOptions]:
    """load(), and the client options (--header, --insecure, --ca-bundle, --overwrite) validated in the
    same round: one ConfigError holds the problems of the file, the flags and the client options."""
    given = {f: v for f, v in (overrides or {}).items() if v is not None}
    client = {BY_FLAG[f].run_field: given.pop(f) for f in list(given) if BY_FLAG[f].client}
    run_options: dict[str, Any] = {"url": url, "out": out, "sim_args": sim_args}
    for flag in [f for f in given if BY_FLAG[f].key is None]:
        run_options[BY_FLAG[flag].run_field] = given.pop(flag)
    if path is None:
        path, raw = Path(FLAGS_SOURCE), _flags_only(given)
    else:
        path = shipped.resolve(path)
        raw = _read(path)
    problems = _trace_conflicts(raw, given) + _tokenizer_flag(raw, given)
    sources = _apply_flags(raw, given)
    opts, client_problems = client_options(**client)
    try:
        config = validate(raw, str(path), sources, **run_options)
    except ConfigError as e:
        raise ConfigError(problems + e.problems + client_problems) from None
    if problems + client_problems:
        raise ConfigError(problems + client_problems)
    return config, opts


# The workload of a run without a file (`loadgen run --rate 10/s --prompt-tokens 512 --max-tokens 128
# --requests 200`): Poisson arrivals of random prompts of exactly the asked lengths; every other key is the
# options' default, the model the target's (asked of /v1/models).
FLAGS_SOURCE = "(flags)"
FLAGS_ONLY = {"name": "random", "arrivals": {"process": "poisson"}}


def _flags_only(given: dict[str, Any]) -> dict:
    """FLAGS_ONLY, when the flags say enough: a rate (or --concurrency), both lengths (or a --trace) and a
    bound; else one ConfigError naming every missing flag."""
    missing = []
    if "--trace" not in given:
        if "--rate" not in given and not given.get("--concurrency"):
            missing.append("--rate (or --concurrency)")
        missing += [f for f in ("--prompt-tokens", "--max-tokens") if f not in given]
        if "--requests" not in given and "--duration" not in given:
            missing.append("--requests or --duration")
    if missing:
        raise ConfigError([f"no workload file: give one (a path, or a shipped workload's name: `loadgen "
                           f"workloads` lists them), or describe the workload with flags; missing: "
                           f"{', '.join(missing)}"])
    return {k: dict(v) if isinstance(v, dict) else v for k, v in FLAGS_ONLY.items()}


def _read(path: Path) -> dict:
    try:
        return tomllib.loads(path.read_text())
    except FileNotFoundError:
        known = shipped.names()
        hint = f" (shipped workloads, by name: {', '.join(known)})" if known and len(path.parts) == 1 else ""
        raise ConfigError([f"{path}: no such workload file{hint}"]) from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ConfigError([f"{path}: not valid TOML: {e}"]) from None
    except IsADirectoryError:
        raise ConfigError([f"{path}: is a folder, not a workload file (TOML)"]) from None
    except OSError as e:  # unreadable: permissions, a FIFO's error, a broken device
        raise ConfigError([f"{path}: cannot read the workload file: {e.strerror or e}"]) from None


def _apply_flags(raw: dict, given: dict[str, Any]) -> dict[str, str]:
    """Write the flags that override workload keys into the parsed file; {key: the flag that set it}."""
    sources: dict[str, str] = {}
    for flag, value in given.items():
        key = FLAG_KEYS[flag]
        table, _, leaf = key.rpartition(".")
        target = raw.setdefault(table, {}) if table else raw
        if not isinstance(target, dict):
            continue  # validate() reports the table itself
        if key == "trace.file":
            # A trace given on the command line replaces the workload's arrivals and lengths; its path
            # is relative to the working directory, so make it absolute before the file's dir applies.
            value = os.path.abspath(value)  # no syscall: a name the OS refuses is reported later
            raw.pop("arrivals", None)
        if key == "trace.time_scale":
            try:
                value = float(value)
            except ValueError:
                pass  # reported by validate()
        if key in ("run.duration", "run.requests"):
            # --duration and --requests replace each other: the flag wins over the file's bound.
            raw["run"].pop("requests" if leaf == "duration" else "duration", None)
        target[leaf] = value
        sources[key] = flag
    return sources


def _tokenizer_flag(raw: dict, given: dict[str, Any]) -> list[str]:
    """--tokenizer FILE: a local tokenizer.json (relative to the working directory) = prompt.tokenizer
    "local" with that file (given is rewritten to "local"); a word is left to the option's check."""
    value = given.get("--tokenizer")
    if value is None or value in TOKENIZERS:
        return []
    path = Path(value)
    if not is_file(path):
        del given["--tokenizer"]  # reported here, not again by the option's check
        return [f"--tokenizer: must be auto, server, approximate or a tokenizer.json file, got {value!r} "
                f"(no such file)"]
    prompt = raw.setdefault("prompt", {})
    if isinstance(prompt, dict):
        prompt["tokenizer_file"] = os.path.abspath(path)
    given["--tokenizer"] = "local"
    return []


def _trace_conflicts(raw: dict, overrides: dict[str, Any]) -> list[str]:
    # A trace replay takes its arrivals (and, unless trace.lengths = false, its lengths) from the trace:
    # flags that set them would be silently ignored, so they are errors.
    trace: dict[str, Any] = raw["trace"] if isinstance(raw.get("trace"), dict) else {}
    if overrides.get("--trace") is None and not trace:
        return []
    given = {f for f, v in overrides.items() if v is not None}
    out = []
    if "--rate" in given:
        out.append("--rate: a trace replay takes its arrivals from the trace; use --time-scale (or trace.rate "
                   "in the workload) to change its pace")
    if trace.get("lengths", True) is not False:
        out += [f"{f}: a trace replay takes the lengths from the trace (set trace.lengths = false in the "
                f"workload to use the workload's lengths)" for f in ("--prompt-tokens", "--max-tokens") if f in given]
    return out


def validate(raw: dict, source: str, sources: dict[str, str] | None = None, **run_options: Any) -> RunConfig:
    """Every section of the parsed workload (keys already overridden by flags; `sources` says which flag
    set which key) and the run options ({RunConfig field: value given}, None = not given) -> RunConfig,
    or one ConfigError with the problems of all of them."""
    r = sections.Reader(raw, source, sources)
    options = parts.run_options(r, run_options)
    sections.keys(r)
    head = sections.top(r)
    concurrency = r.option("run.concurrency")
    arrivals = sections.arrivals(r, concurrency)
    run = sections.run_bounds(r, arrivals.process, arrivals.rate_per_s, concurrency) | sections.run_limits(r)
    request = sections.request(r)
    trace, mix = parts.trace(r), parts.mix(r)
    # Lengths come from the trace (unless trace.lengths = false) or from [[mix]]: then the
    # [prompt]/[output] tokens are optional (and ignored when given).
    prompt = sections.prompt(r, bool(mix) or (trace is not None and trace.lengths))
    config = RunConfig(**head, arrivals=arrivals, **run, **request, **prompt, **options, source=source,
                       trace=trace, mix=mix, prefix=parts.prefix(r), session=parts.session(r),
                       abandon=parts.abandon(r), image=parts.image(r), rerank=pooling.rerank(r),
                       structured=structured.spec(r))
    if config.api in POOLING_APIS:  # the calibration's probes time a first token, which these answers lack
        config = replace(config, calibrate=False)
    parts.across(r, config)
    structured.across(r, config)
    pooling.across(r, config)
    if r.problems:
        raise ConfigError(r.problems)
    return config


def with_overrides(config: RunConfig, by: str = "", **changes: Any) -> RunConfig:
    """config with `changes` (RunConfig fields; `arrivals` a whole Arrivals) set after loading — the sweep's
    rate, the model discovered, the worker count — validated again: each changed field by its option
    row's check, the arrivals by their rules, and the rules across fields that read a changed one.
    ConfigError names each field, after `by` (who set it, e.g. "sweep")."""
    new = replace(config, **changes)
    problems = [p for name in changes for p in _field_problems(new, name)]
    if problems:  # the rules across fields read well-typed values only
        raise ConfigError([f"{by}: {p}" if by else p for p in problems])
    if {"requests", "warmup_requests"} & set(changes) and new.requests is not None \
            and new.warmup_requests >= new.requests:
        problems.append(f"warmup_requests: must be less than requests ({new.requests}), got {new.warmup_requests}")
    if {"concurrency", "max_concurrency"} & set(changes) and new.concurrency and new.max_concurrency:
        problems.append("concurrency, max_concurrency: give concurrency (closed loop) or max_concurrency, not both")
    if problems:
        raise ConfigError([f"{by}: {p}" if by else p for p in problems])
    return new


def _field_problems(config: RunConfig, name: str) -> list[str]:
    if name not in {f.name for f in fields(RunConfig)}:
        return [f"{name}: not a RunConfig field"]
    value = getattr(config, name)
    if name == "arrivals":
        return _arrivals_problems(config)
    if value is None:
        return []
    if not _has_field_type(name, value):
        return [f"{name}: must be a {_FIELD_TYPES[name]}, got {value!r:.80}"]
    if name == "url":
        return url_problems(value, "url")
    row = BY_FIELD.get(name)
    if isinstance(value, Lengths):
        return [f"{name}: {p}" for p in lengths_problems(value)]
    problem = row.kind.check(value) if row is not None else None
    return [f"{name}: {problem}"] if problem else []


_FIELD_TYPES = get_type_hints(RunConfig)


def _has_field_type(name: str, value: Any) -> bool:
    """value is of the type RunConfig declares for the field (an int is not a bool, a float may be an int)."""
    t = _FIELD_TYPES[name]
    allowed = {get_origin(a) or a for a in (get_args(t) if get_origin(t) in (Union, UnionType) else (t,))}
    if float in allowed:
        allowed.add(int)
    if isinstance(value, bool) and bool not in allowed:
        return False
    return any(a is Any or isinstance(value, a) for a in allowed)


def _arrivals_problems(config: RunConfig) -> list[str]:
    a = config.arrivals
    if not isinstance(a, Arrivals):
        return [f"arrivals: must be an Arrivals, got {a!r}"]
    if a.process not in PROCESSES:
        return [f"arrivals.process: must be one of {', '.join(PROCESSES)}, got {a.process!r}"]
    if a.process in ("trace", "stages") or config.concurrency:
        return []  # the trace, the stages or the users' replies set the pace: rate_per_s is not read
    if a.rate_per_s == float("inf"):
        ok = a.process in ("poisson", "constant", "gamma")
        return [] if ok else [f"arrivals.rate_per_s: \"inf\" needs process poisson, constant or gamma, "
                              f"not {a.process!r}"]
    try:
        parse_rate_per_s(a.rate_per_s)
    except ValueError as e:
        return [f"arrivals.rate_per_s: {e}"]
    return []
