"""Prometheus `/metrics` sampler (`loadgen run --scrape-metrics`, `--scrape URL`) and the names that matter
per server.

During the run, GET {base}/metrics every interval (500 ms by default) and keep every sample as a row
    t_ns    int64, monotonic ns from t0 at the moment the response was read
    name    sample name as exposed (`vllm:num_requests_waiting`, `..._bucket`, `..._sum`, `..._total`), but
            for a counter whose exposed name lacks `_total`: prometheus_client's parser appends it
            (dcgm-exporter's `DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION` is stored as `..._CONSUMPTION_total`)
    labels  the sample's labels, canonical text `k="v",k2="v2"` sorted by key ("" when none)
    value   float64
written to `server_metrics.parquet` at the end of the run. Every `--scrape URL` endpoint (a DCGM exporter,
a node exporter) is sampled the same way by a Scraper of its own, on the same clock and interval, into
`telemetry.parquet`: the same rows with `source`, the endpoint's URL (credentials redacted). Parsing is
prometheus_client's text-format parser, run after the load ends: during the run a scrape only reads the
bytes (parsing a vLLM exposition costs milliseconds of CPU on the event loop that stamps tokens and
dispatches on schedule). A failed scrape is counted (manifest `scrape.errors`, `telemetry[i].errors`),
never fatal: the server's health (or an exporter's) must not decide whether the load run completes.

Metric names by server: the NAMES table below (vLLM V1; SGLang; llama.cpp's server with `--metrics`;
TGI), one row per concept, None where a server does not expose it. Names move between releases (vLLM
V0's `vllm:gpu_cache_usage_perc` became `vllm:kv_cache_usage_perc`); WAITING, RUNNING and KV_USAGE
list every name the analysis accepts.
"""
from __future__ import annotations

import asyncio
import time

import aiohttp
import polars as pl
from prometheus_client.parser import text_string_to_metric_families

from loadgen.config.options import default

SERVERS = ("vllm", "sglang", "llamacpp", "tgi")
NAMES: dict[str, tuple[str | None, ...]] = {  # concept -> names in SERVERS order
    "requests_running": ("vllm:num_requests_running", "sglang:num_running_reqs",
                         "llamacpp:requests_processing", "tgi_batch_current_size"),
    "requests_waiting": ("vllm:num_requests_waiting", "sglang:num_queue_reqs",
                         "llamacpp:requests_deferred", "tgi_queue_size"),
    "kv_usage_0_to_1": ("vllm:kv_cache_usage_perc", "sglang:token_usage", "llamacpp:kv_cache_usage_ratio", None),
    "ttft_histogram": ("vllm:time_to_first_token_seconds", "sglang:time_to_first_token_seconds", None, None),
    "itl_histogram": ("vllm:inter_token_latency_seconds", "sglang:inter_token_latency_seconds", None,
                      "tgi_request_mean_time_per_token_duration"),
    "e2e_histogram": ("vllm:e2e_request_latency_seconds", "sglang:e2e_request_latency_seconds", None,
                      "tgi_request_duration"),
    "queue_time": ("vllm:request_queue_time_seconds", "sglang:queue_time_seconds", None,
                   "tgi_request_queue_duration"),
    "prefill_time": ("vllm:request_prefill_time_seconds", None, "llamacpp:prompt_seconds_total",
                     'tgi_batch_inference_duration{method="prefill"}'),
    "decode_time": ("vllm:request_decode_time_seconds", None, "llamacpp:tokens_predicted_seconds_total",
                    'tgi_batch_inference_duration{method="decode"}'),
    "preemptions": ("vllm:num_preemptions_total", None, None, None),
    "prompt_tokens": ("vllm:prompt_tokens_total", "sglang:prompt_tokens_total", "llamacpp:prompt_tokens_total",
                      "tgi_request_input_length"),
    "generated_tokens": ("vllm:generation_tokens_total", "sglang:generation_tokens_total",
                         "llamacpp:tokens_predicted_total", "tgi_request_generated_tokens"),
}
WAITING = tuple(n for n in NAMES["requests_waiting"] if n)
RUNNING = tuple(n for n in NAMES["requests_running"] if n)
KV_USAGE = (*(n for n in NAMES["kv_usage_0_to_1"] if n), "vllm:gpu_cache_usage_perc")
# The gauges a live view shows (run/live.py), each the sum over its samples' label sets (engines, models).
LIVE_GAUGES = {"running": RUNNING, "waiting": WAITING, "kv_usage": KV_USAGE}
SCHEMA = {"t_ns": pl.Int64, "name": pl.String, "labels": pl.String, "value": pl.Float64}
TELEMETRY_SCHEMA = {"t_ns": pl.Int64, "source": pl.String, "name": pl.String, "labels": pl.String,
                    "value": pl.Float64}


def metrics_url(base_url: str) -> str:
    """The server's /metrics: beside its /v1 API."""
    return base_url.rstrip("/").removesuffix("/v1") + "/metrics"


def parse(text: str, t_ns: int) -> list[tuple[int, str, str, float]]:
    """Every sample of a text exposition as (t_ns, name, labels, value). Raises ValueError on bad text."""
    out = []
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
            out.append((t_ns, s.name, labels, float(s.value)))
    return out


def gauges(text: str) -> dict[str, float]:
    """LIVE_GAUGES found in an exposition, by string search (str.find, no full parse: cheap enough to run
    once a second during the run, in the flush thread). A gauge the text lacks is left out."""
    out: dict[str, float] = {}
    for concept, names in LIVE_GAUGES.items():
        for name in names:
            total, found, at = 0.0, False, text.find(name)
            while at >= 0:
                end = text.find("\n", at)
                line = text[at:end if end >= 0 else len(text)]
                starts_line = at == 0 or text[at - 1] == "\n"
                rest = line[len(name):]
                if starts_line and rest[:1] in ("{", " "):
                    # `name{labels} value [timestamp]`: the value is the first field after the labels
                    fields = (rest[rest.rfind("}") + 1:] if rest[:1] == "{" else rest).split()
                    try:
                        total += float(fields[0])
                        found = True
                    except (IndexError, ValueError):
                        pass
                at = text.find(name, at + len(name))
            if found:
                out[concept] = total
                break
    return out


def frame(rows: list[tuple[int, str, str, float]]) -> pl.DataFrame:
    return pl.DataFrame(rows, schema=SCHEMA, orient="row")


class Scraper:
    """Samples one endpoint (url: the exposition's own URL, without credentials: send them in headers);
    `source` names it in telemetry.parquet, messages and the manifest (the URL, its credentials redacted).
    Reads are stamped on the monotonic clock and made relative to t0_ns when parsed (frame), so a sample
    may be taken before t0 is known (its value may be set after construction)."""

    def __init__(self, url: str, t0_ns: int, interval_ns: int = default("scrape_interval_ns"),
                 headers: dict[str, str] | None = None, tls=True, *, now_ns=time.monotonic_ns,
                 source: str | None = None):
        self.now_ns = now_ns
        self.url = url
        self.source = source or url
        self.tls = tls  # aiohttp's ssl= (config/client.py)
        self.t0_ns, self.interval_s = t0_ns, interval_ns / 1e9
        self.headers = headers or {}
        self.texts: list[tuple[int, str]] = []
        self.scrapes = self.errors = 0
        self.last_error: str | None = None
        self._stop = asyncio.Event()

    async def scrape_once(self, session: aiohttp.ClientSession) -> None:
        try:
            async with session.get(self.url, headers=self.headers, ssl=self.tls) as resp:
                text = await resp.text()
                t = self.now_ns()
                if resp.status != 200:
                    raise ValueError(f"HTTP {resp.status}")
            self.texts.append((t, text))
            self.scrapes += 1
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as e:
            self.errors += 1
            self.last_error = f"{self.source}: {type(e).__name__}: {e}"

    async def run(self) -> None:
        """Every interval until stop(). A scrape in flight then is finished, not cancelled (its timeout bounds
        it): what the endpoint served is read, never lost between its answer and our read. One last sample
        is taken by `sample`."""
        timeout = aiohttp.ClientTimeout(total=max(2.0, self.interval_s * 4))
        async with aiohttp.ClientSession(timeout=timeout) as session:
            while not self._stop.is_set():
                start = time.monotonic()
                await self.scrape_once(session)
                try:
                    await asyncio.wait_for(self._stop.wait(), max(0.0, self.interval_s - (time.monotonic() - start)))
                except TimeoutError:
                    pass

    def stop(self) -> None:
        """Ends run() after the scrape in flight, if any."""
        self._stop.set()

    def latest_gauges(self) -> dict[str, float]:
        """The live gauges of the latest scrape ({} before the first)."""
        texts = self.texts
        return gauges(texts[-1][1]) if texts else {}

    async def sample(self) -> None:
        """One sample now, on a session of its own (before t0, or the last one after the run)."""
        timeout = aiohttp.ClientTimeout(total=5)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            await self.scrape_once(session)

    def frame(self) -> pl.DataFrame:
        """Parse what was read; an exposition that does not parse counts as a failed scrape."""
        rows: list[tuple[int, str, str, float]] = []
        for t, text in self.texts:
            try:
                rows += parse(text, t - self.t0_ns)
            except ValueError as e:
                self.errors += 1
                self.scrapes -= 1
                self.last_error = f"{self.source}: not Prometheus text format: {e}"
        return frame(rows)

    def summary(self) -> dict:
        return {"url": self.source, "interval_s": self.interval_s, "scrapes": self.scrapes, "errors": self.errors,
                "last_error": self.last_error}


def telemetry_frame(scrapers: list[Scraper]) -> pl.DataFrame:
    """The rows of every endpoint's samples (Scraper.frame), each with its `source`: telemetry.parquet."""
    frames = [sc.frame().with_columns(pl.lit(sc.source).alias("source")) for sc in scrapers]
    return pl.concat(frames).select(list(TELEMETRY_SCHEMA)) if frames else pl.DataFrame(schema=TELEMETRY_SCHEMA)
