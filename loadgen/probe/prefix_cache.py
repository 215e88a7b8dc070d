"""The server's own prefix-cache counters, read once before t0 and once after the run.

Counters by server (token counts, summed over label sets):
    vllm     vllm:prefix_cache_queries_total (prompt tokens looked up), vllm:prefix_cache_hits_total (found),
             vllm:prompt_tokens_cached_total (cached prompt tokens, where the version has it)
    sglang   sglang:prompt_tokens_total (queried) and sglang:cached_tokens_total (hits)
llama.cpp has no such counter (its per-request `timings.cache_n` fills `cached_tokens`, backends/llamacpp.py).
snapshot() is one bounded GET /metrics outside the measured window (never fatal: None on any failure);
delta() is the manifest's `prefix_cache` section: {source, queried_tokens, hit_tokens, cached_tokens,
hit_rate} over the run (warm-up requests included), or why there is none.
"""
from __future__ import annotations

import asyncio
import ssl

import aiohttp

from loadgen.probe.scrape import parse

SNAPSHOT_TIMEOUT_S = 2.0
# (queried, hits, cached or None) per server, in the order tried
COUNTERS = (("vllm", "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total",
             "vllm:prompt_tokens_cached_total"),
            ("sglang", "sglang:prompt_tokens_total", "sglang:cached_tokens_total", None))


def totals(text: str) -> dict[str, float]:
    """Every counter of COUNTERS found in a text exposition, summed over its label sets."""
    wanted = {n for row in COUNTERS for n in row[1:] if n}
    out: dict[str, float] = {}
    for _, name, _, value in parse(text, 0):
        if name in wanted:
            out[name] = out.get(name, 0.0) + value
    return out


async def snapshot(base_url: str, headers: dict[str, str], tls: ssl.SSLContext | bool = True
                   ) -> dict[str, float] | None:
    url = base_url.rstrip("/").removesuffix("/v1") + "/metrics"
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=SNAPSHOT_TIMEOUT_S)) as s:
            async with s.get(url, headers=headers, ssl=tls) as resp:
                if resp.status != 200:
                    return None
                return totals(await resp.text())
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
        return None


def delta(before: dict[str, float] | None, after: dict[str, float] | None) -> dict:
    """The run's counts from two snapshots; `hit_rate` (0..1) is None when the server has no counters."""
    none = {"source": None, "queried_tokens": None, "hit_tokens": None, "cached_tokens": None, "hit_rate": None}
    if before is None or after is None:
        return {**none, "note": "no /metrics snapshot before and after the run"}
    for server, queried, hits, cached in COUNTERS:
        if queried in before and queried in after and hits in before and hits in after:
            q, h = after[queried] - before[queried], after[hits] - before[hits]
            if q < 0 or h < 0:  # a restart, or another process's counters (a multi-process server)
                return {**none, "note": f"{server}'s counters went down during the run"}
            c = after[cached] - before[cached] if cached and cached in before and cached in after else None
            out = {"source": f"{queried}, {hits}", "queried_tokens": int(q), "hit_tokens": int(h),
                   "cached_tokens": None if c is None else int(c), "hit_rate": h / q if q else None}
            if not q:  # nothing looked up: no rate, not a rate of 0
                out["note"] = "the server looked up no prompt tokens in a prefix cache (caching off?)"
            return out
    return {**none, "note": "the server's /metrics has no prefix-cache counters"}
