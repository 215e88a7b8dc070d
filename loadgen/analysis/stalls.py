"""Stall attribution: which other requests' prefills made a stream pause, and for how long.

A continuous-batching engine that admits a prompt runs its prefill in the same step as the running
decodes, so every running stream sees one long gap ending about when the newcomer's first token goes out
(with chunked prefill: several smaller gaps while its chunks run). Rule, per request r:
- gaps: consecutive chunk groups of r (chunks stamped at the same t_ns form one group, as in
  the ITL rule in metrics.py); `gap_ns` = t - prev, over `k` tokens; `baseline_ns` = the BASELINE_Q quantile of
  r's per-token gaps (gap / k): its decode-only step time (under chunked prefill most steps carry some
  prefill work, so the median would hide the very stalls it should reveal); a gap of k tokens is
  expected to last k * baseline (as in the ITL rule: tokens read together shared the wait);
- a late read is not a stall: when the client itself was busy, the gap is long and the next one short,
  or its tokens arrive bunched in one read (they were emitted on time). So the gap's excess is
  `excess = gap - k * baseline - max(0, k_next * baseline - next gap)`, and a gap is elevated when
  excess > baseline * rel + abs_ns;
  (abs_ns rises to twice the run's measured event-loop lateness p99 when that is larger: StallRule.for_run);
- an elevated gap is a stall caused by request q (q != r) when q's prefill interval
  [first_token_q - max(span_q, 2*eps), first_token_q] overlaps (prev + eps, t - eps), i.e. q's first
  token lands inside the gap or q was prefilling during it. span_q is q's prefill, or, where that is
  an estimate, at least ATTRIBUTION_REACH x its idle prefill (`attr_span_ms`): a chunked prefill's
  first chunks are the hardest part to see from the client, and widening only changes who is
  named for an elevated gap, not how long the stall was. eps absorbs that two sockets are read in
  some order: q's first token and r's token of the same step are stamped microseconds apart;
- the causes named per gap are bounded: of the first tokens inside it, the MAX_IN_GAP nearest its end
  (a step's prefill completes with the token that ends the gap), and of the prefills spanning its end,
  the one that ends first. Under heavy load every gap overlaps dozens of prefills; naming all of them
  made the attribution of a 10 M-chunk run cost GBs while the stall time is the same either way;
- the stall time of the gap is its excess; r's stall time is the sum over its stalled gaps, and its
  causes the distinct q ids.
Preemptions (a stream stopped while its KV is recomputed) are not attributed here: no other request's
first token marks them. Matching: binary searches over the intervals sorted by first token, and a
sparse table of range minima of their starts for the spanning one (numpy, O((gaps + n) log n)), so
10 M chunk rows cost a few linear passes (gaps() skips the sort when the file is in its written order).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from loadgen.metrics import request_gaps as gaps


BASELINE_Q = 0.1
ATTRIBUTION_REACH = 1.25
MAX_IN_GAP = 4  # causes per gap named from the first tokens inside it (those nearest its end)


@dataclass(frozen=True)
class StallRule:
    rel: float = 0.5          # client read jitter on a busy host reaches a few ms: only clear excess counts
    abs_ns: int = 2_000_000
    eps_ns: int = 1_000_000

    client_lateness_ns: int = 0   # how late the client itself may read (the run's loop lateness p99)

    @classmethod
    def for_run(cls, manifest: dict) -> "StallRule":
        # The client's own measured lateness L (the run's event-loop probe, p99) bounds read jitter: a gap
        # read L late at its end and on time at its start looks L longer, and the baseline of a jittery
        # stream sits up to L below the true step, so an excess up to 2 L is indistinguishable from the
        # client reading late. On a busy host the absolute floor rises to that.
        late_ms = ((manifest.get("generator") or {}).get("loop_lateness_ms") or {}).get("p99") or 0.0
        late_ns = round(late_ms * 1e6)
        return cls(abs_ns=max(cls.abs_ns, 2 * late_ns), client_lateness_ns=late_ns)


def attribute_stalls(tokens: pl.DataFrame, d: pl.DataFrame, rule: StallRule) -> pl.DataFrame:
    """d: one row per request with request_id, first_token_ns and prefill_ms (null = unknown).
    Returns request_id, stall_ms, stall_causes (list of request ids) for requests with stalls."""
    empty = pl.DataFrame(schema={"request_id": pl.String, "stall_ms": pl.Float64,
                                 "stall_causes": pl.List(pl.String)})
    if d.height == 0 or tokens.height == 0:
        return empty
    g = (gaps(tokens.filter(pl.col("request_id").is_in(d["request_id"].implode()))).lazy()
         .with_columns(baseline_ns=(pl.col("gap_ns") / pl.col("k"))
                       .quantile(BASELINE_Q, interpolation="lower").over("rid"),
                       next_ns=pl.col("gap_ns").shift(-1).over("rid"),
                       next_k=pl.col("k").shift(-1).over("rid"))
         .with_columns(excess_ns=pl.col("gap_ns") - pl.col("k") * pl.col("baseline_ns")
                       - (pl.col("next_k") * pl.col("baseline_ns") - pl.col("next_ns"))
                       .clip(lower_bound=0).fill_null(0)))
    elevated = g.filter(pl.col("excess_ns") > pl.col("baseline_ns") * rule.rel + rule.abs_ns).collect()
    if elevated.height == 0:
        return empty
    eps = rule.eps_ns
    span = pl.col("attr_span_ms") if "attr_span_ms" in d.columns else pl.col("prefill_ms")
    span_ns = pl.max_horizontal(span.fill_null(0.0) * 1e6, pl.lit(2.0 * eps))
    # integer keys in request id order, so that a sorted key list is a sorted id list
    ids = (d.select("request_id").unique().sort("request_id").with_row_index("key")
           .with_columns(pl.col("key").cast(pl.Int64)))
    iv = d.join(ids, on="request_id").select(
        "key", q_end="first_token_ns", q_start=(pl.col("first_token_ns") - span_ns).round().cast(pl.Int64),
    ).sort("q_end")
    el = elevated.join(ids, on="request_id").select(
        "key", "excess_ns", lo=pl.col("prev_ns") + eps, hi=pl.col("t_ns") - eps)
    gap, cause = _candidate_causes(iv["q_end"].to_numpy(), iv["q_start"].to_numpy(), el["lo"].to_numpy(),
                                   el["hi"].to_numpy())
    victim = el["key"].to_numpy()
    cause = iv["key"].to_numpy()[cause]
    keep = cause != victim[gap]
    gap, cause = gap[keep], cause[keep]
    if gap.size == 0:
        return empty
    stalled = np.zeros(victim.size, bool)
    stalled[gap] = True
    per_request = (pl.DataFrame({"key": victim[stalled], "excess_ns": el["excess_ns"].to_numpy()[stalled]})
                   .group_by("key").agg(stall_ms=pl.col("excess_ns").sum() / 1e6))
    # distinct (victim, cause) pairs, in key order = request id order (ids is sorted)
    pair = _sorted_unique(victim[gap] * ids.height + cause)
    pairs = pl.DataFrame({"key": pair // ids.height, "cause": pair % ids.height})
    causes = (pairs.with_columns(cause_id=ids["request_id"].gather(pairs["cause"]))  # ids' key = its row
              .group_by("key", maintain_order=True).agg(stall_causes="cause_id"))
    return (per_request.join(causes, on="key").join(ids, on="key")
            .select("request_id", "stall_ms", "stall_causes"))


def _candidate_causes(q_end: np.ndarray, q_start: np.ndarray, lo: np.ndarray, hi: np.ndarray):
    """Pairs (gap index, interval index) of the causes of each gap (lo, hi); intervals sorted by q_end:
    the at most MAX_IN_GAP intervals whose end lands inside the gap, nearest its end, and the first one
    (by end) that ends at or after hi but started before it (a prefill spanning the gap's end)."""
    after_lo = np.searchsorted(q_end, lo, side="right")
    b = np.searchsorted(q_end, hi, side="left")
    a = np.maximum(after_lo, b - MAX_IN_GAP)
    n_in = np.maximum(b - a, 0)
    gap_in = np.repeat(np.arange(lo.size), n_in)
    cause_in = a[gap_in] + (np.arange(gap_in.size) - np.repeat(np.cumsum(n_in) - n_in, n_in))
    s = _first_below(q_start, np.maximum(b, after_lo), hi)  # (a gap shorter than 2 eps has lo > hi)
    gap_span = np.flatnonzero(s < q_end.size)
    return np.concatenate([gap_in, gap_span]), np.concatenate([cause_in, s[gap_span]])


def _sorted_unique(x: np.ndarray) -> np.ndarray:
    x = np.sort(x)
    return x[np.concatenate(([True], x[1:] != x[:-1]))] if x.size else x


def _first_below(values: np.ndarray, start: np.ndarray, limit: np.ndarray) -> np.ndarray:
    """Per query i, the first index j >= start[i] with values[j] < limit[i]; len(values) when none.
    A sparse table of range minima (levels[k][i] = min(values[i : i + 2**k])) and one descent per query:
    O(n log n) to build, O(log n) per query, all vectorized."""
    n = values.size
    levels = [values]
    while (1 << len(levels)) <= n:
        prev, h = levels[-1], 1 << (len(levels) - 1)
        levels.append(np.minimum(prev[:-h], prev[h:]))
    pos = start.astype(np.int64, copy=True)
    for k in range(len(levels) - 1, -1, -1):  # invariant: values[start:pos] are all >= limit
        m = levels[k]
        fits = pos < m.size
        skip = fits & (m[np.minimum(pos, m.size - 1)] >= limit)
        pos[skip] += 1 << k
    found = pos < n
    found[found] = values[pos[found]] < limit[found]
    return np.where(found, pos, n)
