"""What failed in a run, and whether that many failures leave its latencies meaningful.

Rows counted: the measured (non-warm-up) rows that were due: every row except `cancelled` (never due:
the run was stopped first), `interrupted` (in flight at Ctrl-C: the run is `interrupted` anyway) and
`abandoned` (closed by the client as the workload's [abandon] planned: a user's choice, not a failure).
Failures (`failed`): http_error, stream_error, connection_error, timeout, and `dropped` (held back by
--max-concurrency until the end, or a conversation broken by an earlier failed turn). Drops count: a
dropped request was scheduled and never measured, and the ones a cap holds back longest are exactly the
slowest, so the latencies of the rest leave them out just as they leave out a timeout.

error_rate = failed / counted. The run is invalid when it exceeds `max_error_rate` (`--max-error-rate`,
default 1 %): every latency figure is over ok rows only, so with a share f of failures the reported p99
can be as low as the all-request p(99 - 100 f) when the failures were the slow ones (timeouts are, by
definition): at 1 % the p99 is still at worst a p98, at 5 % it could be a p94.

Error texts are `error_detail` (already redacted of credentials by the recorder; redacted again here for
older folders), whitespace collapsed and cut to TEXT_CHARS, grouped by (outcome, error_kind, text).
"""
from __future__ import annotations

import re

import polars as pl

from loadgen.config.credentials import redact_text

FAILED = ("http_error", "stream_error", "connection_error", "timeout", "dropped")
NOT_COUNTED = ("cancelled", "interrupted", "abandoned")
TEXT_CHARS = 160
TOP = 5


def clean_text(detail: str | None) -> str:
    """One line, credentials redacted, at most TEXT_CHARS characters (an ellipsis says it was cut)."""
    text = re.sub(r"\s+", " ", redact_text(detail or "")).strip()
    return text if len(text) <= TEXT_CHARS else text[:TEXT_CHARS - 1] + "…"


def summarize(requests: pl.DataFrame, top: int = TOP) -> dict:
    """requests: results.REQUEST_SCHEMA rows. Returns {counted, failed, error_rate, by_outcome, top}:
    by_outcome {outcome: rows} of the failures; top [{outcome, kind, text, count}], most frequent first."""
    rows = requests.filter(~pl.col("warmup")) if "warmup" in requests.columns else requests
    rows = rows.filter(~pl.col("outcome").is_in(list(NOT_COUNTED)))
    failed = rows.filter(pl.col("outcome").is_in(list(FAILED)))
    by_outcome = {o: n for o, n in sorted(failed.group_by("outcome").len().iter_rows())}
    groups: dict[tuple[str, str, str], int] = {}
    for o, k, d in zip(failed["outcome"].to_list(), failed["error_kind"].to_list(),
                       failed["error_detail"].to_list()):
        key = (o, k or o, clean_text(d))
        groups[key] = groups.get(key, 0) + 1
    ranked = sorted(groups.items(), key=lambda kv: (-kv[1], kv[0]))[:top]
    return {"counted": rows.height, "failed": failed.height,
            "error_rate": failed.height / rows.height if rows.height else None,
            "by_outcome": by_outcome,
            "top": [{"outcome": o, "kind": k, "text": t, "count": n} for (o, k, t), n in ranked]}


def describe(f: dict, top: int = 3) -> str:
    """`9 of 30 requests failed (30.0 %): 5 http_error, 4 timeout; most frequent: 5× http_500 "..."`."""
    if not f["failed"]:
        return f"none of {f['counted']} requests failed"
    parts = ", ".join(f"{n} {o}" for o, n in sorted(f["by_outcome"].items(), key=lambda kv: -kv[1]))
    texts = "; ".join(f"{e['count']}× {e['kind']}" + (f' "{e["text"]}"' if e["text"] else "")
                      for e in f["top"][:top])
    share = 100 * f["error_rate"]
    return f"{f['failed']} of {f['counted']} requests failed ({share:.1f} %: {parts}); most frequent: {texts}"


def reason(f: dict, max_error_rate: float) -> str | None:
    """The invalid-run reason when the error rate exceeds max_error_rate, else None."""
    if f["error_rate"] is None or f["error_rate"] <= max_error_rate:
        return None
    ok = f["counted"] - f["failed"]
    return (f"errors: {describe(f)} (> {100 * max_error_rate:g} %, --max-error-rate): the latencies describe "
            f"only the {ok} requests that succeeded")
