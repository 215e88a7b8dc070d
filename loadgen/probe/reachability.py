"""Did the run reach the server at all? A run whose requests never got an answer measures nothing about
the server, so it must not end as a success.

Rule: among the requests that were sent, the target is `unreachable` when none got a response head
(no HTTP status: refused, reset or timed out before any byte), or when more than half failed to
connect (error_kind connect_failed). The run is then marked invalid with this reason alone (the
generator's own checks, and their "add workers" advice, do not apply to it): exit 3, as every invalid run.
"""
from __future__ import annotations

from collections import Counter

import polars as pl

from loadgen.client.recorder import ErrorKind

MOST = 0.5


def unreachable_reason(requests: pl.DataFrame) -> str | None:
    """requests: the run's rows (results.REQUEST_SCHEMA) in plan (idx) order."""
    sent = requests.filter(pl.col("dispatched_ns").is_not_null())
    if not sent.height:
        return None
    answered = int(sent["http_status"].is_not_null().sum())
    refused = int((sent["error_kind"] == ErrorKind.CONNECT_FAILED.value).sum())
    if answered and refused <= MOST * sent.height:
        return None
    unanswered = sent.filter(pl.col("http_status").is_null())
    kinds = Counter(k or o for k, o in zip(unanswered["error_kind"].to_list(), unanswered["outcome"].to_list()))
    top = ", ".join(f"{n} {k}" for k, n in kinds.most_common(3))
    example = next((d for d in sent["error_detail"].to_list() if d), "")
    what = "no request reached the server" if not answered else \
        f"{refused} of {sent.height} requests failed to connect"
    return f"target unreachable: {what} ({top}){'; e.g. ' + example if example else ''}"
