"""analysis/replay.py (the FCFS scheduler replay) and steps.boundaries' merge of split reads, on hand-made
stamps. Times in ms in the tables, ns in the calls."""
import numpy as np
import polars as pl
import pytest

from loadgen.analysis import replay as rp
from loadgen.analysis.steps import boundaries

MS = 1_000_000
STEPS = np.arange(0, 110, 10) * MS  # a step ends every 10 ms: 0, 10, ..., 100


def ns(*ms):
    return np.array([round(x * MS) for x in ms], dtype=np.int64)


@pytest.mark.parametrize("sent, prompt, kf, kl, budget, seats, sched, first", [
    # a decoder (first token at cluster 0, last at 10) keeps the engine stepping; q sent at 12 joins the
    # step starting at 20 and its 100 tokens fit: first token at the end of that step (cluster 3)
    ([-5, 12], [1, 100], [0, 3], [10, 4], 1 << 40, 1 << 40, [-5, 20], [0, 3]),
    # the same with a 50-token budget: 49 per step beside the decode, 100 tokens take 3 steps (20, 30, 40)
    ([-5, 12], [1, 100], [0, 5], [10, 6], 50, 1 << 40, [-5, 20], [0, 5]),
    # one seat: q waits for the decoder's last token (cluster 5, t = 50), then its prompt fits in one step
    ([-5, 12], [1, 100], [0, 6], [5, 7], 1 << 40, 1, [-5, 50], [0, 6]),
    # FCFS behind a chunked prompt: a (1200 tokens) takes the 511-token budget left at 10 and 20 and
    # finishes at 30; b (10 tokens, sent right after a) is admitted only then, in a's last step
    ([-5, 1, 2], [1, 1200, 10], [0, 4, 4], [10, 5, 5], 512, 1 << 40, [-5, 10, 30], [0, 4, 4]),
    # an idle engine (no decoder): q's step starts when it arrives, not at a boundary
    ([5], [100], [3], [3], 1 << 40, 1 << 40, [5], [3]),
])
def test_replay_admits_fcfs_within_budget_and_seats(sent, prompt, kf, kl, budget, seats, sched, first):
    # the idle case: old steps, then q's own (cluster 3)
    B = ns(-30, -20, -10, 25) if len(sent) == 1 else STEPS
    r = rp.replay(B, ns(*sent), np.array(prompt), np.array(kf), np.array(kl), budget, seats)
    assert r.sched_ns.tolist() == ns(*sched).tolist()
    assert r.first_idx.tolist() == first
    assert r.matched.all()


def test_fit_finds_the_budget_that_reproduces_the_first_tokens():
    # the FCFS case above: only a 512-token budget puts a's and b's first tokens at cluster 4 (1024 gives
    # 3, 256 gives 6), and no seat limit is needed
    sent, prompt = ns(-5, 1, 2), np.array([1, 1200, 10])
    first, last = STEPS[[0, 4, 4]], STEPS[[10, 5, 5]]
    r = rp.fit(STEPS, sent, prompt, first, last)
    assert (r.budget_tokens, r.seats) == (512, rp.NO_LIMIT)
    assert r.matched.all() and r.sched_ns.tolist() == ns(-5, 10, 30).tolist()


@pytest.mark.parametrize("kf, kl, seats", [
    ([0, 1, 2], [5, 3, 2], 2),  # at cluster 1 two requests decode; the third has one token only
    ([0, 0, 0], [9, 9, 9], 3),  # three decode together
    ([], [], 1),                # nothing: one seat at least
])
def test_seats_lower_bound(kf, kl, seats):
    assert rp.seats_lower_bound(np.array(kf, dtype=np.int64), np.array(kl, dtype=np.int64)) == seats


@pytest.mark.parametrize("sent, first, lo, hi", [
    (12, 30, 20, 20),  # sent during the step ending at 20; the first token ends the step from 20: exact
    (12, 20, 12, 12),  # no boundary between send and the step producing the first token: the send
    (5, 30, 10, 20),   # the steps from 10 and from 20 could both have admitted it: a 10 ms window
])
def test_window_between_first_step_after_send_and_the_first_tokens_step(sent, first, lo, hi):
    got_lo, got_hi = rp.window(STEPS, ns(sent), ns(first))
    assert (got_lo.tolist(), got_hi.tolist()) == (ns(lo).tolist(), ns(hi).tolist())


def tokens(stamps: dict[str, list[float]]) -> pl.DataFrame:
    rows = [(rid, i, round(t * MS)) for rid, ts in stamps.items() for i, t in enumerate(ts)]
    return pl.DataFrame(rows, schema={"request_id": pl.String, "idx": pl.Int32, "t_ns": pl.Int64}, orient="row")


@pytest.mark.parametrize("stamps, starts", [
    # steps every 40 ms; b's reads come 3 ms after a's (a busy client): one step each, not two
    ({"a": [0, 40, 80, 120], "b": [3, 43, 83, 123]}, [0, 40, 80, 120]),
    # the same 3 ms apart, but b is a new stream (its first token) after a ended: no stream crosses the
    # cut and it is close, so it is a split read of the step ending at 120
    ({"a": [0, 40, 80, 120], "b": [123, 163]}, [0, 40, 80, 120, 163]),
    # a cut no stream crosses but far from the previous one (an idle engine, then a new request) stays
    ({"a": [0, 40, 80], "b": [300, 340]}, [0, 40, 80, 300, 340]),
])
def test_boundaries_merge_a_split_read_of_one_step(stamps, starts):
    b = boundaries(tokens(stamps), 1 * MS)
    assert b["b_ns"].to_list() == ns(*starts).tolist()
