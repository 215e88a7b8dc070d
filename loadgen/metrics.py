"""Every metric loadgen reports, defined once: per-request latencies, the per-token ITL rule, percentiles.

The summary, the live interval histograms (*.hlog), the generator's self-check, the decomposition and the
stall attribution all take their numbers from here; no other module subtracts two timestamp columns.

Per request (int64 ns, any common origin; columns of requests.parquet or fields of a Row):
    send_lag       = dispatched - intended - slot_wait  the generator's own lateness. A wait for a
                                                          --max-concurrency slot is the user's cap, not
                                                          the generator falling behind: it is its own
                                                          metric (slot_wait) and stays inside ttft/e2e
    slot_wait      = slot_wait_ns                         0 without a cap
    connect        = connected - dispatched               0 on a reused connection
    ttft           = first_token - intended               latency from the plan (wrk2); the first
                                                          output token of any kind, reasoning included,
                                                          as engines define TTFT
    ttfa           = first_answer - intended              time to the first answer token (content or a
                                                          tool call's text), the same origin: what a user
                                                          of a reasoning model waits for. Null when the
                                                          stream had no answer (or the folder predates
                                                          the column); == ttft without reasoning
    ttft_from_send = first_token - dispatched
    e2e            = last_token - intended
    decode         = last_token - first_token
    tpot           = decode / (output_tokens - 1)         rows with output_tokens > 1
Rows each metric covers (ROWS): send_lag, slot_wait and connect every row where they are defined (every
dispatched row), the others ok rows only (OK_ROWS, the one spelling of that predicate). Warm-up rows are
left out by the callers.

Rates (events per second): rate_per_s = (n - 1) / span, the plan's offered rate (Schedule.offered_rate_per_s)
and the summary's offered and achieved rates; fitted_rate_per_s = 1 / the least-squares slope, the
completion rate of twin predictions; steady_rates: the offered and completed rates over a run's
steady-state window, the sweep's (docs/metrics.md, "Steady-state rates").

ITL, per token (_itl_groups; gap_arrays over tokens.parquet, itl_samples_ns over arrays): the chunks of
one request that carry tokens and share a stamp arrived in one read and form one group of k tokens (the
sum of their tokens); each gap between a group and the previous group of the same request counts as k
samples of gap / k. So a request's samples sum to last_token - first_token, a k-token chunk is not one
long gap, and chunks read together are never a run of zero gaps. The first group's tokens have no gap
before them and add no sample.

Percentiles (quantile, distribution): nearest rank, the ceil(p * n)-th smallest sample, as HdrHistogram's
Java and JavaScript implementations compute it (hdr.percentiles_us applies the same rank to bucket counts,
so an HDR percentile is the exact one rounded up to its bucket's highest equivalent value: within 0.1 %).
No interpolation: every percentile printed is a value that was measured.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any, NamedTuple, TypeVar

import numpy as np
import numpy.typing as npt
import polars as pl

_Frame = TypeVar("_Frame", pl.DataFrame, pl.LazyFrame)

NS_PER_MS = 1_000_000
QUANTILES = {"p50": 0.5, "p90": 0.9, "p99": 0.99, "p999": 0.999}
STATS = (*QUANTILES, "max", "mean")
PERCENTILE_RULE = "nearest rank (the ceil(p*n)-th smallest sample, as HdrHistogram's Java implementation)"

_c = pl.col
# The rows that completed: outcome ok (client.recorder.Outcome.OK, whose value this spells: metrics sits
# below the client). Every frame filter on it outside the hot path uses this expression.
OK_ROWS: pl.Expr = _c("outcome") == "ok"


class _Ops(NamedTuple):
    """What a metric's definition does with columns, for one kind of column (a Polars expression, or a
    float64 array with NaN for null): the definitions below are written once and evaluated by both."""
    col: Callable[[str], Any]
    when: Callable[[Any, Any], Any]     # (condition, value): the value where the condition holds, else null
    fill0: Callable[[Any], Any]         # null -> 0
    present: Callable[[Any], Any]       # not null


def _definitions(o: _Ops) -> dict[str, Any]:
    # name -> the metric in ns over requests.parquet's columns (or a Row's fields): see the module comment
    c = o.col
    slot_wait, decode = o.fill0(c("slot_wait_ns")), c("last_token_ns") - c("first_token_ns")
    return {
        "send_lag": c("dispatched_ns") - c("intended_ns") - slot_wait,
        "slot_wait": o.when(o.present(c("dispatched_ns")), slot_wait),
        "connect": c("connected_ns") - c("dispatched_ns"),
        "ttft": c("first_token_ns") - c("intended_ns"),
        "ttfa": c("first_answer_ns") - c("intended_ns"),
        "ttft_from_send": c("first_token_ns") - c("dispatched_ns"),
        "e2e": c("last_token_ns") - c("intended_ns"),
        "decode": decode,
        "tpot": o.when(c("output_tokens") > 1, decode / (c("output_tokens") - 1)),
    }


EXPR_NS: dict[str, pl.Expr] = _definitions(_Ops(_c, lambda cond, x: pl.when(cond).then(x),
                                                 lambda e: e.fill_null(0), lambda e: e.is_not_null()))


def values_ns(columns: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Every metric of EXPR_NS, row by row, over float64 columns with NaN for null (a missing column is all
    null): what a Polars frame would give, without a query per call (the live histograms' second-by-second
    values, a few rows at a time, where Polars' fixed cost per query was ~1 ms; run/intervals.py).
    Comparisons with NaN are false, so a NaN condition gives null as Polars' does."""
    n = len(next(iter(columns.values()))) if columns else 0
    none = np.full(n, np.nan)
    with np.errstate(invalid="ignore", divide="ignore"):
        out: dict[str, np.ndarray] = _definitions(_Ops(
            lambda name: columns.get(name, none), lambda cond, x: np.where(cond, x, np.nan),
            lambda a: np.nan_to_num(a, nan=0.0), lambda a: ~np.isnan(a)))
    return out


# Which rows a metric's distribution covers: "sent" = every dispatched row, "ok" = ok rows only.
ROWS = {"send_lag": "sent", "slot_wait": "sent", "connect": "sent", "ttft": "ok", "ttfa": "ok",
        "ttft_from_send": "ok",
        "e2e": "ok", "decode": "ok", "tpot": "ok", "itl": "ok"}


def latency_columns(requests: _Frame, unit_ns: float = NS_PER_MS, suffix: str = "",
                    names: Iterable[str] = tuple(EXPR_NS)) -> _Frame:
    """requests with one column per metric (`name + suffix`), in units of unit_ns (ms by default)."""
    return requests.with_columns(**{n + suffix: (EXPR_NS[n] / unit_ns if unit_ns != 1 else EXPR_NS[n])
                                    for n in names})


# --- rates ---------------------------------------------------------------------------------------------

def gap_cv(times_ns: np.ndarray) -> float | None:
    t = np.sort(np.asarray(times_ns, dtype=np.int64))
    if t.size < 3:
        return None
    g = np.diff(t).astype(np.float64)
    m = g.mean()
    return float(g.std() / m) if m > 0 else None


def rate_per_s(times_ns: np.ndarray) -> float | None:
    # (n - 1) / span: the rate of n events (the summary's offered and achieved rates too).
    t = np.asarray(times_ns, dtype=np.int64)
    if t.size < 2:
        return None
    span = int(t.max() - t.min())
    return (t.size - 1) * 1e9 / span if span > 0 else None


# --- ITL --------------------------------------------------------------------------------------------------

def _itl_groups(key: np.ndarray, t_ns: np.ndarray, n_tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The ITL rule on arrays (chunks with tokens, each key's rows contiguous and in time order): for every
    group that has a gap before it, the row of its first chunk, the previous group's stamp and its tokens k."""
    n = key.size
    same = np.zeros(n, bool)
    np.equal(key[1:], key[:-1], out=same[1:])
    first = ~same
    first[1:] |= t_ns[1:] != t_ns[:-1]
    starts = np.flatnonzero(first)
    del first
    k = np.add.reduceat(n_tokens, starts) if n else np.zeros(0, np.int64)
    with_gap = same[starts]
    rows = starts[with_gap]
    return rows, t_ns[rows - 1], k[with_gap]


class Gaps(NamedTuple):
    """request_gaps as arrays (one entry per gap; each request's gaps contiguous, in time order):
    owner indexes names (the request ids); t_ns ends the gap, prev_ns starts it, k tokens ended it."""
    names: pl.Series
    owner: np.ndarray
    t_ns: np.ndarray
    prev_ns: np.ndarray
    k: np.ndarray

    @property
    def gap_ns(self) -> np.ndarray:
        gap: np.ndarray = self.t_ns - self.prev_ns
        return gap


def gap_arrays(tokens: pl.DataFrame, request_ids: pl.Series | None = None) -> Gaps:
    """The gaps of every stream in a tokens.parquet frame (of `request_ids` only, when given).
    tokens.parquet holds each request's chunks contiguously in idx order (results/folder.py writes it so): then
    no sort is needed (a sort of 10 M string-keyed rows costs seconds); otherwise it sorts."""
    t = tokens.filter(_c("n_tokens") > 0) if (tokens["n_tokens"] <= 0).any() else tokens
    for attempt in ("as written", "sorted"):
        ids = t["request_id"]
        change = (ids != ids.shift(1)).fill_null(True).to_numpy()
        names = ids.filter(change)
        t_ns = t["t_ns"].to_numpy()
        backwards = bool(np.any((t_ns[1:] < t_ns[:-1]) & ~change[1:]))
        if attempt == "sorted" or (names.n_unique() == names.len() and not backwards):
            break
        t = t.sort("request_id", "t_ns")
    rid = np.cumsum(change, dtype=np.int32) - 1
    del change
    rows, prev_ns, k = _itl_groups(rid, t_ns, t["n_tokens"].to_numpy())
    owner = rid[rows]
    del rid
    if request_ids is not None:
        wanted = names.is_in(request_ids.cast(pl.String).implode()).to_numpy()[owner]
        rows, prev_ns, k, owner = rows[wanted], prev_ns[wanted], k[wanted], owner[wanted]
    return Gaps(names, owner, t_ns[rows], prev_ns, k)


def request_gaps(tokens: pl.DataFrame, request_ids: pl.Series | None = None) -> pl.DataFrame:
    """gap_arrays as a frame: request_id, rid (an integer key per request), t_ns, prev_ns, gap_ns, k."""
    g = gap_arrays(tokens, request_ids)
    return pl.DataFrame({"request_id": g.names.gather(g.owner), "rid": g.owner, "t_ns": g.t_ns,
                         "prev_ns": g.prev_ns, "gap_ns": g.gap_ns, "k": g.k})


def itl_samples_ns(t_ns: np.ndarray, n_tokens: np.ndarray, owner: np.ndarray) -> np.ndarray:
    """Per-token ITL samples (ns, float64) of chunks sorted by owner, then time (the ITL rule)."""
    with_tokens = np.asarray(n_tokens, np.int64) > 0
    t = np.asarray(t_ns, np.int64)[with_tokens]
    rows, prev_ns, k = _itl_groups(np.asarray(owner, np.int64)[with_tokens], t,
                                   np.asarray(n_tokens, np.int64)[with_tokens])
    return np.repeat((t[rows] - prev_ns) / k, k) if rows.size else np.empty(0)


# --- percentiles ------------------------------------------------------------------------------------------

_Q_SCALE = 1_000_000  # quantiles are read to 6 decimals, so that 0.99 of 100 is rank 99, not 100 by rounding


def rank(q: float, n: int) -> int:
    """The 1-based nearest rank of quantile q (0..1) among n samples: ceil(q * n), at least 1 (integers)."""
    return min(n, max(1, -(-n * round(q * _Q_SCALE) // _Q_SCALE)))


def ranks(q: float, n: np.ndarray) -> np.ndarray:
    """rank() for an array of sample counts (0 where n is 0)."""
    n = np.asarray(n, dtype=np.int64)
    k = round(q * _Q_SCALE)
    out: np.ndarray = np.minimum(n, np.maximum(1, (n * k + _Q_SCALE - 1) // _Q_SCALE)) * (n > 0)
    return out


def quantile_expr(column: str, q: float) -> pl.Expr:
    """The same nearest-rank quantile as a Polars aggregation (nulls and NaNs left out)."""
    v = _c(column).drop_nulls().drop_nans().sort()
    k = round(q * _Q_SCALE)
    return v.get(((v.len().cast(pl.Int64) * k + _Q_SCALE - 1) // _Q_SCALE).clip(1) - 1)


def quantiles(values: np.ndarray, qs: Iterable[float]) -> list[float]:
    v = np.asarray(values, dtype=np.float64)
    v = v[~np.isnan(v)]
    qs = list(qs)
    if v.size == 0:
        return [math.nan] * len(qs)
    idx = [rank(q, v.size) - 1 for q in qs]
    part = np.partition(v, idx)
    return [float(part[i]) for i in idx]


def distribution(values: pl.Series | npt.ArrayLike, scale: float = 1.0) -> dict[str, float | None]:
    """p50/p90/p99/p999 (nearest rank), max and mean of the samples, each divided by scale (so a
    distribution of ns samples in ms is the ns figure / 1e6, as every other consumer computes it);
    all None when there are no samples."""
    if isinstance(values, pl.Series):
        values = values.drop_nulls().cast(pl.Float64).to_numpy()
    v = np.asarray(values, dtype=np.float64)
    v = v[~np.isnan(v)]
    if v.size == 0:
        return {s: None for s in STATS}
    out = dict(zip(QUANTILES, quantiles(v, QUANTILES.values())))
    out["max"], out["mean"] = float(v.max()), float(v.mean())
    return {k: x / scale for k, x in out.items()}


def fitted_rate_per_s(times_ns: npt.ArrayLike) -> float | None:
    """Events per second as 1 / the least-squares slope of the sorted times against their rank: every
    event weighs in, so one slow last request (or a fast first one) does not move the rate the way it
    moves (n - 1) / span."""
    t = np.sort(np.asarray(times_ns, dtype=np.float64))
    if t.size < 3:
        return None
    i = np.arange(t.size, dtype=np.float64)
    slope_ns = float(np.cov(i, t, bias=True)[0, 1] / np.var(i))
    return 1e9 / slope_ns if slope_ns > 0 else None


class SteadyRates(NamedTuple):
    """A run's rates over its steady-state window [start_ns, end_ns] (steady_rates)."""
    start_ns: int
    end_ns: int
    offered_per_s: float
    completed_per_s: float   # within [0, offered_per_s]
    short: bool              # the fill (p90 e2e) was longer than half the sends: window capped, backlog rule
    method: str              # "trend" or "backlog"


STEADY_FILL_QUANTILE = 0.9
STEADY_MIN_REQUESTS = 10


def _mean_count(t_ns: np.ndarray, lo: float, hi: float) -> float:
    # the time-average over [lo, hi] of #(t <= x): each event counts for the share of the span after it
    return float(np.clip(hi - np.maximum(t_ns, lo), 0.0, hi - lo).sum() / (hi - lo))


def steady_rates(intended_ns: npt.ArrayLike, done_ns: npt.ArrayLike, measured_from_ns: int) -> SteadyRates | None:
    """The offered and completed rates of one run over its steady-state window (docs/metrics.md,
    "Steady-state rates"). intended_ns, done_ns: every row of the run, warm-up included (they occupy the
    server too); done_ns NaN for a row that never ended. measured_from_ns: the first measured (non-warm-up)
    intended send.

    Window: from measured_from + fill to the last intended send, fill = the p90 e2e (done - intended) of
    the measured rows, at most half the measured send span (then `short`). offered = the sends in the
    window / its length. completed:
      trend    (not short) offered / the least-squares slope of done against intended over the requests
               sent in the window (a row that never ended counts as done at the run's last end): 1 in a
               steady state, offered / capacity past it, since each request then waits longer than the
               one before. Per request, so Poisson noise in the arrivals does not read as falling behind.
      backlog  (short: the run is too short for its latency, as past saturation, or a continuous-batching
               server finishing every request in one bunch once the sends stop) offered - the growth of
               the backlog b(t) = #sent by t - #ended by t: its time-average over the window's second half
               minus that over its first half, per half the window's length. Nothing that ends after the
               last send counts, so a bunch reads as behind, as it is.
    Both clipped to [0, offered]. None when fewer than STEADY_MIN_REQUESTS sends fall in the window."""
    sent = np.asarray(intended_ns, dtype=np.float64)
    done = np.asarray(done_ns, dtype=np.float64)
    timed = ~np.isnan(sent)  # a row without an intended time (a session turn never timed) offers nothing
    sent, done = sent[timed], done[timed]
    if sent.size == 0:
        return None
    end = float(sent.max())
    measured = sent >= measured_from_ns
    ended = ~np.isnan(done)
    half = (end - measured_from_ns) / 2
    e2e = (done - sent)[measured & ended]
    fill = quantiles(e2e, [STEADY_FILL_QUANTILE])[0] if e2e.size else math.inf
    short = not fill <= half
    start = measured_from_ns + (half if short else fill)
    window = (sent >= start) & (sent <= end)
    n = int(window.sum())
    if n < STEADY_MIN_REQUESTS or end <= start:
        return None
    span_s = (end - start) / 1e9
    offered = n / span_s
    if not short:
        x, y = sent[window], np.where(ended, done, float(np.nanmax(done)))[window]
        slope = float(np.cov(x, y, bias=True)[0, 1] / np.var(x))
        completed = offered / slope if slope > 1 else offered
        return SteadyRates(round(start), round(end), offered, completed, short, "trend")
    mid = (start + end) / 2

    def backlog(lo: float, hi: float) -> float:
        return _mean_count(sent, lo, hi) - _mean_count(done[ended], lo, hi)

    growth = (backlog(mid, end) - backlog(start, mid)) / (span_s / 2)
    return SteadyRates(round(start), round(end), offered, min(offered, max(0.0, offered - growth)), short, "backlog")


def number(v: object) -> float:
    """A polars aggregate of a numeric column (Series.max(), .min(), .mean(), .sum(), ...), returned
    unchanged (an int stays an int, so ns arithmetic stays exact). Polars types these as any Python
    literal; a numeric column gives an int or a float, and anything else (None: no non-null value)
    raises TypeError, as float(None) or None - 1 did before."""
    if isinstance(v, (int, float)):
        return v
    raise TypeError(f"not a number: {v!r}")
