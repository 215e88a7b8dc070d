"""What an agentic session's requests were (summary `agentic`; docs/design.md "Agentic sessions"), from the
rows' `tool_round` and `tool_latency_ns` over the measured rows; null for a run without agentic sessions
(and for runs before the columns existed).

- `requests`: rows of agentic sessions (every measured row with a session); `user_turns` (tool_round 0),
  `tool_rounds` (>= 1), `not_built` (a later turn never built: dropped after an earlier one failed, or
  the run stopped first), `by_round` {round: rows};
- `tool_latency_ms`: the distribution (p50 ... max, mean; ms) of the latency the tool rounds waited after
  the previous reply (the plan's draws, run/analysis only: no latency figure counts it);
- `prompt_tokens_mean` {round: mean usage prompt tokens of the ok rows}: how the history grows;
- `ttft_ms` {`user_turns`, `tool_rounds`}: the TTFT distribution of the ok rows of each kind (a tool
  round sends the whole history again: its prefill is the long one unless a prefix cache serves it).
"""
from __future__ import annotations

import polars as pl

from loadgen import metrics
from loadgen.results.folder import Json, Run


def section(run: Run) -> Json | None:
    req = run.requests.filter(~pl.col("warmup"))
    if not req["tool_round"].is_not_null().any():
        return None
    rows = req.filter(pl.col("session").is_not_null())
    rounds = rows["tool_round"]
    tools = rows.filter(pl.col("tool_round") > 0)
    ok = metrics.latency_columns(rows.filter(metrics.OK_ROWS), unit_ns=1, names=("ttft",))
    by_round = dict(rows.filter(pl.col("tool_round").is_not_null()).group_by("tool_round").len()
                    .sort("tool_round").iter_rows())
    means = dict(ok.filter(pl.col("prompt_tokens").is_not_null()).group_by("tool_round")
                 .agg(pl.col("prompt_tokens").mean()).drop_nulls("tool_round").sort("tool_round").iter_rows())
    return {"requests": rows.height, "user_turns": int((rounds == 0).sum()), "tool_rounds": tools.height,
            "not_built": int(rounds.is_null().sum()),
            "by_round": {str(k): int(v) for k, v in by_round.items()},
            "tool_latency_ms": metrics.distribution(tools["tool_latency_ns"].drop_nulls(), scale=metrics.NS_PER_MS),
            "prompt_tokens_mean": {str(k): float(v) for k, v in means.items()},
            "ttft_ms": {kind: metrics.distribution(ok.filter(cond)["ttft"], scale=metrics.NS_PER_MS)
                        for kind, cond in (("user_turns", pl.col("tool_round") == 0),
                                           ("tool_rounds", pl.col("tool_round") > 0))}}
