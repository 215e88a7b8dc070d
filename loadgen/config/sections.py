"""Each section of a workload validates itself (k6's `Validate() []error`): a section function reads its
part of the parsed TOML through a Reader, builds its part of RunConfig and appends every problem it finds
to `r.problems`, each naming the file and key, or the flag that set the key (`r.sources`). workload.py
runs them all and raises one ConfigError with every problem. Keys with a row in the option table
(options.py) are parsed by the row's kind, with the row's default (Reader.option); the trace, mix, prefix
and session tables are in parts.py.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from loadgen.config import lengths as lengths_mod
from loadgen.config.kinds import INT64_MAX, is_decimal, is_file
from loadgen.config.lengths import Lengths
from loadgen.config.options import APIS, BY_KEY, EVENT_APIS, OPTIONS, POOLING_APIS
from loadgen.config.runconfig import INFINITE_RATES, PROCESSES, Arrivals
from loadgen.config.units import parse_duration_ns, parse_rate_per_s

# The keys a workload file may hold, per table; anything else is reported (typos must not pass silently).
KEYS = {
    "": {"name", "model", "api", "backend", "seed", "arrivals", "run", "prompt", "output", "request",
         "trace", "mix", "prefix", "session", "abandon", "image", "rerank"},
    "arrivals": {"process", "rate", "burstiness", "rate_from", "ramp", "stages", "base"},
    "run": {"requests", "duration", "warmup_requests", "max_concurrency", "request_timeout", "drain_timeout",
            "max_send_lag_p99", "max_rate_deviation", "max_cv_deviation", "concurrency", "think_time",
            "max_lag_share", "lag_floor", "max_error_rate", "max_user_rate", "scrape"},
    "prompt": {"tokens", "tokenizer", "tokenizer_file", "dataset", "salt"},
    "trace": {"file", "format", "time_scale", "rate", "start", "limit", "skip_bad_rows", "lengths"},
    "prefix": {"tokens", "groups", "fraction"},
    "session": {"turns", "think_ms", "max_tool_rounds", "tool_latency_ms", "tool_result_tokens"},
    "abandon": {"share", "after_ms", "after_tokens"},
    "image": {"share", "count", "width", "height", "fill"},
    "rerank": {"documents", "document_tokens"},
    "output": {"tokens"},
    "request": {"api_key_env", "extra_body", "tools", "tool_choice", "response_format"},
}
RESERVED_BODY = {"model", "prompt", "messages", "stream", "max_tokens",   # set by loadgen itself
                 "input", "max_output_tokens", "system",             # (responses, messages)
                 "query", "documents"}                               # (embeddings, rerank)
STRUCTURED_BODY = ("tools", "tool_choice", "response_format")   # [request] keys of their own (structured.py)


class Reader:
    """The parsed workload with every key override applied; collects the problems of every section."""

    def __init__(self, raw: dict, source: str, sources: dict[str, str] | None = None):
        self.raw, self.source, self.sources = raw, source, sources or {}
        self.base_dir = Path(source).parent
        self.problems: list[str] = []

    def where(self, key: str) -> str:
        """The flag that set key (or the table key holds: --prompt-tokens 4..N sets prompt.tokens.max),
        else the file and key."""
        for k, flag in self.sources.items():
            if key == k or key.startswith(k + "."):
                return flag
        return f"{self.source}: {key}"

    def bad(self, key: str, msg: str) -> None:
        self.problems.append(f"{self.where(key)}: {msg}")

    def table(self, name: str) -> dict:
        t = self.raw.get(name)
        return t if isinstance(t, dict) else {}

    def get(self, key: str, default: Any = None) -> Any:
        table, _, leaf = key.rpartition(".")
        section = self.raw.get(table, {}) if table else self.raw
        return section.get(leaf, default) if isinstance(section, dict) else default

    def given(self, key: str) -> bool:
        return self.get(key) is not None

    def option(self, key: str) -> Any:
        """A key with a row in the option table: its value parsed by the row's kind; absent or bad: the
        row's default (a bad value is reported)."""
        row = BY_KEY[key]
        v = self.get(key)
        if v is None:
            return row.value
        try:
            return row.kind.parse(v)
        except ValueError as e:
            self.bad(key, str(e))
            return row.value

    def api(self) -> str:
        """The workload's api, read again by the sections that depend on it (top() reports a bad one, once;
        here a bad one reads as the default)."""
        v = self.get("api")
        return v if isinstance(v, str) and v in APIS else BY_KEY["api"].value

    def integer(self, key: str, default: int | None, minimum: int, value: Any = None,
                maximum: int = INT64_MAX) -> int | None:
        v = self.get(key, default) if value is None else value
        if v is None:
            return None
        if isinstance(v, str) and is_decimal(v):
            v = int(v)
        if isinstance(v, bool) or not isinstance(v, int):
            self.bad(key, f"must be an integer, got {v!r}")
            return default
        if not minimum <= v <= maximum:
            self.bad(key, f"must be >= {minimum}, got {v}" if v < minimum else f"must be <= {maximum}, got {v}")
            return default
        return v

    def duration(self, key: str, v: Any, default: int) -> int:
        try:
            ns = parse_duration_ns(v)
            if ns <= 0:
                raise ValueError(f"must be > 0, got {v!r}")
            return ns
        except ValueError as e:
            self.bad(key, str(e))
            return default

    def lengths(self, key: str, v: Any = None) -> Lengths:
        v = self.get(key) if v is None else v
        if isinstance(v, str):
            v = parse_length_flag(v)
            if isinstance(v, str):
                self.bad(key, f"must be N or MIN..MAX, got {v!r}")
                return Lengths(value=1)
        if v is None:
            self.bad(key, "missing")
            return Lengths(value=1)
        return lengths_mod.parse(v, key, self.bad, self.base_dir)

    def rate(self, key: str, v: Any) -> float:
        try:
            return parse_rate_per_s(v)
        except ValueError as e:
            self.bad(key, str(e))
            return 1.0

    def rate_or_zero(self, key: str, v: Any) -> float:
        # Stages and ramps may start from (or pause at) rate 0.
        if v in (0, 0.0, "0", "0/s"):
            return 0.0
        if v is None:
            self.bad(key, "missing")
            return 1.0
        return self.rate(key, v)


def parse_length_flag(text: str) -> int | dict | str:
    """`128` -> 128; `64..512` -> uniform; anything else is returned for the validator to reject."""
    t = text.strip()
    if t.isascii() and t.isdigit():
        return int(t)
    lo, sep, hi = t.partition("..")
    if sep and lo.strip().isascii() and lo.strip().isdigit() and hi.strip().isascii() and hi.strip().isdigit():
        return {"dist": "uniform", "min": int(lo), "max": int(hi)}
    return text


def keys(r: Reader) -> None:
    """Every table is a table and holds only known keys."""
    for table, allowed in KEYS.items():
        section = r.raw.get(table, {}) if table else r.raw
        if not isinstance(section, dict):
            r.bad(table, "must be a table")
            continue
        for key in sorted(set(section) - allowed):
            r.bad(f"{table}.{key}" if table else key,
                  f"unknown key (expected one of: {', '.join(sorted(allowed))})")


def top(r: Reader) -> dict[str, Any]:
    """name, model, api, backend, seed."""
    model = r.get("model")  # absent: `loadgen run` asks the target's /v1/models (probe/discover.py)
    if model is not None and (not isinstance(model, str) or not model):
        r.bad("model", f"must be a non-empty string, got {model!r}")
    api, backend = r.option("api"), r.option("backend")
    if (api in EVENT_APIS or api in POOLING_APIS) and backend != "openai":
        r.bad("api", f"{api!r} is served by OpenAI-compatible servers (vLLM, SGLang, llama-server, Ollama's "
                     f"/v1): it needs backend = \"openai\", not {backend!r}")
    return {"name": r.get("name") or Path(r.source).stem, "model": model if isinstance(model, str) else "",
            "api": api, "backend": backend, "seed": r.option("seed")}


def arrivals(r: Reader, concurrency: int) -> Arrivals:
    """[arrivals]: the process and its rate (a trace or stages give their own; a closed loop has none)."""
    has_trace = isinstance(r.raw.get("trace"), dict)
    process = r.get("arrivals.process", "trace" if has_trace else "poisson")
    if process not in PROCESSES:
        r.bad("arrivals.process", f"must be one of {', '.join(PROCESSES)}, got {process!r}")
        process = PROCESSES[0]
    if has_trace:
        process = "trace"
    elif process == "trace":
        r.bad("arrivals.process", "\"trace\" needs a [trace] table with a file (or --trace FILE)")
    rate = 1.0
    given = r.get("arrivals.rate")
    if process in ("trace", "stages"):
        pass  # the trace or the stages give the rate
    elif concurrency:
        pass  # closed loop: the users' replies set the pace; a rate is ignored
    elif str(given).strip().lower() in INFINITE_RATES:
        rate = math.inf  # every request is due at t0 (plan/schedule.py); --max-concurrency paces them
        if process not in ("poisson", "constant", "gamma"):
            r.bad("arrivals.rate", f"\"inf\" needs process poisson, constant or gamma, not {process!r}")
    elif given is None:
        r.bad("arrivals.rate", "missing (e.g. rate = \"8/s\")")
    else:
        rate = r.rate("arrivals.rate", given)
    extra = _varying(r, process)
    burstiness = r.get("arrivals.burstiness", 1.0)
    if isinstance(burstiness, bool) or not isinstance(burstiness, (int, float)) or not 0 < burstiness < math.inf:
        r.bad("arrivals.burstiness", f"must be a finite number > 0, got {burstiness!r}")
        burstiness = 1.0
    return Arrivals(process, rate, float(burstiness), **extra)


def _varying(r: Reader, process: str) -> dict[str, Any]:
    # ramp and stages: a rate that changes over the run
    a = r.table("arrivals")
    out: dict[str, Any] = {}
    base = a.get("base", "poisson")
    if base not in ("poisson", "constant"):
        r.bad("arrivals.base", f"must be poisson or constant, got {base!r}")
        base = "poisson"
    out["base"] = base
    if process == "ramp":
        if "rate_from" not in a:
            r.bad("arrivals.rate_from", "missing: a ramp goes from rate_from to rate over ramp")
        else:
            out["rate_from_per_s"] = r.rate_or_zero("arrivals.rate_from", a["rate_from"])
        out["ramp_ns"] = r.duration("arrivals.ramp", a["ramp"], 0) if "ramp" in a else 0
        if "ramp" not in a:
            r.bad("arrivals.ramp", "missing: the ramp's length, e.g. ramp = \"60s\"")
    if process == "stages":
        out["stages"] = _stages(r, a.get("stages"))
    return out


def _stages(r: Reader, st: Any) -> tuple[tuple[int, float, float], ...]:
    if not isinstance(st, list) or not st:
        r.bad("arrivals.stages", "must be a non-empty list like [ { duration = \"30s\", rate = \"2/s\" } ]")
        st = []
    stages = []
    for i, item in enumerate(st):
        k = f"arrivals.stages[{i}]"
        if not isinstance(item, dict):
            r.bad(k, "must be a table with duration, rate and optionally to")
            continue
        for extra in sorted(set(item) - {"duration", "rate", "to"}):
            r.bad(f"{k}.{extra}", "unknown key (expected duration, rate, to)")
        d = r.duration(f"{k}.duration", item.get("duration"), 1)
        r0 = r.rate_or_zero(f"{k}.rate", item.get("rate"))
        r1 = r.rate_or_zero(f"{k}.to", item["to"]) if "to" in item else r0
        stages.append((d, r0, r1))
    if stages and stages[-1][2] == 0 and r.table("run").get("requests") is not None:
        r.bad("arrivals.stages", "the last stage must end at a rate > 0 when the run is bounded by requests")
    return tuple(stages)


def run_bounds(r: Reader, process: str, rate_per_s: float, concurrency: int) -> dict[str, Any]:
    """[run]: how long (requests or duration), warm-up, open or closed loop (concurrency: run.concurrency,
    read before the arrivals that it makes moot)."""
    requests = r.option("run.requests")
    duration_ns = r.option("run.duration")
    bounds = r.given("run.requests") + r.given("run.duration")
    if bounds == 2 or bounds == 0 and process not in ("trace", "stages"):
        r.bad("run", "give exactly one of requests or duration")
    think_ns = r.option("run.think_time")
    if math.isinf(rate_per_s) and not concurrency and r.given("run.duration"):
        r.bad("arrivals.rate", "rate = \"inf\" puts every request at t0, so it needs run.requests (--requests N), "
              "not a duration; for N users bounded by a duration give run.concurrency (--concurrency N)")
    user_rate = r.option("run.max_user_rate")
    if r.given("run.max_user_rate") and not (concurrency and r.given("run.duration")):
        r.bad("run.max_user_rate", "only applies to a closed loop bounded by a duration (run.concurrency with "
              "run.duration: --concurrency N --duration D)")
    if concurrency and r.get("run.max_concurrency") not in (None, 0, "0"):
        r.bad("run.max_concurrency", "give concurrency (closed loop, N users) or max_concurrency (a cap on an "
              "open loop), not both")
    if concurrency and isinstance(r.raw.get("session"), dict):
        r.bad("run.concurrency", "a closed loop cannot replay [session] conversations (their turns are timed "
              "by their own replies)")
    if think_ns and not concurrency:
        r.bad("run.think_time", "only applies to a closed loop (run.concurrency / --concurrency N)")
    warmup = r.option("run.warmup_requests")
    if requests is not None and warmup >= requests:
        r.bad("run.warmup_requests", f"must be less than run.requests ({requests}), got {warmup}")
    return {"requests": requests, "duration_ns": duration_ns, "warmup_requests": warmup,
            "max_concurrency": r.option("run.max_concurrency"), "concurrency": concurrency, "think_ns": think_ns,
            "max_user_rate_per_s": user_rate}


def run_limits(r: Reader) -> dict[str, Any]:
    """[run]: timeouts, the self-check's limits (run/selfcheck.py), the endpoints to scrape: every other
    [run] row."""
    taken = {"run.requests", "run.duration", "run.concurrency", "run.think_time", "run.warmup_requests",
             "run.max_concurrency", "run.max_user_rate", "run.scrape"}
    limits = {o.field: r.option(o.key) for o in OPTIONS
              if o.field and o.key and o.key.startswith("run.") and o.key not in taken}
    return limits | {"scrape": r.option("run.scrape") or ()}   # no endpoint: an empty tuple


def request(r: Reader) -> dict[str, Any]:
    """[request]: the API key's variable and extra body fields."""
    api_key_env = r.get("request.api_key_env")
    if api_key_env is not None and (not isinstance(api_key_env, str) or not api_key_env):
        r.bad("request.api_key_env", f"must be the name of an environment variable, got {api_key_env!r}")
    extra_body = r.get("request.extra_body", {})
    if not isinstance(extra_body, dict):
        r.bad("request.extra_body", f"must be a table, got {extra_body!r}")
        extra_body = {}
    for reserved in sorted(set(extra_body) & RESERVED_BODY):
        r.bad(f"request.extra_body.{reserved}", "is set by loadgen itself and may not be overridden here")
    for key in STRUCTURED_BODY:
        if key in extra_body and r.given(f"request.{key}"):
            r.bad(f"request.extra_body.{key}", f"given twice: request.{key} sets it (and has each reply judged)")
    return {"api_key_env": api_key_env, "extra_body": extra_body}


def prompt(r: Reader, skip_lengths: bool) -> dict[str, Any]:
    """[prompt] and [output]: the lengths (unless a trace or [[mix]] gives them), the tokenizer, the dataset."""
    tokenizer = r.option("prompt.tokenizer")
    tokenizer_file = r.get("prompt.tokenizer_file")
    if tokenizer == "local" and not isinstance(tokenizer_file, str):
        r.bad("prompt.tokenizer_file", "missing: tokenizer = \"local\" needs the path of a tokenizer.json")
    if isinstance(tokenizer_file, str):
        tokenizer_file = str(r.base_dir / tokenizer_file)
        if tokenizer == "auto":
            tokenizer = "local"
    dataset = r.get("prompt.dataset")
    if dataset is not None:
        if not isinstance(dataset, str) or not is_file(r.base_dir / dataset):
            r.bad("prompt.dataset", f"no such file {str(r.base_dir / str(dataset))!r} (a ShareGPT-format JSON file)")
        else:
            dataset = str(r.base_dir / dataset)
    # a pooling API (embeddings, rerank) generates nothing: output length 0, never read from the file
    # (config/pooling.py refuses one); the manifest's config.output_tokens says 0
    generates = r.api() not in POOLING_APIS
    output = (r.lengths("output.tokens") if not skip_lengths else Lengths(value=1)) if generates else Lengths(value=0)
    return {"prompt_tokens": r.lengths("prompt.tokens") if not skip_lengths else Lengths(value=1),
            "output_tokens": output,
            "tokenizer": tokenizer, "tokenizer_file": tokenizer_file if isinstance(tokenizer_file, str) else None,
            "dataset": dataset if isinstance(dataset, str) else None, "prompt_salt": r.option("prompt.salt")}
