"""The summary's definitions, on hand-made results (no run): ITL per token, rates, outcome counts."""
from pathlib import Path

import polars as pl
import pytest

from loadgen.analysis.summary import itl_ms, summarize
from loadgen.client.recorder import Row
from loadgen.results.folder import Run, requests_frame, tokens_frame

MS = 1_000_000


def row(i, intended_ms, chunks, outcome="ok", warmup=False) -> Row:
    """chunks: [(t_ms, n_tokens)], times relative to t0 = 0."""
    r = Row(i, f"r{i}", round(intended_ms * MS), 8, 64, warmup)
    r.dispatched_ns = r.intended_ns
    r.outcome = outcome
    for t, n in chunks:
        r.chunk_t_ns.append(round(t * MS))
        r.chunk_tokens.append(n)
    if chunks:
        r.first_token_ns, r.last_token_ns = r.chunk_t_ns[0], r.chunk_t_ns[-1]
        r.done_ns = r.last_token_ns
    r.output_tokens, r.n_chunks = sum(n for _, n in chunks), len(chunks)
    return r


def make_run(rows) -> Run:
    return Run(Path("."), {"status": "complete", "config": {"name": "t"}, "target": {"url": "x"}},
               requests_frame(rows, 0), tokens_frame(rows, 0))


@pytest.mark.parametrize("chunks,expected_ms", [
    # one token per chunk: each gap is one sample
    ([(10, 1), (20, 1), (35, 1)], [10, 15]),
    # a chunk of 4 tokens 20 ms after the previous one: 4 samples of 5 ms, not one 20 ms gap
    ([(10, 1), (30, 4)], [5, 5, 5, 5]),
    # three chunks coalesced in one read (same stamp): the gap is shared by their 3 tokens, never 0 ms gaps
    ([(10, 1), (40, 1), (40, 1), (40, 1)], [10, 10, 10]),
    # a first chunk with several tokens adds no sample for its own tokens
    ([(10, 3), (20, 1)], [10]),
    # a chunk that carries no token (spread rule, N < C) adds no gap: the next gap spans it
    ([(10, 1), (20, 0), (30, 1)], [20]),
])
def test_itl_per_token_rule(chunks, expected_ms):
    r = make_run([row(0, 0, chunks)])
    got = itl_ms(r.tokens, pl.Series(["r0"])).to_list()
    assert got == pytest.approx(expected_ms)
    assert sum(got) == pytest.approx(chunks[-1][0] - chunks[0][0])  # sums to the decode time


def test_summary_counts_rates_and_excludes_warmup():
    rows = [row(0, 0, [(50, 1), (60, 1)], warmup=True),
            row(1, 100, [(150, 1), (160, 1), (170, 1)]),
            row(2, 200, [(260, 1), (280, 1), (300, 1)]),
            row(3, 300, [], outcome="http_error"),
            row(4, 400, [], outcome="dropped")]
    rows[3].done_ns = rows[3].intended_ns + 5 * MS
    rows[4].dispatched_ns = None
    s = summarize(make_run(rows))
    assert s["requests"] == {"scheduled": 4, "ok": 2, "failed": 1, "dropped": 1, "abandoned": 0}
    assert s["rate"]["offered_per_s"] == pytest.approx(3 / 0.3)      # 4 intended over 300 ms
    assert s["rate"]["achieved_per_s"] == pytest.approx(2 / 0.2)     # 3 dispatched over 200 ms
    lat = s["latency_ms"]
    # nearest rank: p50 of two samples is the 1st (ceil(0.5 * 2)), never an interpolated 55
    assert (lat["ttft"]["p50"], lat["ttft"]["max"]) == (pytest.approx(50), pytest.approx(60))
    assert lat["tpot"]["mean"] == pytest.approx((10 + 20) / 2)
    # ITL samples: 10, 10 (r1) and 20, 20 (r2)
    assert lat["itl"]["max"] == pytest.approx(20) and lat["itl"]["p50"] == pytest.approx(10)
    assert lat["e2e"]["max"] == pytest.approx(100)
    # throughput over [first intended 100 ms, last done 305 ms]: 2 ok requests, 6 tokens
    assert s["throughput"]["requests_per_s"] == pytest.approx(2 / 0.205)
    assert s["throughput"]["output_tokens_per_s"] == pytest.approx(6 / 0.205)
    assert s["valid"] is True


def test_summary_of_a_run_with_no_successes_has_nulls_not_errors():
    s = summarize(make_run([row(0, 0, [], outcome="timeout")]))
    assert s["requests"]["ok"] == 0 and s["latency_ms"]["ttft"]["p50"] is None
