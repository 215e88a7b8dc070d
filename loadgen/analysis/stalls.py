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
- the stall time of the gap is its excess; r's stall time is the sum over its stalled gaps, and its
  causes the distinct q ids.
Preemptions (a stream stopped while its KV is recomputed) are not attributed here: no other request's
first token marks them. Range join: polars `join_where` on the elevated gaps only (few), so 10 M chunk
rows cost a few linear passes (gaps() skips the sort when the file is in its written order).
"""
from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from loadgen.metrics import request_gaps as gaps


BASELINE_Q = 0.1
ATTRIBUTION_REACH = 1.25
JOIN_BATCH_GAPS = 200_000


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
    # The join runs on integer keys and in batches of elevated gaps: under heavy load nearly every gap
    # holds several prefills, and string-keyed hits of a whole 10 M-chunk run would need GBs.
    ids = d.select("request_id").unique().with_row_index("key").with_columns(pl.col("key").cast(pl.Int64))
    intervals = d.join(ids, on="request_id").select(
        pl.col("key").alias("cause"),
        pl.col("first_token_ns").alias("q_end"),
        (pl.col("first_token_ns") - span_ns).round().cast(pl.Int64).alias("q_start"),
    )
    elevated = elevated.join(ids, on="request_id").drop("rid").rename({"key": "rid"})
    elevated = elevated.select("rid", "t_ns", "excess_ns", lo_ns=pl.col("prev_ns") + eps, hi_ns=pl.col("t_ns") - eps)
    per_gap = []
    for batch in elevated.iter_slices(JOIN_BATCH_GAPS):
        hits = batch.join_where(
            intervals,
            pl.col("q_end") > pl.col("lo_ns"),
            pl.col("q_start") < pl.col("hi_ns"),
            pl.col("cause") != pl.col("rid"),
        )
        per_gap.append(hits.group_by("rid", "t_ns").agg(pl.col("excess_ns").first(), pl.col("cause").unique()))
    per_request = pl.concat(per_gap).group_by("rid").agg(
        (pl.col("excess_ns").sum() / 1e6).alias("stall_ms"),
        pl.col("cause").list.explode(keep_nulls=False, empty_as_null=False).unique().alias("cause"))
    names = ids.select(pl.col("key").alias("cause"), pl.col("request_id").alias("cause_id"))
    causes = (per_request.select("rid", "cause").explode("cause").join(names, on="cause")
              .group_by("rid").agg(pl.col("cause_id").sort().alias("stall_causes")))
    return (per_request.join(causes, on="rid").join(ids.rename({"key": "rid"}), on="rid")
            .select("request_id", "stall_ms", "stall_causes"))

