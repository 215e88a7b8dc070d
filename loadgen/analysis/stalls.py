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

from loadgen.metrics import Gaps, gap_arrays
from loadgen.metrics import request_gaps as gaps  # noqa: F401  (the frame form, for callers)
from loadgen.results.folder import Manifest, loop_lateness_p99_ms


BASELINE_Q = 0.1
ATTRIBUTION_REACH = 1.25
JOIN_BATCH_GAPS = 500_000
MAX_IN_GAP = 4  # causes per gap named from the first tokens inside it (those nearest its end)


@dataclass(frozen=True)
class StallRule:
    rel: float = 0.5          # client read jitter on a busy host reaches a few ms: only clear excess counts
    abs_ns: int = 2_000_000
    eps_ns: int = 1_000_000

    client_lateness_ns: int = 0   # how late the client itself may read (the run's loop lateness p99)

    @classmethod
    def for_run(cls, manifest: Manifest) -> "StallRule":
        # The client's own measured lateness L (the run's event-loop probe, p99): the last stamp of a stream
        # may be up to L late, so up to L of its decode time beyond the ideal can be the client's, not a
        # stall (decompose.py caps decode_stalls accordingly; ~0 on a quiet host).
        return cls(client_lateness_ns=round(loop_lateness_p99_ms(manifest) * 1e6))


def attribute_stalls(tokens: pl.DataFrame, d: pl.DataFrame, rule: StallRule, g: Gaps | None = None) -> pl.DataFrame:
    """d: one row per request with request_id, first_token_ns and prefill_ms (null = unknown); g: the gaps
    of d's requests (metrics.gap_arrays) when the caller has them already.
    Returns request_id, stall_ms, stall_causes (list of request ids) for requests with stalls."""
    empty = pl.DataFrame(schema={"request_id": pl.String, "stall_ms": pl.Float64,
                                 "stall_causes": pl.List(pl.String)})
    if d.height == 0 or tokens.height == 0:
        return empty
    g = gap_arrays(tokens, d["request_id"]) if g is None else g
    if g.owner.size == 0:
        return empty
    sel, excess = _elevated_gaps(g, rule)
    if sel.size == 0:
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
    key_of = (pl.DataFrame({"request_id": g.names}).with_row_index("rid").join(ids, on="request_id", how="left")
              .sort("rid")["key"].fill_null(-1).to_numpy())
    el_key, el_excess = key_of[g.owner[sel]], excess[sel]
    el_lo, el_hi = g.prev_ns[sel] + eps, g.t_ns[sel] - eps
    del excess
    q_end, q_start, q_key = iv["q_end"].to_numpy(), iv["q_start"].to_numpy(), iv["key"].to_numpy()
    stalled = np.zeros(sel.size, bool)
    pairs = []
    # in batches of elevated gaps cut where the victim changes (each victim's pairs deduplicate within
    # its batch): the candidate arrays of a 10 M-chunk run would otherwise take GBs at once
    changes = np.flatnonzero(np.diff(el_key)) + 1
    at = np.unique(np.searchsorted(changes, np.arange(JOIN_BATCH_GAPS, sel.size, JOIN_BATCH_GAPS)))
    cuts = [0, *changes[at[at < changes.size]], sel.size]
    for lo_i, hi_i in zip(cuts[:-1], cuts[1:]):
        gap, cause = _candidate_causes(q_end, q_start, el_lo[lo_i:hi_i], el_hi[lo_i:hi_i])
        victim = el_key[lo_i:hi_i][gap]
        cause = q_key[cause]
        keep = cause != victim
        stalled[lo_i + gap[keep]] = True
        pairs.append(_sorted_unique(victim[keep] * ids.height + cause[keep]))
    if not stalled.any():
        return empty
    pair = np.concatenate(pairs)
    del pairs
    # distinct (victim, cause) pairs sorted by victim key: key order = request id order (ids is sorted), so
    # each list comes out sorted; every stalled victim has pairs, so both frames below hold the same keys
    n = ids.height
    causes = pl.DataFrame({"key": (pair // n).astype(np.int32), "cause": (pair % n).astype(np.int32)})
    del pair
    # lists of integer keys first, then names: the flat string column of every pair would cost twice
    causes = causes.group_by("key", maintain_order=True).agg(pl.col("cause")).with_columns(
        stall_causes=pl.col("cause").list.eval(pl.element().replace_strict(
            pl.Series(range(n), dtype=pl.Int32), ids["request_id"], return_dtype=pl.String)))
    per_request = (pl.DataFrame({"key": el_key[stalled], "excess_ns": el_excess[stalled]})
                   .group_by("key").agg(stall_ms=pl.col("excess_ns").sum() / 1e6).sort("key"))
    return pl.DataFrame([ids["request_id"].gather(per_request["key"]), per_request["stall_ms"],
                         causes["stall_causes"]])


def _elevated_gaps(g: Gaps, rule: StallRule) -> tuple[np.ndarray, np.ndarray]:
    """The gaps beyond the rule's threshold over their request's baseline ITL: (indices into g's gaps, every
    gap's excess ns over k x baseline, less the next gap's catch-up)."""
    # numpy over the gaps (each request's contiguous, in time order): a few arrays of the gap count, where
    # window expressions over 10 M rows materialize several copies
    rid, k = g.owner, g.k
    gap_ns = g.gap_ns.astype(np.float64)
    per_rid = (pl.DataFrame({"rid": rid, "itl_ns": gap_ns / k}).group_by("rid")
               .agg(b=pl.col("itl_ns").quantile(BASELINE_Q, interpolation="lower")))
    baseline = np.zeros(g.names.len())
    baseline[per_rid["rid"].to_numpy()] = per_rid["b"].to_numpy()
    del per_rid
    baseline = baseline[rid]
    # excess = gap - k * baseline - the next gap's shortfall (the client read this gap's end late), in place
    excess = np.multiply(k, baseline)
    np.subtract(gap_ns, excess, out=excess)
    catch_up = np.multiply(k[1:], baseline[:-1])
    catch_up -= gap_ns[1:]
    np.clip(catch_up, 0, None, out=catch_up)
    catch_up[rid[1:] != rid[:-1]] = 0
    excess[:-1] -= catch_up
    del catch_up, gap_ns
    baseline *= rule.rel
    baseline += rule.abs_ns
    sel = np.flatnonzero(excess > baseline)
    return sel, excess


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
    x = np.sort(x, kind="stable")  # timsort: pairs come nearly in order (by victim, then time), runs are cheap
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
