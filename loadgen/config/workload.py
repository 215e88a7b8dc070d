"""Workload files (TOML) and the one frozen RunConfig a run is described by.

A workload file (see workloads/quickstart.toml):

    name = "quickstart"            # optional, defaults to the file's stem
    model = "sim-llama-8b"
    api = "chat"                   # completions | chat
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
    max_send_lag_p99 = "5ms"       # above it the run is invalid: the generator fell behind (selfcheck.py)
    max_rate_deviation = 0.02      # achieved vs offered rate, relative; beyond it the run is invalid
    max_cv_deviation = 0.1         # dispatch-gap CV vs the plan's, absolute; beyond it the run is invalid
    concurrency = 0                # > 0: closed loop of N users (needs requests; arrivals are ignored)
    think_time = "0s"              # closed loop: each user's pause between a reply and its next request

    [prompt]
    tokens = 128                   # or { dist = "uniform", min = 64, max = 512 }

    [output]
    tokens = 64                    # sent as max_tokens, same forms as prompt.tokens

    [request]
    api_key_env = "OPENAI_API_KEY" # the key is read from this variable, never written anywhere
    extra_body = { ignore_eos = true }

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

    [[mix]]                        # joint classes: weight, prompt and output lengths drawn together
    weight = 0.7
    prompt = { dist = "lognormal", median = 150, sigma = 0.6 }
    output = { dist = "normal", mean = 200, sd = 60, min = 16, max = 512 }

    [prefix]                       # shared system prompts
    tokens = 1000                  # K: the shared prefix's length (part of each prompt's token count;
                                   # with [session], added to each turn's user message instead)
    groups = 4                     # how many distinct prefixes
    fraction = 0.8                 # share of requests that carry one (the rest carry none)

    [session]                      # multi-turn: each arrival starts a conversation; [prompt] tokens
                                   # is then each turn's new user message (prefix and history on top)
    turns = { dist = "uniform", min = 2, max = 6 }   # any length form; >= 1
    think_ms = { dist = "lognormal", median = 3000, sigma = 0.5 }  # think time after each reply

validate() returns every problem at once, each naming the file and key (or the CLI flag that set it).
"""
from __future__ import annotations

import math
import os
import shlex
import tomllib
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from loadgen.errors import ConfigError  # noqa: F401  (raised here; importable from here too)
from loadgen.config import lengths as lengths_mod
from loadgen.config.lengths import Lengths
from loadgen.config.options import BY_FLAG, FLAG_KEYS
from loadgen.config.slo import parse_slo
from loadgen.config.units import parse_duration_ns, parse_rate_per_s

APIS = ("completions", "chat")
BACKENDS = ("openai", "ollama", "llamacpp")   # loadgen/client/backends/
PROCESSES = ("poisson", "constant", "gamma", "ramp", "stages", "trace")   # loadgen/plan/arrivals.py
LENGTH_DISTS = lengths_mod.DISTS
TRACE_FORMATS = ("azure", "mooncake", "burstgpt", "jsonl")
TOKENIZERS = ("auto", "server", "approximate", "local")
INFINITE_RATES = ("inf", "inf/s", "infinite")  # arrivals.rate / --rate: all requests due at t0


@dataclass(frozen=True)
class Arrivals:
    process: str = "poisson"
    rate_per_s: float = 1.0
    burstiness: float = 1.0
    rate_from_per_s: float = 0.0            # ramp: rate at t=0 (rate_per_s is reached after ramp_ns)
    ramp_ns: int = 0
    stages: tuple[tuple[int, float, float], ...] = ()  # (duration_ns, rate_from_per_s, rate_to_per_s)
    base: str = "poisson"                   # ramp/stages spacing: poisson | constant


@dataclass(frozen=True)
class TraceSpec:
    file: str                               # resolved path
    format: str = ""                        # "" = sniffed
    time_scale: float | None = None
    rate_per_s: float | None = None         # target mean rate (exclusive with time_scale)
    start_ns: int = 0
    limit: int | None = None
    skip_bad_rows: bool = False
    lengths: bool = True                    # take prompt/output lengths from the trace too


@dataclass(frozen=True)
class MixClass:
    weight: float                           # normalized over all classes
    prompt: Lengths
    output: Lengths
    name: str = ""


@dataclass(frozen=True)
class PrefixSpec:
    tokens: int                             # K, counted inside each sharing request's prompt length
    groups: int = 1
    fraction: float = 1.0


@dataclass(frozen=True)
class SessionSpec:
    turns: Lengths
    think_ms: Lengths


@dataclass(frozen=True)
class RunConfig:
    name: str
    model: str
    api: str
    seed: int
    arrivals: Arrivals
    prompt_tokens: Lengths
    output_tokens: Lengths
    requests: int | None = None
    duration_ns: int | None = None
    warmup_requests: int = 0
    max_concurrency: int = 0
    request_timeout_ns: int = 120_000_000_000
    drain_timeout_ns: int = 30_000_000_000
    max_send_lag_p99_ns: int = 5_000_000
    max_rate_deviation: float = 0.02    # selfcheck.Limits.rate_tolerance
    max_cv_deviation: float = 0.1       # selfcheck.Limits.cv_tolerance
    api_key_env: str | None = None
    extra_body: dict = field(default_factory=dict)
    url: str | None = None          # None: start the built-in simulator
    out: str | None = None
    sim_args: tuple[str, ...] = ()  # flags for the built-in simulator when url is None
    source: str = ""                # the workload file, for messages and the manifest
    # backend family, idle-server calibration, /metrics scraping
    backend: str = "openai"         # openai | ollama | llamacpp
    calibrate: bool = True          # probe the idle server before the run (calibrate.py)
    scrape_metrics: bool = False    # sample the target's /metrics during the run (scrape.py)
    scrape_interval_ns: int = 500_000_000
    workers: int = 1                # generator processes (workers.py); 0 = auto, picked by rate
    ray: str | None = None          # Ray cluster address or "auto" (ray_workers.py); None = local processes
    # production-shaped workloads (all optional)
    trace: TraceSpec | None = None
    mix: tuple[MixClass, ...] = ()
    prefix: PrefixSpec | None = None
    session: SessionSpec | None = None
    tokenizer: str = "auto"
    tokenizer_file: str | None = None
    dataset: str | None = None
    # closed loop (N virtual users) and the SLOs a run is judged by
    concurrency: int = 0            # > 0: closed loop, N users each sending when its previous reply ends
    think_ns: int = 0               # closed loop: a user's pause between a reply and its next request
    slo: tuple[tuple[str, float], ...] = ()  # (metric, bound ms), analysis/goodput.py

    def api_key(self) -> str | None:
        return os.environ.get(self.api_key_env) if self.api_key_env else None

    def to_manifest(self) -> dict:
        # The resolved config as written to manifest.json: the key's variable name, never its value;
        # credentials in the URL are redacted.
        d = asdict(self)
        d["url"] = redact_url(self.url) if self.url else None
        return d


def redact_url(url: str) -> str:
    from loadgen.config.credentials import redact_url as redact

    return redact(url)


# The keys a workload file may hold, per table; anything else is reported (typos must not pass silently).
_KEYS = {
    "": {"name", "model", "api", "backend", "seed", "arrivals", "run", "prompt", "output", "request",
         "trace", "mix", "prefix", "session"},
    "arrivals": {"process", "rate", "burstiness", "rate_from", "ramp", "stages", "base"},
    "run": {"requests", "duration", "warmup_requests", "max_concurrency", "request_timeout", "drain_timeout",
            "max_send_lag_p99", "max_rate_deviation", "max_cv_deviation", "concurrency", "think_time"},
    "prompt": {"tokens", "tokenizer", "tokenizer_file", "dataset"},
    "trace": {"file", "format", "time_scale", "rate", "start", "limit", "skip_bad_rows", "lengths"},
    "prefix": {"tokens", "groups", "fraction"},
    "session": {"turns", "think_ms"},
    "output": {"tokens"},
    "request": {"api_key_env", "extra_body"},
}

def load(path: str | Path, overrides: dict[str, Any] | None = None, *, url: str | None = None,
         out: str | None = None, sim_args: tuple[str, ...] = ()) -> RunConfig:
    """Read a workload file, apply command-line options ({flag: value}, see options.py), validate;
    raise ConfigError with every problem."""
    path = Path(path)
    overrides = {f: v for f, v in (overrides or {}).items() if v is not None and not BY_FLAG[f].client}
    run_options = {"url": url, "out": out, "sim_args": sim_args}
    for flag in [f for f in overrides if BY_FLAG[f].key is None]:
        run_options[BY_FLAG[flag].field] = overrides.pop(flag)
    try:
        raw = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError([f"{path}: no such workload file"]) from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ConfigError([f"{path}: not valid TOML: {e}"]) from None
    sources: dict[str, str] = {}
    conflicts = _trace_conflicts(raw, overrides)
    for flag, value in overrides.items():
        key = FLAG_KEYS[flag]
        table, _, leaf = key.rpartition(".")
        target = raw.setdefault(table, {}) if table else raw
        if not isinstance(target, dict):
            continue  # validate() reports the table itself
        if key == "trace.file":
            # A trace given on the command line replaces the workload's arrivals and lengths; its path
            # is relative to the working directory, so make it absolute before the file's dir applies.
            value = str(Path(value).resolve())
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
    try:
        config = validate(raw, str(path), sources, **run_options)
    except ConfigError as e:
        raise ConfigError(conflicts + e.problems) from None
    if conflicts:
        raise ConfigError(conflicts)
    return config


def _trace_conflicts(raw: dict, overrides: dict[str, Any]) -> list[str]:
    # A trace replay takes its arrivals (and, unless trace.lengths = false, its lengths) from the trace:
    # flags that set them would be silently ignored, so they are errors.
    trace = raw.get("trace") if isinstance(raw.get("trace"), dict) else {}
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


def validate(raw: dict, source: str, sources: dict[str, str] | None = None, *, url: str | None = None,
             out: str | None = None, sim_args: tuple[str, ...] | str = (), calibrate: bool | None = None,
             scrape_metrics: bool | None = None, scrape_interval_ns: str | None = None,
             slo: str | None = None, workers: str | None = None, ray: str | None = None) -> RunConfig:
    sources = sources or {}
    problems: list[str] = []
    run_options = _run_options(problems, sim_args, calibrate, scrape_metrics, scrape_interval_ns, slo, workers, ray)

    def where(key: str) -> str:
        return sources.get(key) or f"{source}: {key}"

    def bad(key: str, msg: str) -> None:
        problems.append(f"{where(key)}: {msg}")

    for table, allowed in _KEYS.items():
        section = raw.get(table, {}) if table else raw
        if not isinstance(section, dict):
            bad(table, "must be a table")
            continue
        for key in sorted(set(section) - allowed):
            bad(f"{table}.{key}" if table else key, f"unknown key (expected one of: {', '.join(sorted(allowed))})")

    def get(key: str, default: Any = None) -> Any:
        table, _, leaf = key.rpartition(".")
        section = raw.get(table, {}) if table else raw
        return section.get(leaf, default) if isinstance(section, dict) else default

    def integer(key: str, default: int | None, minimum: int, value: Any = None) -> int | None:
        v = get(key, default) if value is None else value
        if v is None:
            return None
        if isinstance(v, str) and v.strip().lstrip("-").isdigit():
            v = int(v)
        if isinstance(v, bool) or not isinstance(v, int):
            bad(key, f"must be an integer, got {v!r}")
            return default
        if v < minimum:
            bad(key, f"must be >= {minimum}, got {v}")
            return default
        return v

    def duration(key: str, default: int | None) -> int | None:
        v = get(key)
        if v is None:
            return default
        try:
            ns = parse_duration_ns(v)
        except ValueError as e:
            bad(key, str(e))
            return default
        if ns <= 0:
            bad(key, f"must be > 0, got {v!r}")
            return default
        return ns

    def positive(key: str, default: float) -> float:
        v = get(key, default)
        if isinstance(v, str):
            try:
                v = float(v)
            except ValueError:
                pass
        if not _number(v) or not v > 0:
            bad(key, f"must be a number > 0, got {v!r}")
            return default
        return float(v)

    def choice(key: str, options: tuple[str, ...], default: str | None) -> str:
        v = get(key, default)
        if v is None:
            bad(key, f"missing (one of: {', '.join(options)})")
            return options[0]
        if v not in options:
            bad(key, f"must be one of {', '.join(options)}, got {v!r}")
            return options[0]
        return v

    base_dir = Path(source).parent

    def lengths(key: str, default: int | None, v: Any = None) -> Lengths:
        v = get(key, default) if v is None else v
        if isinstance(v, str):
            v = _parse_length_flag(v)
            if isinstance(v, str):
                bad(key, f"must be N or MIN..MAX, got {v!r}")
                return Lengths(value=1)
        if v is None:
            bad(key, "missing")
            return Lengths(value=1)
        return lengths_mod.parse(v, key, bad, base_dir)

    def rate_at(key: str, v: Any) -> float:
        try:
            return parse_rate_per_s(v)
        except ValueError as e:
            bad(key, str(e))
            return 1.0

    model = get("model")  # absent: `loadgen run` asks the target's /v1/models (discover.py)
    if model is not None and (not isinstance(model, str) or not model):
        bad("model", f"must be a non-empty string, got {model!r}")
    api = choice("api", APIS, "completions")
    backend = choice("backend", BACKENDS, "openai")
    seed = integer("seed", 0, 0)
    has_trace = isinstance(raw.get("trace"), dict)
    process = choice("arrivals.process", PROCESSES, "trace" if has_trace else "poisson")
    if has_trace:
        process = "trace"
    elif process == "trace":
        bad("arrivals.process", "\"trace\" needs a [trace] table with a file (or --trace FILE)")
    rate = 1.0
    concurrency = integer("run.concurrency", 0, 0) or 0
    if process in ("trace", "stages"):
        pass  # the trace or the stages give the rate
    elif concurrency:
        pass  # closed loop: the users' replies set the pace; a rate is ignored
    elif str(get("arrivals.rate")).strip().lower() in INFINITE_RATES:
        rate = math.inf  # every request is due at t0 (schedule.py); --max-concurrency paces them
        if process not in ("poisson", "constant", "gamma"):
            bad("arrivals.rate", f"\"inf\" needs process poisson, constant or gamma, not {process!r}")
    elif get("arrivals.rate") is None:
        bad("arrivals.rate", "missing (e.g. rate = \"8/s\")")
    else:
        rate = rate_at("arrivals.rate", get("arrivals.rate"))
    arrivals_extra = _arrivals_extra(raw, process, bad, duration, rate_at)
    burstiness = get("arrivals.burstiness", 1.0)
    if isinstance(burstiness, bool) or not isinstance(burstiness, (int, float)) or not burstiness > 0:
        bad("arrivals.burstiness", f"must be a number > 0, got {burstiness!r}")
        burstiness = 1.0
    requests = integer("run.requests", None, 1)
    duration_ns = duration("run.duration", None)
    bounds = (get("run.requests") is not None) + (get("run.duration") is not None)
    if bounds == 2 or bounds == 0 and process not in ("trace", "stages"):
        bad("run", "give exactly one of requests or duration")
    think_ns = duration("run.think_time", 0) if get("run.think_time") not in (None, "0", 0, "0s", "0ms") else 0
    if (concurrency or math.isinf(rate)) and get("run.duration") is not None:
        bad("run.concurrency" if concurrency else "arrivals.rate", "a closed loop (concurrency, or rate = \"inf\") "
            "needs run.requests (--requests N): its duration is whatever the server makes it")
    if concurrency and get("run.max_concurrency") not in (None, 0, "0"):
        bad("run.max_concurrency", "give concurrency (closed loop, N users) or max_concurrency (a cap on an "
            "open loop), not both")
    if concurrency and isinstance(raw.get("session"), dict):
        bad("run.concurrency", "a closed loop cannot replay [session] conversations (their turns are timed "
            "by their own replies)")
    if think_ns and not concurrency:
        bad("run.think_time", "only applies to a closed loop (run.concurrency / --concurrency N)")
    warmup = integer("run.warmup_requests", 0, 0) or 0
    if requests is not None and warmup >= requests:
        bad("run.warmup_requests", f"must be less than run.requests ({requests}), got {warmup}")
    max_conc = integer("run.max_concurrency", 0, 0) or 0
    api_key_env = get("request.api_key_env")
    if api_key_env is not None and (not isinstance(api_key_env, str) or not api_key_env):
        bad("request.api_key_env", f"must be the name of an environment variable, got {api_key_env!r}")
    extra_body = get("request.extra_body", {})
    if not isinstance(extra_body, dict):
        bad("request.extra_body", f"must be a table, got {extra_body!r}")
        extra_body = {}
    for reserved in sorted(set(extra_body) & {"model", "prompt", "messages", "stream", "max_tokens"}):
        bad(f"request.extra_body.{reserved}", "is set by loadgen itself and may not be overridden here")
    trace = _trace(raw.get("trace"), base_dir, bad, duration, rate_at) if has_trace else None
    mix = _mix(raw.get("mix"), bad, lengths)
    # Lengths come from the trace (unless trace.lengths = false) or from [[mix]]: then the
    # [prompt]/[output] tokens are optional (and ignored when given).
    skip_lengths = bool(mix) or (trace is not None and trace.lengths)
    tokenizer = choice("prompt.tokenizer", TOKENIZERS, "auto")
    tokenizer_file = get("prompt.tokenizer_file")
    if tokenizer == "local" and not isinstance(tokenizer_file, str):
        bad("prompt.tokenizer_file", "missing: tokenizer = \"local\" needs the path of a tokenizer.json")
    if isinstance(tokenizer_file, str):
        tokenizer_file = str(base_dir / tokenizer_file)
        if tokenizer == "auto":
            tokenizer = "local"
    dataset = get("prompt.dataset")
    if dataset is not None:
        if not isinstance(dataset, str) or not (base_dir / dataset).is_file():
            bad("prompt.dataset", f"no such file {str(base_dir / str(dataset))!r} (a ShareGPT-format JSON file)")
        else:
            dataset = str(base_dir / dataset)
    config = RunConfig(
        name=get("name") or Path(source).stem,
        model=model if isinstance(model, str) else "",
        api=api,
        seed=seed or 0,
        arrivals=Arrivals(process, rate, float(burstiness), **arrivals_extra),
        prompt_tokens=lengths("prompt.tokens", None) if not skip_lengths else Lengths(value=1),
        output_tokens=lengths("output.tokens", None) if not skip_lengths else Lengths(value=1),
        requests=requests,
        duration_ns=duration_ns,
        warmup_requests=warmup,
        max_concurrency=max_conc,
        request_timeout_ns=duration("run.request_timeout", 120_000_000_000),
        drain_timeout_ns=duration("run.drain_timeout", 30_000_000_000),
        max_send_lag_p99_ns=duration("run.max_send_lag_p99", 5_000_000),
        max_rate_deviation=positive("run.max_rate_deviation", 0.02),
        max_cv_deviation=positive("run.max_cv_deviation", 0.1),
        api_key_env=api_key_env,
        extra_body=extra_body,
        url=url,
        out=out,
        source=source,
        **run_options,
        backend=backend,
        trace=trace,
        mix=mix,
        prefix=_prefix(raw.get("prefix"), bad, integer),
        session=_session(raw.get("session"), bad, lengths),
        tokenizer=tokenizer,
        tokenizer_file=tokenizer_file if isinstance(tokenizer_file, str) else None,
        dataset=dataset if isinstance(dataset, str) else None,
        concurrency=concurrency,
        think_ns=think_ns or 0,
    )
    if config.prefix is not None and config.session is None and not skip_lengths \
            and config.prompt_tokens.dist == "fixed" and config.prompt_tokens.value <= config.prefix.tokens:
        bad("prefix.tokens", f"must be less than prompt.tokens ({config.prompt_tokens.value}): the prefix "
            f"is part of the prompt")
    if url is not None:
        from loadgen.config.credentials import url_problems

        problems.extend(url_problems(url))
    if problems:
        raise ConfigError(problems)
    return config


def _parse_length_flag(text: str) -> int | dict | str:
    """`128` -> 128; `64..512` -> uniform; anything else is returned for the validator to reject."""
    t = text.strip()
    if t.isdigit():
        return int(t)
    lo, sep, hi = t.partition("..")
    if sep and lo.strip().isdigit() and hi.strip().isdigit():
        return {"dist": "uniform", "min": int(lo), "max": int(hi)}
    return text


def with_overrides(config: RunConfig, **changes: Any) -> RunConfig:
    return replace(config, **changes)


def _run_options(problems: list[str], sim_args: tuple[str, ...] | str, no_calibrate: bool | None,
                 scrape_metrics: bool | None, scrape_interval: str | None, slo: str | None,
                 workers: str | None, ray: str | None) -> dict[str, Any]:
    # The run options of options.py that no workload file holds (--url and --out are checked below).
    out: dict[str, Any] = {"calibrate": not no_calibrate, "scrape_metrics": bool(scrape_metrics)}
    if isinstance(sim_args, str):
        try:
            sim_args = shlex.split(sim_args)
        except ValueError as e:
            problems.append(f"--sim-args: {e}: {sim_args!r}")
            sim_args = ()
    out["sim_args"] = tuple(sim_args)
    if scrape_interval is not None:
        try:
            ns = parse_duration_ns(scrape_interval)
            if ns <= 0:
                raise ValueError(f"must be > 0, got {scrape_interval!r}")
            out["scrape_interval_ns"] = ns
        except ValueError as e:
            problems.append(f"--scrape-interval: {e}")
    if slo is not None:
        try:
            out["slo"] = tuple(parse_slo(slo).items())
        except ValueError as e:
            problems.append(f"--slo: {e}")
    if workers is not None:
        n = 0 if str(workers) == "auto" else (int(workers) if str(workers).isdigit() else -1)
        if n < 0 or n > 1024 or (n == 0 and str(workers) != "auto"):
            problems.append(f"--workers: expected a number of processes (1-1024) or auto, got {workers!r}")
        else:
            out["workers"] = n
    if ray is not None:
        out["ray"] = ray
        out.setdefault("workers", 0)  # --ray without --workers: auto
    return out


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _arrivals_extra(raw: dict, process: str, bad, duration, rate_at) -> dict:
    a = raw.get("arrivals") if isinstance(raw.get("arrivals"), dict) else {}
    out: dict[str, Any] = {}
    base = a.get("base", "poisson")
    if base not in ("poisson", "constant"):
        bad("arrivals.base", f"must be poisson or constant, got {base!r}")
        base = "poisson"
    out["base"] = base
    if process == "ramp":
        if "rate_from" not in a:
            bad("arrivals.rate_from", "missing: a ramp goes from rate_from to rate over ramp")
        else:
            out["rate_from_per_s"] = _rate_or_zero("arrivals.rate_from", a["rate_from"], bad, rate_at)
        out["ramp_ns"] = duration("arrivals.ramp", None) or 0
        if "ramp" not in a:
            bad("arrivals.ramp", "missing: the ramp's length, e.g. ramp = \"60s\"")
    if process == "stages":
        st = a.get("stages")
        if not isinstance(st, list) or not st:
            bad("arrivals.stages", "must be a non-empty list like [ { duration = \"30s\", rate = \"2/s\" } ]")
            st = []
        stages = []
        for i, item in enumerate(st):
            k = f"arrivals.stages[{i}]"
            if not isinstance(item, dict):
                bad(k, "must be a table with duration, rate and optionally to")
                continue
            for extra in sorted(set(item) - {"duration", "rate", "to"}):
                bad(f"{k}.{extra}", "unknown key (expected duration, rate, to)")
            try:
                d = parse_duration_ns(item.get("duration"))
                if d <= 0:
                    raise ValueError(f"must be > 0, got {item.get('duration')!r}")
            except ValueError as e:
                bad(f"{k}.duration", str(e))
                d = 1
            r0 = _rate_or_zero(f"{k}.rate", item.get("rate"), bad, rate_at)
            r1 = _rate_or_zero(f"{k}.to", item["to"], bad, rate_at) if "to" in item else r0
            stages.append((d, r0, r1))
        if stages and stages[-1][2] == 0 and raw.get("run", {}).get("requests") is not None:
            bad("arrivals.stages", "the last stage must end at a rate > 0 when the run is bounded by requests")
        out["stages"] = tuple(stages)
    return out


def _rate_or_zero(key: str, v: Any, bad, rate_at) -> float:
    # Stages and ramps may start from (or pause at) rate 0.
    if v in (0, 0.0, "0", "0/s"):
        return 0.0
    if v is None:
        bad(key, "missing")
        return 1.0
    return rate_at(key, v)


def _trace(t: dict, base_dir: Path, bad, duration, rate_at) -> TraceSpec:
    f = t.get("file")
    path = ""
    if f is None:
        bad("trace.file", "missing: a [trace] table (or --time-scale, --trace-format, --skip-bad-rows) "
            "needs a trace file: set trace.file or pass --trace FILE")
    elif not isinstance(f, str) or not f:
        bad("trace.file", f"must be a file name, got {f!r}")
    else:
        p = Path(f) if Path(f).is_absolute() else base_dir / f
        if not p.is_file():
            bad("trace.file", f"no such file {str(p)!r}")
        path = str(p)
    fmt = t.get("format", "")
    if fmt not in ("", *TRACE_FORMATS):
        bad("trace.format", f"must be one of {', '.join(TRACE_FORMATS)}, got {fmt!r}")
        fmt = ""
    ts = t.get("time_scale")
    if ts is not None and (not _number(ts) or not ts > 0):
        bad("trace.time_scale", f"must be a number > 0, got {ts!r}")
        ts = None
    rate = rate_at("trace.rate", t["rate"]) if "rate" in t else None
    if ts is not None and rate is not None:
        bad("trace", "give time_scale or rate, not both")
    start_ns = 0
    if "start" in t:
        try:
            start_ns = parse_duration_ns(t["start"])
        except ValueError as e:
            bad("trace.start", str(e))
    limit = t.get("limit")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        bad("trace.limit", f"must be an integer >= 1, got {limit!r}")
        limit = None
    flags = {}
    for k in ("skip_bad_rows", "lengths"):
        v = t.get(k, k == "lengths")
        if not isinstance(v, bool):
            bad(f"trace.{k}", f"must be true or false, got {v!r}")
            v = k == "lengths"
        flags[k] = v
    return TraceSpec(path, fmt, None if ts is None else float(ts), rate, start_ns, limit, **flags)


def _mix(m: Any, bad, lengths) -> tuple[MixClass, ...]:
    if m is None:
        return ()
    if not isinstance(m, list) or not m:
        bad("mix", "must be one or more [[mix]] tables")
        return ()
    classes, total = [], 0.0
    for i, c in enumerate(m):
        k = f"mix[{i}]"
        if not isinstance(c, dict):
            bad(k, "must be a table with weight, prompt, output")
            continue
        for extra in sorted(set(c) - {"weight", "prompt", "output", "name"}):
            bad(f"{k}.{extra}", "unknown key (expected weight, prompt, output, name)")
        w = c.get("weight")
        if not _number(w) or not w > 0:
            bad(f"{k}.weight", f"must be a number > 0, got {w!r}")
            w = 1.0
        total += w
        classes.append((float(w), lengths(f"{k}.prompt", None, c.get("prompt")) if "prompt" in c
                        else lengths(f"{k}.prompt", None), lengths(f"{k}.output", None, c.get("output"))
                        if "output" in c else lengths(f"{k}.output", None), str(c.get("name", ""))))
    return tuple(MixClass(w / total, p, o, n) for w, p, o, n in classes)


def _prefix(p: Any, bad, integer) -> PrefixSpec | None:
    if p is None:
        return None
    if not isinstance(p, dict):
        return None  # reported as "must be a table"
    if "tokens" not in p:
        bad("prefix.tokens", "missing: the shared prefix's length in tokens")
    tokens = integer("prefix.tokens", 1, 1) or 1
    groups = integer("prefix.groups", 1, 1) or 1
    fraction = p.get("fraction", 1.0)
    if not _number(fraction) or not 0 <= fraction <= 1:
        bad("prefix.fraction", f"must be a number in [0, 1], got {fraction!r}")
        fraction = 1.0
    return PrefixSpec(tokens, groups, float(fraction))


def _session(s: Any, bad, lengths) -> SessionSpec | None:
    if s is None or not isinstance(s, dict):
        return None
    turns = lengths("session.turns", None) if "turns" in s else None
    if turns is None:
        bad("session.turns", "missing: how many turns per conversation (e.g. 4 or a distribution)")
        turns = Lengths(value=1)
    think = lengths("session.think_ms", None) if "think_ms" in s else Lengths(value=1000)
    return SessionSpec(turns, think)
