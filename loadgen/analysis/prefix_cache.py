"""The prefix-cache hit rate of a run, measured, and the rate its workload implies (summary `prefix_cache`).

Measured, token-weighted (0..1), from the server's own counters over the run when it has them (manifest
`prefix_cache`, probe/prefix_cache.py: every request, warm-up included), else from the rows' `cached_tokens`
(usage.prompt_tokens_details.cached_tokens, llama.cpp timings.cache_n) over ok rows: the sum of cached
tokens over the sum of prompt tokens, a row that does not say counting as 0 when any row says.

Expected: the share of sent prompt tokens the workload itself repeats within the run, in dispatch order:
a session's turn repeats its previous turn's prompt and reply (that row's planned_prompt_tokens and
output_tokens: a server that caches the reply's blocks too hits both, so this is the upper bound); a row of
prefix group g repeats the group's `prefix.tokens` once an earlier row of g was sent; every other token is
new (the run's salt, plan/bodies.py, makes texts differ from any other run's). None for a trace with
shared blocks (its hash ids decide) and for a dataset with sessions off (its texts are its own).
A server caches whole blocks (vLLM 16 tokens), so the expected rate is an upper bound up to a block per row.

`mismatch` says when the measured rate is above expected by more than TOLERANCE (the cache was warm:
another run sent the same texts) or below it by more than max(TOLERANCE, half of it) (caching off, or the
shared prefixes were evicted); None when they agree or either is unknown.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import polars as pl

from loadgen import metrics
from loadgen.results.folder import Json, Run

TOLERANCE = 0.05   # absolute, on the 0..1 hit rate


def measured_rate(manifest: Mapping[str, Any], requests: pl.DataFrame) -> tuple[float | None, str | None, Json]:
    """(hit rate 0..1 or None, its source, the per-request figures): the server's counters first."""
    counters = manifest.get("prefix_cache") or {}
    per_request = _per_request(requests)
    if counters.get("hit_rate") is not None:
        return float(counters["hit_rate"]), "server counters", per_request
    if per_request["hit_rate"] is not None:
        return per_request["hit_rate"], "usage cached_tokens", per_request
    return None, None, per_request


def section(run: Run) -> Json:
    config = run.manifest.get("config") or {}
    counters = run.manifest.get("prefix_cache") or {}
    rate, source, per_request = measured_rate(run.manifest, run.requests)
    expected = expected_rate(run.requests, config)
    return {"hit_rate": rate, "source": source, "expected_hit_rate": expected,
            "server": counters or None, "per_request": per_request,
            "prompt_salt": config.get("prompt_salt"), "mismatch": mismatch(rate, expected, source)}


def _per_request(requests: pl.DataFrame) -> Json:
    ok = requests.filter(pl.col("outcome") == "ok")
    said = int(ok["cached_tokens"].is_not_null().sum()) if ok.height else 0
    prompt = int(ok.select(pl.coalesce("prompt_tokens", "planned_prompt_tokens").sum()).item() or 0) if ok.height else 0
    cached = int(ok["cached_tokens"].fill_null(0).sum() or 0) if said else 0
    return {"rows_reporting": said, "cached_tokens": cached if said else None, "prompt_tokens": prompt,
            "hit_rate": cached / prompt if said and prompt else None,
            # cached tokens per reporting request (p50, p90, p99, p999, max, mean; None without any)
            "cached_tokens_per_request": metrics.distribution(ok["cached_tokens"]) if said else None}


def expected_rate(requests: pl.DataFrame, config: Json) -> float | None:
    sent = requests.filter(pl.col("dispatched_ns").is_not_null()).sort("dispatched_ns")
    trace, prefix = config.get("trace"), config.get("prefix")
    if trace is not None and sent["prefix_group"].is_not_null().any() and prefix is None:
        return None  # a trace's shared blocks: its hash ids decide
    if config.get("dataset") and config.get("session") is None:
        return None
    total = int(sent["planned_prompt_tokens"].sum() or 0)
    if not total:
        return None
    prefix_tokens = int(prefix["tokens"]) if prefix else 0
    history_of = dict(zip(sent["idx"].to_list(), (sent["planned_prompt_tokens"] +
                                                  sent["output_tokens"].fill_null(0)).to_list()))
    last_turn: dict[int, int] = {}    # session -> idx of its latest sent turn
    groups_seen: set[int] = set()
    shared = 0
    for idx, group, session in zip(sent["idx"].to_list(), sent["prefix_group"].to_list(),
                                   sent["session"].to_list()):
        if session is not None and session in last_turn:
            shared += int(history_of[last_turn[session]])
        elif group is not None and group in groups_seen:
            shared += prefix_tokens
        if session is not None:
            last_turn[session] = idx
        if group is not None:
            groups_seen.add(group)
    return shared / total


def mismatch(rate: float | None, expected: float | None, source: str | None) -> str | None:
    if rate is None or expected is None:
        return None
    by = f" ({source})" if source else ""
    if rate > expected + TOLERANCE:
        return (f"{rate:.0%} of prompt tokens were prefix-cache hits{by} where the workload repeats {expected:.0%}: "
                f"the cache was warm (another run sent the same texts: the same seed and prompt salt, or the same "
                f"dataset), so TTFT here is faster than this workload's own")
    if rate < expected - max(TOLERANCE, expected / 2):
        return (f"{rate:.0%} of prompt tokens were prefix-cache hits{by} where the workload repeats {expected:.0%}: "
                f"the server's prefix caching is off, or it evicted the shared prefixes")
    return None
