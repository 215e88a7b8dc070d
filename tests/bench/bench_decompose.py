"""How long the decomposition takes on 10 million chunk rows (docs/design.md: "in seconds").

    python -m tests.bench.bench_decompose   (also run by `make bench`) [--chunks 10000000]

Synthetic run: requests of 200 chunks each, 64 streams overlapping at any time, 10 ms steps, every
50th step longer (a prefill), with a calibration so the step-boundary walk and the stall join both run.
Prints one JSON line: rows, requests, seconds.
"""
from __future__ import annotations

import argparse
import time

import numpy as np
import orjson
import polars as pl

from loadgen.analysis.decompose import aggregate, decompose
from loadgen.results.folder import REQUEST_SCHEMA, Run

MS = 1_000_000


def synthetic(chunks: int, per_request: int = 200, overlap: int = 64) -> Run:
    n = chunks // per_request
    rng = np.random.default_rng(1)
    start = (np.arange(n) * (per_request * 10 * MS // overlap)).astype(np.int64)
    steps = np.arange(per_request, dtype=np.int64) * 10 * MS
    t = (start[:, None] + 30 * MS + steps[None, :])
    t += ((t // (10 * MS)) % 50 == 0) * 25 * MS  # a prefill stretches every 50th step
    ids = np.array([f"r{i:07d}" for i in range(n)])
    tokens = pl.DataFrame({"request_id": np.repeat(ids, per_request), "idx": np.tile(np.arange(per_request), n),
                           "t_ns": t.ravel(), "n_tokens": np.ones(n * per_request, dtype=np.int32)},
                          schema={"request_id": pl.String, "idx": pl.Int32, "t_ns": pl.Int64, "n_tokens": pl.Int32})
    prompt = rng.integers(64, 2048, n)
    req = pl.DataFrame({
        "request_id": ids, "idx": np.arange(n), "worker": np.zeros(n, dtype=np.int32),
        "warmup": np.zeros(n, dtype=bool),
        "intended_ns": start, "dispatched_ns": start, "connected_ns": start, "sent_ns": start, "response_ns": start,
        "first_token_ns": t[:, 0], "last_token_ns": t[:, -1], "done_ns": t[:, -1], "slot_wait_ns": None,
        "outcome": "ok", "http_status": 200, "error_kind": None, "error_detail": None,
        "planned_prompt_tokens": prompt, "prompt_tokens": prompt, "max_tokens": per_request,
        "output_tokens": per_request, "n_chunks": per_request,
        "server_queue_ms": None, "server_prefill_ms": None, "server_decode_ms": None,
    }, schema_overrides=REQUEST_SCHEMA)
    # columns of other features (workload shape, ...) stay null
    req = req.with_columns(pl.lit(None, dtype).alias(c) for c, dtype in REQUEST_SCHEMA.items() if c not in req.columns)
    req = req.select(list(REQUEST_SCHEMA)).cast(REQUEST_SCHEMA)
    return Run(None, {"status": "complete"}, req, tokens)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--chunks", type=int, default=10_000_000)
    args = ap.parse_args()
    run = synthetic(args.chunks)
    cal = {"prefill_ms": {"coef": [5.0, 0.01]}, "itl_ms": {"coef": [10.0]}}
    t = time.perf_counter()
    d = decompose(run, cal)
    aggregate(d)
    s = time.perf_counter() - t
    print(orjson.dumps({"bench": "decompose", "chunk_rows": run.tokens.height, "requests": d.height,
                        "stalled": int((d["decode_stalls_ms"] > 0).sum()), "seconds": round(s, 2)}).decode())


if __name__ == "__main__":
    main()
