"""Prefix-cache hits measured, not assumed: the server's counters over a run (probe/prefix_cache.py), the
per-request cached_tokens (both OpenAI parse paths, llama.cpp's timings), the rate a workload implies and the
mismatch sentence (analysis/prefix_cache.py), compare's same-work check."""
from array import array

import polars as pl
import pytest

from loadgen.analysis import prefix_cache as analysis
from loadgen.analysis.compare import same_work
from loadgen.client.backends.llamacpp import llamacpp_timings
from loadgen.client.backends.openai import OpenAIBackend
from loadgen.client.recorder import Row
from loadgen.probe import prefix_cache as probe
from tests.unit.test_openai_fastpath import DONE, cmpl

VLLM = """# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{{engine="0",model_name="m"}} {q}
vllm:prefix_cache_queries_total{{engine="1",model_name="m"}} 100
# TYPE vllm:prefix_cache_hits counter
vllm:prefix_cache_hits_total{{engine="0",model_name="m"}} {h}
vllm:prefix_cache_hits_total{{engine="1",model_name="m"}} 50
"""
SGLANG = """# TYPE sglang:prompt_tokens counter
sglang:prompt_tokens_total{{model_name="m"}} {q}
# TYPE sglang:cached_tokens counter
sglang:cached_tokens_total{{model_name="m"}} {h}
"""


def test_the_run_s_counts_are_the_counters_deltas_summed_over_engines():
    before = probe.totals(VLLM.format(q=1000, h=200))
    after = probe.totals(VLLM.format(q=5414, h=3528))
    d = probe.delta(before, after)
    assert (d["queried_tokens"], d["hit_tokens"], d["cached_tokens"]) == (4414, 3328, None)
    assert d["hit_rate"] == pytest.approx(3328 / 4414)
    s = probe.delta(probe.totals(SGLANG.format(q=0, h=0)), probe.totals(SGLANG.format(q=400, h=100)))
    assert s["hit_rate"] == 0.25 and s["source"].startswith("sglang:")


@pytest.mark.parametrize("before,after,note", [
    (None, {}, "no /metrics snapshot"),
    ({}, {}, "no prefix-cache counters"),
    (probe.totals(VLLM.format(q=900, h=10)), probe.totals(VLLM.format(q=100, h=10)), "went down"),
    (probe.totals(VLLM.format(q=900, h=10)), probe.totals(VLLM.format(q=900, h=10)), "caching off"),
])
def test_no_rate_without_usable_counters(before, after, note):
    d = probe.delta(before, after)
    assert d["hit_rate"] is None and note in d["note"]


def _usage(cached):
    details = b"" if cached is None else b',"prompt_tokens_details":{"cached_tokens":' + str(cached).encode() + b"}"
    return (b'data: {"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":2' + details + b"}}\n\n")


@pytest.mark.parametrize("cached", [None, 0, 5])
def test_cached_tokens_from_the_usage_on_both_parse_paths(cached):
    reads = [cmpl(b"a"), cmpl(b"b", b'"length"'), _usage(cached) + DONE]
    t = array("q", [1, 2, 3])
    b = OpenAIBackend("completions", "m", {})
    fast, full = Row(0, "r", 0, 7, 2), Row(0, "r", 0, 7, 2)
    b.interpret(fast, t, reads)
    b._interpret_full(full, t, reads)
    assert fast.cached_tokens == full.cached_tokens == cached


def test_llamacpp_cache_n_is_the_rows_cached_tokens():
    row = Row(0, "r", 0, 7, 2)
    llamacpp_timings(row, {"prompt_ms": 1.0, "predicted_ms": 2.0, "cache_n": 12})
    assert row.cached_tokens == 12


def _rows(prompt, group=None, session=None, output=None):
    n = len(prompt)
    return pl.DataFrame({"idx": list(range(n)), "dispatched_ns": list(range(n)), "planned_prompt_tokens": prompt,
                         "output_tokens": output or [None] * n,
                         "prefix_group": group or [None] * n, "session": session or [None] * n},
                        schema={"idx": pl.Int64, "dispatched_ns": pl.Int64, "planned_prompt_tokens": pl.Int64,
                                "output_tokens": pl.Int64, "prefix_group": pl.Int64, "session": pl.Int64})


def test_the_rate_a_workload_implies():
    assert analysis.expected_rate(_rows([100] * 4), {}) == 0.0
    # one group of a 60-token prefix: every row but the group's first repeats it
    assert analysis.expected_rate(_rows([100] * 4, group=[0] * 4), {"prefix": {"tokens": 60}}) == 180 / 400
    # a session's turn repeats its previous turn's prompt and reply (two sessions, two turns each)
    rows = _rows([50, 40, 120, 100], session=[0, 1, 0, 1], output=[10, 5, 10, 5])
    assert analysis.expected_rate(rows, {"session": {}}) == (50 + 10 + 40 + 5) / 310
    # a trace's shared blocks: not known here
    assert analysis.expected_rate(_rows([100] * 2, group=[7, 7]), {"trace": {"format": "mooncake"}}) is None


def test_a_rate_off_the_workload_s_is_named():
    assert "the cache was warm" in analysis.mismatch(0.75, 0.0, "server counters")
    assert analysis.mismatch(0.04, 0.0, "server counters") is None
    assert "prefix caching is off" in analysis.mismatch(0.0, 0.6, "server counters")
    assert analysis.mismatch(0.5, 0.6, "server counters") is None
    assert analysis.mismatch(None, 0.0, None) is None


def test_compare_names_different_hit_rates_as_different_work():
    a, b = {"prefix_cache_hit_rate": 0.0}, {"prefix_cache_hit_rate": 0.75}
    assert [d["field"] for d in same_work(a, b)] == ["prefix-cache hit rate"]
    assert same_work(a, {"prefix_cache_hit_rate": 0.03}) == []
    assert same_work(a, {"prefix_cache_hit_rate": None}) == []   # unknown on one side: not a difference
