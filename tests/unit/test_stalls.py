"""Stall attribution (analysis/stalls.py): which gaps count, and who caused them."""
import polars as pl
import pytest

from loadgen.analysis.stalls import StallRule, attribute_stalls
from tests.frames import make_run, stream

MS = 1_000_000


def stalls_of(victim_tokens, others: list[tuple[str, float, float | None]]) -> dict:
    """others: (id, first token ms, prefill ms or None)."""
    run = make_run([{"id": "v", "tokens": victim_tokens}]
                   + [{"id": rid, "tokens": [ft, ft + 500]} for rid, ft, _ in others])
    d = pl.DataFrame({"request_id": ["v"] + [o[0] for o in others],
                      "first_token_ns": [round(victim_tokens[0] * MS)] + [round(o[1] * MS) for o in others],
                      "prefill_ms": [None] + [o[2] for o in others]}, schema_overrides={"prefill_ms": pl.Float64})
    out = attribute_stalls(run.tokens, d, StallRule())
    return {r["request_id"]: (r["stall_ms"], r["stall_causes"]) for r in out.iter_rows(named=True)}


V = stream(0, 12, 10, {6: 40})  # gaps of 10 ms, gap 6 (50 -> 100) is 50 ms


@pytest.mark.parametrize("others, expected", [
    # q's first token lands inside the long gap: 50 - 10 (median gap) = 40 ms, caused by q
    ([("q", 99.5, None)], {"v": (40.0, ["q"])}),
    # q's first token comes out with v's token that ends the gap (same step, read 0.4 ms later)
    ([("q", 100.4, None)], {"v": (40.0, ["q"])}),
    # chunked: q's prefill (80 ms) overlaps the gap although its first token comes later
    ([("q", 130.0, 80.0)], {"v": (40.0, ["q"])}),
    # two prefills in one gap: one stall, both causes
    ([("q", 70.0, None), ("p", 90.0, None)], {"v": (40.0, ["p", "q"])}),
    # q's first token came with v's token before the gap (the step before): not this gap's cause
    ([("q", 50.2, None)], {}),
    # q's first token inside an ordinary 10 ms gap (no excess): nothing to attribute
    ([("q", 25.0, None)], {}),
    # nobody else: the long gap stays unexplained (preemption or server hiccup, not a prefill)
    ([], {}),
])
def test_attribution(others, expected):
    got = stalls_of(V, others)
    assert {k: (pytest.approx(v[0]), v[1]) for k, v in expected.items()} == got


def test_jitter_below_the_threshold_is_not_a_stall():
    # 1.5 ms of extra gap (client read jitter) while q's first token is inside it: below
    # baseline * 1.5 + 2 ms, so no stall.
    assert stalls_of(stream(0, 12, 10, {6: 1.5}), [("q", 58.0, None)]) == {}
