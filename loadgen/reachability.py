"""Did the run reach the server at all? A run whose requests never got an answer measures nothing about
the server, so it must not end as a success.

Rule: among the requests that were sent, the target is `unreachable` when none got a response head
(no HTTP status: refused, reset or timed out before any byte), or when more than half failed to
connect (error_kind connect_failed). The run is then marked invalid with this reason alone (the
generator's own checks, and their "add workers" advice, do not apply to it): exit 3, as every invalid run.
"""
from __future__ import annotations

from collections import Counter

from loadgen.recorder import ErrorKind, Row

MOST = 0.5


def unreachable_reason(rows: list[Row]) -> str | None:
    sent = [r for r in rows if r.dispatched_ns is not None]
    if not sent:
        return None
    answered = sum(1 for r in sent if r.http_status is not None)
    refused = sum(1 for r in sent if r.error_kind == ErrorKind.CONNECT_FAILED)
    if answered and refused <= MOST * len(sent):
        return None
    kinds = Counter(r.error_kind or r.outcome for r in sent if r.http_status is None)
    top = ", ".join(f"{n} {k}" for k, n in kinds.most_common(3))
    example = next((r.error_detail for r in sent if r.error_detail), "")
    what = "no request reached the server" if not answered else \
        f"{refused} of {len(sent)} requests failed to connect"
    return f"target unreachable: {what} ({top}){'; e.g. ' + example if example else ''}"
