"""The pool of a closed loop bounded by a duration (`--concurrency N --duration D`).

Every request body is built before t0 (run/prepare.py), but how many requests N users send in D is the
server's to decide. So the plan holds a pool: per user, ceil(D x run.max_user_rate) rows (default 10/s,
i.e. requests of 100 ms on average), or fewer when a think time T bounds a user below that: a user sends
at t0 and then at most once per T, so floor(D / T) + 1 rows can never run out. The pool is N x that.

The users take rows from the pool in plan order (client/closedloop.py). A row the users never reached
by the deadline is not part of the run: it has no row in requests.parquet and the manifest's
`schedule.requests` counts only the rows the run scheduled (`schedule.pool` says how many the pool held).
A pool used up before the deadline ends the run early; the run says so (a WARNING, and
`schedule.pool.exhausted` in the manifest) and the remedy: a higher run.max_user_rate.
"""
from __future__ import annotations

import math

from loadgen.config.runconfig import RunConfig

NS_PER_S = 1_000_000_000


def is_pooled(config: RunConfig) -> bool:
    """A closed loop bounded by a duration: its plan is a pool (this module's docstring)."""
    return bool(config.concurrency) and config.duration_ns is not None and config.requests is None


def per_user_requests(config: RunConfig) -> int:
    """Rows of one user's share of the pool (>= 1: every user sends at t0)."""
    assert config.duration_ns is not None  # is_pooled
    by_rate = math.ceil(config.duration_ns * config.max_user_rate_per_s / NS_PER_S)
    by_think = config.duration_ns // config.think_ns + 1 if config.think_ns else by_rate
    return max(1, min(by_rate, by_think))


def pool_requests(config: RunConfig) -> int:
    """Rows of the whole pool: the run's users times each one's share (a --workers share plans the whole
    run's pool, pool_users, and runs its part of it: run/workers.py)."""
    return (config.pool_users or config.concurrency) * per_user_requests(config)
