"""Workload files (TOML) and the one frozen RunConfig a run is described by.

A workload file (see workloads/quickstart.toml):

    name = "quickstart"            # optional, defaults to the file's stem
    model = "sim-llama-8b"
    api = "chat"                   # completions | chat
    seed = 42

    [arrivals]
    process = "poisson"            # poisson | constant | gamma
    rate = "8/s"
    burstiness = 1.0               # gamma only: CV of the gaps = 1/sqrt(burstiness)

    [run]
    requests = 200                 # or duration = "30s" (exactly one of them)
    warmup_requests = 0            # the first N requests are sent but left out of statistics
    max_concurrency = 0            # 0 = unlimited (pure open loop)
    request_timeout = "120s"
    drain_timeout = "30s"          # after the last intended send, in-flight requests get this long
    max_send_lag_p99 = "5ms"       # above it the run is invalid: the generator fell behind (selfcheck.py)

    [prompt]
    tokens = 128                   # or { dist = "uniform", min = 64, max = 512 }

    [output]
    tokens = 64                    # sent as max_tokens, same forms as prompt.tokens

    [request]
    api_key_env = "OPENAI_API_KEY" # the key is read from this variable, never written anywhere
    extra_body = { ignore_eos = true }

validate() returns every problem at once, each naming the file and key (or the CLI flag that set it).
"""
from __future__ import annotations

import os
import tomllib
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from loadgen.arrivals import PROCESSES
from loadgen.units import parse_duration_ns, parse_rate_per_s

APIS = ("completions", "chat")
LENGTH_DISTS = ("fixed", "uniform")


class ConfigError(Exception):
    """Invalid workload or flags; .problems lists every one, each a full sentence naming its source."""

    def __init__(self, problems: list[str]):
        super().__init__("\n".join(problems))
        self.problems = problems


@dataclass(frozen=True)
class Lengths:
    dist: str = "fixed"
    value: int = 0      # fixed
    min: int = 0        # uniform, inclusive
    max: int = 0        # uniform, inclusive


@dataclass(frozen=True)
class Arrivals:
    process: str = "poisson"
    rate_per_s: float = 1.0
    burstiness: float = 1.0


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
    api_key_env: str | None = None
    extra_body: dict = field(default_factory=dict)
    url: str | None = None          # None: start the built-in simulator
    out: str | None = None
    sim_args: tuple[str, ...] = ()  # flags for the built-in simulator when url is None
    source: str = ""                # the workload file, for messages and the manifest

    def api_key(self) -> str | None:
        return os.environ.get(self.api_key_env) if self.api_key_env else None

    def to_manifest(self) -> dict:
        # The resolved config as written to manifest.json: the key's variable name, never its value;
        # credentials in the URL are redacted.
        d = asdict(self)
        d["url"] = redact_url(self.url) if self.url else None
        return d


def redact_url(url: str) -> str:
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    if parts.username or parts.password:
        host = parts.hostname or ""
        if parts.port:
            host = f"{host}:{parts.port}"
        parts = parts._replace(netloc=f"***@{host}")
    return urlunsplit(parts)


# The keys a workload file may hold, per table; anything else is reported (typos must not pass silently).
_KEYS = {
    "": {"name", "model", "api", "seed", "arrivals", "run", "prompt", "output", "request"},
    "arrivals": {"process", "rate", "burstiness"},
    "run": {"requests", "duration", "warmup_requests", "max_concurrency", "request_timeout", "drain_timeout",
            "max_send_lag_p99"},
    "prompt": {"tokens"},
    "output": {"tokens"},
    "request": {"api_key_env", "extra_body"},
}

# CLI flag -> key path in the workload, so a bad flag value is reported under the flag's name.
FLAG_KEYS = {
    "--model": "model", "--api": "api", "--seed": "seed", "--rate": "arrivals.rate",
    "--requests": "run.requests", "--duration": "run.duration", "--max-concurrency": "run.max_concurrency",
    "--prompt-tokens": "prompt.tokens", "--max-tokens": "output.tokens",
    "--warmup-requests": "run.warmup_requests", "--max-send-lag-p99": "run.max_send_lag_p99",
}


def load(path: str | Path, overrides: dict[str, Any] | None = None, *, url: str | None = None,
         out: str | None = None, sim_args: tuple[str, ...] = ()) -> RunConfig:
    """Read a workload file, apply CLI overrides ({flag: value}), validate; raise ConfigError."""
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError([f"{path}: no such workload file"]) from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ConfigError([f"{path}: not valid TOML: {e}"]) from None
    sources: dict[str, str] = {}
    for flag, value in (overrides or {}).items():
        if value is None:
            continue
        key = FLAG_KEYS[flag]
        table, _, leaf = key.rpartition(".")
        target = raw.setdefault(table, {}) if table else raw
        if not isinstance(target, dict):
            continue  # validate() reports the table itself
        if key in ("run.duration", "run.requests"):
            # --duration and --requests replace each other: the flag wins over the file's bound.
            raw["run"].pop("requests" if leaf == "duration" else "duration", None)
        target[leaf] = value
        sources[key] = flag
    return validate(raw, str(path), sources, url=url, out=out, sim_args=sim_args)


def validate(raw: dict, source: str, sources: dict[str, str] | None = None, *, url: str | None = None,
             out: str | None = None, sim_args: tuple[str, ...] = ()) -> RunConfig:
    sources = sources or {}
    problems: list[str] = []

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

    def choice(key: str, options: tuple[str, ...], default: str | None) -> str:
        v = get(key, default)
        if v is None:
            bad(key, f"missing (one of: {', '.join(options)})")
            return options[0]
        if v not in options:
            bad(key, f"must be one of {', '.join(options)}, got {v!r}")
            return options[0]
        return v

    def lengths(key: str, default: int | None) -> Lengths:
        v = get(key, default)
        if isinstance(v, str):
            v = _parse_length_flag(v)
        if v is None:
            bad(key, "missing")
            return Lengths(value=1)
        if isinstance(v, int) and not isinstance(v, bool):
            if v < 1:
                bad(key, f"must be >= 1, got {v}")
            return Lengths(value=v)
        if isinstance(v, dict):
            dist = v.get("dist", "fixed")
            if dist not in LENGTH_DISTS:
                bad(f"{key}.dist", f"must be one of {', '.join(LENGTH_DISTS)}, got {dist!r}")
                return Lengths(value=1)
            extra = set(v) - {"dist", "value", "min", "max"}
            for k in sorted(extra):
                bad(f"{key}.{k}", "unknown key (expected dist, value, min, max)")
            def part(name: str) -> int:
                if name not in v:
                    bad(f"{key}.{name}", "missing")
                    return 1
                return integer(f"{key}.{name}", 1, 1, v[name]) or 1
            if dist == "fixed":
                return Lengths(value=part("value"))
            lo, hi = part("min"), part("max")
            if lo > hi:
                bad(key, f"min ({lo}) must be <= max ({hi})")
            return Lengths("uniform", min=lo, max=hi)
        bad(key, f"must be an integer or a table like {{ dist = \"uniform\", min = 64, max = 512 }}, got {v!r}")
        return Lengths(value=1)

    model = get("model")
    if not isinstance(model, str) or not model:
        bad("model", f"must be a non-empty string, got {model!r}")
    api = choice("api", APIS, "completions")
    seed = integer("seed", 0, 0)
    process = choice("arrivals.process", PROCESSES, "poisson")
    rate = 1.0
    if get("arrivals.rate") is None:
        bad("arrivals.rate", "missing (e.g. rate = \"8/s\")")
    else:
        try:
            rate = parse_rate_per_s(get("arrivals.rate"))
        except ValueError as e:
            bad("arrivals.rate", str(e))
    burstiness = get("arrivals.burstiness", 1.0)
    if isinstance(burstiness, bool) or not isinstance(burstiness, (int, float)) or not burstiness > 0:
        bad("arrivals.burstiness", f"must be a number > 0, got {burstiness!r}")
        burstiness = 1.0
    requests = integer("run.requests", None, 1)
    duration_ns = duration("run.duration", None)
    if (get("run.requests") is None) == (get("run.duration") is None):
        bad("run", "give exactly one of requests or duration")
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
    config = RunConfig(
        name=get("name") or Path(source).stem,
        model=model if isinstance(model, str) else "",
        api=api,
        seed=seed or 0,
        arrivals=Arrivals(process, rate, float(burstiness)),
        prompt_tokens=lengths("prompt.tokens", None),
        output_tokens=lengths("output.tokens", None),
        requests=requests,
        duration_ns=duration_ns,
        warmup_requests=warmup,
        max_concurrency=max_conc,
        request_timeout_ns=duration("run.request_timeout", 120_000_000_000),
        drain_timeout_ns=duration("run.drain_timeout", 30_000_000_000),
        max_send_lag_p99_ns=duration("run.max_send_lag_p99", 5_000_000),
        api_key_env=api_key_env,
        extra_body=extra_body,
        url=url,
        out=out,
        sim_args=tuple(sim_args),
        source=source,
    )
    if url is not None and not url.startswith(("http://", "https://")):
        problems.append(f"--url: must start with http:// or https://, got {url!r}")
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
