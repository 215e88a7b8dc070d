"""The one frozen RunConfig a run is described by, and its parts. Defaults of the fields an option sets
come from the option table (options.py) so that each is written once; workload.py builds a RunConfig
from a workload file and flags, with_overrides() changes one after loading, validated again."""
from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field

from loadgen.config.credentials import redact_url
from loadgen.config.lengths import Lengths
from loadgen.config.options import default

PROCESSES = ("poisson", "constant", "gamma", "ramp", "stages", "trace")   # loadgen/plan/arrivals.py
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
    skip_bad_rows: bool = default("trace.skip_bad_rows")
    lengths: bool = True                    # take prompt/output lengths from the trace too


@dataclass(frozen=True)
class MixClass:
    weight: float                           # normalized over all classes
    prompt: Lengths
    output: Lengths
    name: str = ""                          # the rows' `class`; parts.mix fills "mix<i>" when not given
    model: str | None = None                # sent as the body's model (e.g. a LoRA adapter); None: the run's
    priority: int | None = None             # sent as the body's `priority` (vLLM: lower is served first)


@dataclass(frozen=True)
class PrefixSpec:
    tokens: int                             # K, counted inside each sharing request's prompt length
    groups: int = 1
    fraction: float = 1.0


@dataclass(frozen=True)
class SessionSpec:
    turns: Lengths                  # requests per conversation (agentic: tool rounds included)
    think_ms: Lengths               # wait after a reply before the next user message
    # agentic sessions (max_tool_rounds >= 1; 0 = off): a reply with tool calls is answered by a request
    # carrying one `role: tool` result per call, tool_latency_ms after that reply's end; at most
    # max_tool_rounds such requests in a row (plan/bodies.py, client/runner.py)
    max_tool_rounds: int = 0
    tool_latency_ms: Lengths | None = None   # the tool's latency, drawn per request (None: not agentic)
    tool_result_tokens: Lengths | None = None  # tokens of a request's tool results, drawn per request

    @property
    def agentic(self) -> bool:
        return self.max_tool_rounds > 0


@dataclass(frozen=True)
class AbandonSpec:
    """[abandon]: users who give up on a reply. Each request is abandoned with probability `share`; an
    abandoned one is cut off (its connection closed) `after_ms` after its dispatch, or once `after_tokens`
    output events of its stream have arrived: exactly one of the two is set."""
    share: float
    after_ms: Lengths | None = None
    after_tokens: Lengths | None = None


IMAGE_FILLS = ("noise", "flat")   # plan/images.py


@dataclass(frozen=True)
class ImageSpec:
    """[image]: chat requests carrying images. A request carries images with probability `share`: `count`
    of them, each `width` x `height` pixels (drawn per request), generated from the seed (plan/images.py)."""
    share: float
    count: Lengths
    width: Lengths
    height: Lengths
    fill: str = "noise"   # noise: incompressible pixels (a photo's wire size); flat: one colour (tiny)


@dataclass(frozen=True)
class RerankSpec:
    """[rerank] (api = "rerank"): each request ranks `documents` documents (a count drawn per request) of
    `document_tokens` tokens each (drawn per document) against its query, whose length is prompt.tokens
    (config/pooling.py; plan/schedule.py draws them, plan/bodies.py writes their text)."""
    documents: Lengths
    document_tokens: Lengths


@dataclass(frozen=True)
class StructuredSpec:
    """[request] tools, tool_choice, response_format (config/structured.py); plan/structured.py builds the
    body fields from it, generated ones deterministic from the seed."""
    tools_file: str | None = None           # the tools' JSON file (resolved path), whose definitions are `tools`
    tools: tuple = ()                       # OpenAI tool definitions, as the file holds them
    generate_tools: int = 0                 # or: this many generated tools (tool_0 ..) ...
    tool_parameters: int = 0                # ... each with this many parameters
    tool_choice: str | None = None          # auto | required | none | a declared function's name; None: not sent
    schema_file: str | None = None          # response_format's JSON schema file (resolved path)
    schema: dict | None = None              # its schema
    schema_name: str = ""                   # json_schema.name (the file's stem, or its own name)
    schema_properties: int = 0              # or: a generated schema with this many properties

    @property
    def has_tools(self) -> bool:
        return bool(self.tools or self.generate_tools)

    @property
    def has_schema(self) -> bool:
        return self.schema is not None or bool(self.schema_properties)


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
    warmup_requests: int = default("warmup_requests")
    max_concurrency: int = default("max_concurrency")       # 0 = unlimited (pure open loop)
    request_timeout_ns: int = default("request_timeout_ns")
    drain_timeout_ns: int = default("drain_timeout_ns")
    max_send_lag_p99_ns: int = default("max_send_lag_p99_ns")   # run/selfcheck.py's limits
    max_rate_deviation: float = default("max_rate_deviation")
    max_cv_deviation: float = default("max_cv_deviation")
    max_lag_share: float = default("max_lag_share")
    lag_floor_ns: int = default("lag_floor_ns")
    max_error_rate: float = default("max_error_rate")      # run/ending.py's error verdict
    api_key_env: str | None = None
    extra_body: dict = field(default_factory=dict)
    structured: StructuredSpec | None = None   # [request] tools / tool_choice / response_format
    url: str | None = None          # None: start the built-in simulator
    out: str | None = None
    sim_args: tuple[str, ...] = default("sim_args")  # flags for the built-in simulator when url is None
    source: str = ""                # the workload file, for messages and the manifest
    # backend family, idle-server calibration, /metrics scraping
    backend: str = default("backend")         # openai | ollama | llamacpp
    calibrate: bool = default("calibrate")    # probe the idle server before the run (probe/calibrate.py)
    scrape_metrics: bool = default("scrape_metrics")   # sample the target's /metrics (probe/scrape.py)
    scrape_interval_ns: int = default("scrape_interval_ns")
    metrics_port: int | None = default("metrics_port")   # serve live figures for Prometheus (run/exporter.py)
    metrics_host: str = default("metrics_host")
    scrape: tuple[str, ...] = ()    # more Prometheus endpoints (DCGM, node exporter): telemetry.parquet
    workers: int = default("workers")   # generator processes (run/workers.py); 0 = auto, picked by rate
    repeat: int = default("repeat")     # run the workload this many times (run/repeat.py); 1 = once
    ray: str | None = None          # Ray cluster address or "auto" (run/ray_workers.py); None = local processes
    # production-shaped workloads (all optional)
    trace: TraceSpec | None = None
    mix: tuple[MixClass, ...] = ()
    prefix: PrefixSpec | None = None
    session: SessionSpec | None = None
    abandon: AbandonSpec | None = None
    image: ImageSpec | None = None
    rerank: RerankSpec | None = None   # api = "rerank": its documents (None for every other API)
    tokenizer: str = default("tokenizer")
    prompt_salt: int | None = None  # prompt texts' salt (plan/bodies.py); None until run_workload draws one
    tokenizer_file: str | None = None
    dataset: str | None = None
    # closed loop (N virtual users) and the SLOs a run is judged by
    concurrency: int = default("concurrency")   # > 0: closed loop, N users each sending when its reply ends
    think_ns: int = default("think_ns")         # closed loop: a user's pause between a reply and its next request
    # closed loop bounded by duration: requests per user per second of the duration in its pool (plan/pool.py)
    max_user_rate_per_s: float = default("max_user_rate_per_s")
    pool_users: int = 0   # a --workers share of such a loop: the whole run's users, whose pool it shares (0: its own)
    slo: tuple[tuple[str, float], ...] = ()  # (metric, bound ms), analysis/goodput.py
    # the target's context limit (plan/context.py): the policy is an option, the limit is asked of the
    # target once per run (run/prepare.py); context_source "" = not asked (no check, e.g. `loadgen schedule`)
    over_context: str = default("over_context")   # error | clip | drop
    context_limit: int | None = None              # tokens of prompt + max_tokens per request; None: unpublished
    context_source: str = ""                      # where the limit was read, or why there is none

    def api_key(self) -> str | None:
        return os.environ.get(self.api_key_env) if self.api_key_env else None

    def to_manifest(self) -> dict:
        # The resolved config as written to manifest.json: the key's variable name, never its value;
        # credentials in the URL are redacted.
        d = asdict(self)
        d["url"] = redact_url(self.url) if self.url else None
        d["scrape"] = [redact_url(u) for u in self.scrape]
        return d
