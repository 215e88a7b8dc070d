"""A synthetic results folder of any size, with every input the HTML report draws: requests.parquet,
tokens.parquet, the *.hlog interval logs (written from the rows by hdr.write_interval_log, as a run would),
server_metrics.parquet and a manifest with a config and a generator self-check. Two classes of request:
short prompts with long outputs, and every 25th a long prompt whose prefill stretches the steps of the
streams running at the time (so the decomposition finds stalls and names their causes)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import orjson
import polars as pl

from loadgen.results import hdr
from loadgen.metrics import itl_samples_ns
from loadgen.results.folder import REQUEST_SCHEMA, TOKEN_SCHEMA

MS = 1_000_000


def make_run(path: Path, n: int, *, rate_per_s: float = 200.0, chunks: int = 8, seed: int = 0) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    intended = np.cumsum(rng.exponential(1e9 / rate_per_s, n)).astype(np.int64)
    lag = rng.integers(0, 200_000, n)
    long = np.arange(n) % 25 == 7
    prompt = np.where(long, 8000, 64)
    prefill = np.where(long, 200 * MS, 3 * MS)
    first = intended + lag + 100_000 + rng.integers(0, 4 * MS, n) + prefill
    steps = rng.gamma(4.0, 10 * MS / 4, (n, chunks)).astype(np.int64)
    steps[:, 0] = 0
    t = first[:, None] + np.cumsum(steps, axis=1)
    # a long prompt's prefill stretches the step of every stream decoding while it runs
    long_first = np.sort(first[long])
    hits = np.searchsorted(long_first, t) - np.searchsorted(long_first, t - steps)
    hits[:, 0] = 0
    t += np.cumsum(np.minimum(hits, 1) * 150 * MS, axis=1)
    last = t[:, -1]
    ids = pl.Series("request_id", [f"syn-{i:07d}" for i in range(n)])
    cols = {
        "request_id": ids, "idx": np.arange(n), "worker": np.zeros(n, np.int32), "warmup": np.zeros(n, bool),
        "intended_ns": intended, "dispatched_ns": intended + lag, "connected_ns": intended + lag + 50_000,
        "sent_ns": intended + lag + 60_000, "response_ns": first - 1000, "first_token_ns": first,
        "first_answer_ns": first, "reasoning_tokens": np.zeros(n, np.int64),  # no reasoning: ttfa == ttft
        "last_token_ns": last, "done_ns": last + 1000, "outcome": ["ok"] * n,
        "http_status": np.full(n, 200, np.int32), "planned_prompt_tokens": prompt, "prompt_tokens": prompt,
        "max_tokens": np.full(n, chunks), "output_tokens": np.full(n, chunks), "n_chunks": np.full(n, chunks),
        "server_queue_ms": (first - prefill - intended - lag - 100_000) / MS, "server_prefill_ms": prefill / MS,
        "server_decode_ms": (last - first) / MS}
    for name, dtype in REQUEST_SCHEMA.items():   # columns of other features: null
        cols.setdefault(name, pl.Series([None] * n, dtype=dtype))
    pl.DataFrame(cols, schema=REQUEST_SCHEMA).write_parquet(path / "requests.parquet")
    pl.DataFrame({"request_id": ids.gather(np.repeat(np.arange(n), chunks)),
                  "idx": np.tile(np.arange(chunks, dtype=np.int32), n), "t_ns": t.ravel(),
                  "n_tokens": np.ones(n * chunks, np.int32)},
                 schema=TOKEN_SCHEMA).write_parquet(path / "tokens.parquet")
    done = last + 1000
    values = {"send_lag": lag, "ttft": first - intended, "ttft_from_send": first - intended - lag,
              "e2e": last - intended, "tpot": (last - first) // (chunks - 1)}
    for m, v in values.items():
        hdr.write_interval_log(hdr.log_path(path, m), done, v, start_wall_s=1.7e9)
    owner = np.repeat(np.arange(n), chunks)
    itl = itl_samples_ns(t.ravel(), np.ones(n * chunks, np.int64), owner)
    itl_done = np.repeat(done, chunks - 1)
    hdr.write_interval_log(hdr.log_path(path, "itl"), itl_done, itl, start_wall_s=1.7e9)
    scrapes = np.arange(-1_000 * MS, int(done.max()), 500 * MS)
    running = np.searchsorted(np.sort(intended), scrapes) - np.searchsorted(np.sort(done), scrapes)
    kv = np.clip(running / max(1, running.max()), 0, 1) * 0.9
    rows = [("vllm:num_requests_running", running.astype(float)), ("vllm:num_requests_waiting", running / 10.0),
            ("vllm:kv_cache_usage_perc", kv)]
    pl.DataFrame({"t_ns": np.tile(scrapes, len(rows)), "name": np.repeat([r[0] for r in rows], scrapes.size),
                  "labels": [""] * (scrapes.size * len(rows)), "value": np.concatenate([r[1] for r in rows])}) \
        .write_parquet(path / "server_metrics.parquet")
    (path / "manifest.json").write_bytes(orjson.dumps({
        "schema_version": 1, "status": "complete", "invalid_reasons": [],
        "config": {"name": "synthetic", "model": "synthetic", "api": "completions", "seed": seed,
                   "arrivals": {"process": "poisson", "rate_per_s": rate_per_s}, "requests": n, "warmup_requests": 0},
        "target": {"url": "synthetic"}, "t0": {"monotonic_ns": 0},
        "generator": {"send_lag_p99_ms": float(np.quantile(lag, 0.99)) / MS, "send_lag_max_ms": float(lag.max()) / MS,
                      "overdue": 0, "cv_dispatch": 1.0, "cv_plan": 1.0}}))
    return path
