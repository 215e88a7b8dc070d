"""`loadgen report` on a synthetic run of N chunk rows (64 chunks per request): seconds and peak memory.

The report runs in a fresh child of a fresh wrapper process, so ru_maxrss of the wrapper's children is
the report's own peak resident memory.
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import orjson
import polars as pl

from loadgen.results.folder import REQUEST_SCHEMA, TOKEN_SCHEMA

CHUNKS_PER_REQUEST = 64
_MEASURE = ("import resource, subprocess, sys, time; t = time.perf_counter(); "
            "p = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE); "
            "s = time.perf_counter() - t; "
            "u = resource.getrusage(resource.RUSAGE_CHILDREN); "
            "print(p.returncode, s, u.ru_maxrss, u.ru_utime + u.ru_stime, p.stderr[-500:])")


def make_run(path: Path, chunk_rows: int, seed: int = 0) -> int:
    rng = np.random.default_rng(seed)
    n = chunk_rows // CHUNKS_PER_REQUEST
    ids = pl.Series("request_id", [f"synt-{i:08d}" for i in range(n)])
    intended = np.cumsum(rng.exponential(1e9 / 1000, n)).astype(np.int64)
    lag = rng.integers(0, 200_000, n)
    first = intended + lag + 20_000_000 + rng.integers(0, 5_000_000, n)
    gaps = rng.gamma(4.0, 5e6 / 4, (n, CHUNKS_PER_REQUEST)).astype(np.int64)
    gaps[:, 0] = 0
    t = first[:, None] + np.cumsum(gaps, axis=1)
    last = t[:, -1]
    null_i64 = pl.Series([None] * n, dtype=pl.Int64)
    cols = {
        "request_id": ids, "idx": np.arange(n), "worker": np.zeros(n, np.int32), "warmup": np.zeros(n, bool),
        "intended_ns": intended, "dispatched_ns": intended + lag, "connected_ns": intended + lag + 1000,
        "sent_ns": intended + lag + 30_000, "response_ns": first - 1000, "first_token_ns": first,
        "last_token_ns": last, "done_ns": last + 1000, "slot_wait_ns": null_i64, "outcome": ["ok"] * n,
        "http_status": np.full(n, 200, np.int32), "error_kind": pl.Series([None] * n, dtype=pl.String),
        "error_detail": pl.Series([None] * n, dtype=pl.String), "planned_prompt_tokens": np.full(n, 128),
        "prompt_tokens": np.full(n, 128), "max_tokens": np.full(n, 64), "output_tokens": np.full(n, 64),
        "n_chunks": np.full(n, 64), "server_queue_ms": pl.Series([None] * n, dtype=pl.Float64),
        "server_prefill_ms": pl.Series([None] * n, dtype=pl.Float64),
        "server_decode_ms": pl.Series([None] * n, dtype=pl.Float64)}
    for name, dtype in REQUEST_SCHEMA.items():  # columns of other features (sessions, prefixes): null
        cols.setdefault(name, pl.Series([None] * n, dtype=dtype))
    req = pl.DataFrame(cols, schema=REQUEST_SCHEMA)
    req.write_parquet(path / "requests.parquet")
    tok = pl.DataFrame({"request_id": ids.gather(np.repeat(np.arange(n), CHUNKS_PER_REQUEST)),
                        "idx": np.tile(np.arange(CHUNKS_PER_REQUEST, dtype=np.int32), n),
                        "t_ns": t.ravel(), "n_tokens": np.ones(n * CHUNKS_PER_REQUEST, np.int32)}, schema=TOKEN_SCHEMA)
    tok.write_parquet(path / "tokens.parquet")
    (path / "manifest.json").write_bytes(orjson.dumps({
        "schema_version": 1, "status": "complete", "invalid_reasons": [], "config": {"name": "synthetic"},
        "target": {"url": "synthetic"}, "t0": {"monotonic_ns": 0}}))
    return n


def run(chunk_rows: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="lgbench-analysis-") as d:
        path = Path(d)
        n = make_run(path, chunk_rows)
        out = subprocess.run([sys.executable, "-c", _MEASURE, sys.executable, "-m", "loadgen", "report", str(path),
                              "--format", "json"], capture_output=True, text=True, check=True).stdout.split(" ", 4)
    rc, seconds, maxrss_kib, cpu_s = int(out[0]), float(out[1]), int(out[2]), float(out[3])
    # cpu_s (user + sys, all threads) says what the report costs when the host is shared and busy
    return {"chunk_rows": n * CHUNKS_PER_REQUEST, "requests": n, "seconds": seconds, "cpu_s": cpu_s,
            "peak_rss_mib": maxrss_kib / 1024, "report_exit": rc, "stderr_tail": out[4].strip() if rc else "",
            "load_average": os.getloadavg()[0]}


if __name__ == "__main__":
    print(run(int(sys.argv[1]) if len(sys.argv) > 1 else 10_000_000))
