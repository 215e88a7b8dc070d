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


def test_a_late_read_followed_by_a_catch_up_is_not_a_stall():
    # the client read token 6 eight ms late (gap 18, then 2): emitted on time, so no stall
    late = stream(0, 12, 10)
    late[6] += 8
    assert stalls_of(late, [("q", 58.0, None)]) == {}


def test_tokens_bunched_in_one_late_read_are_not_a_stall():
    # the client was late: tokens 6, 7 and 8 (due at 60, 70, 80) all arrive in one read at 85. The gap
    # 50 -> 85 carries 3 tokens, so 30 ms of its 35 were expected, and the next (85 -> 90) is short.
    late = stream(0, 30, 10)
    late[6] = late[7] = late[8] = 85.0
    assert stalls_of(late, [("q", 58.0, None)]) == {}


def test_jitter_below_the_threshold_is_not_a_stall():
    # 1.5 ms of extra gap (client read jitter) while q's first token is inside it: below
    # baseline * 1.5 + 2 ms, so no stall.
    assert stalls_of(stream(0, 12, 10, {6: 1.5}), [("q", 58.0, None)]) == {}


def test_gaps_are_the_same_whatever_the_row_order():
    # the written order (contiguous per request) skips the sort; a shuffled file takes the sort path
    from loadgen.analysis.stalls import gaps

    run = make_run([{"id": "a", "tokens": stream(0, 6, 10)}, {"id": "b", "tokens": [3, 3, 9, 30]}])
    in_order = gaps(run.tokens).drop("rid").sort("request_id", "t_ns")
    shuffled = gaps(run.tokens.sample(fraction=1.0, shuffle=True, seed=3)).drop("rid").sort("request_id", "t_ns")
    assert in_order.equals(shuffled)
    # b's two chunks at t=3 form one group: its gaps are 3 -> 9 (k 1) and 9 -> 30
    b = in_order.filter(pl.col("request_id") == "b")
    assert b["gap_ns"].to_list() == [6 * MS, 21 * MS] and in_order.height == 5 + 2


@pytest.mark.parametrize("manifest, lateness_ns", [
    # no lateness measured
    ({}, 0),
    # the run's event-loop probe: p99 7.5 ms late
    ({"generator": {"loop_lateness_ms": {"p99": 7.5}}}, 7_500_000),
])
def test_the_clients_measured_lateness_comes_from_the_run(manifest, lateness_ns):
    rule = StallRule.for_run(manifest)
    assert rule.client_lateness_ns == lateness_ns and rule.abs_ns == StallRule.abs_ns
