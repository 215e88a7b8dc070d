"""The goals `make bench` holds loadgen to, judged against the bare client measured in the same run.

One row per goal (issue 29): the p99 TTFT and ITL errors at most 0.5 ms above the bare client's, in every
repetition (BENCH_REPEATS alternating runs: a stall in one of them is a miss), and the CPU per streamed chunk at
most 1.3x the bare client's, over the repetitions together (each client's CPU summed over its runs, per chunk
summed: the per-run ratios are printed beside it), at every rate from 100 to 800 req/s; and at 2,000 req/s,
loadgen alone against fastmock: the Poisson shape at the server and a send lag p99 of at most 1 ms. A miss makes
`make bench` exit non-zero after printing every figure: the bench is a regression guard, not a test (CI does not
run it: a noisy host misses goals a quiet one meets; the note of a change on the hot path shows its figures).

Why the CPU goal pools its runs and the error goals do not: an error's p99 is a tail, and one stalled run is a
miss the others cannot make up for. CPU per chunk has no tail; a single run's ratio moves with whatever the host
did to either client during its 6-15 s (on the 2-core VM the bare client's own CPU per chunk moved +-10 % run to
run at 100 req/s, loadgen's as much: docs/scale-out.md), and the summed runs, alternating, share the host's
phases between the two clients.
"""
from __future__ import annotations

from collections.abc import Iterable

# (result column, what is compared, the bound): "over" = loadgen - bare <= bound (ms), "ratio" = loadgen/bare
GOALS = (("ttft_err_p99_ms", "over", 0.5), ("itl_gap_err_p99_ms", "over", 0.5), ("cpu_us_per_chunk", "ratio", 1.3))
RATES_PER_S = (100.0, 800.0)   # the goals hold at every rate in this range (both ends included)
# loadgen alone at 2,000 req/s of 16-token streams on one core (issue 29 part 3): the Poisson shape kept at the
# server (gap CV within 0.1 of 1) and the send lag p99 at most 1 ms. Judged against fastmock only: the one-core
# simulator saturates near 1,600 req/s, and its own lateness moves what it records as arrivals.
ONE_CORE_RATE_PER_S = 2000.0
ONE_CORE_GOALS = (("arrival_cv_at_server", "cv", 0.1), ("send_lag_p99_ms", "at most", 1.0))


def pairs(results: Iterable[dict]) -> dict[tuple, tuple[dict, dict]]:
    """(kind, rate, rep) -> (loadgen's result, the bare client's), for every case both ran without error."""
    by = {(r["kind"], r["rate_per_s"], r.get("rep", 0), r["client"]): r for r in results if "error" not in r}
    return {k[:3]: (r, by[(*k[:3], "bare")]) for k, r in by.items()
            if k[3] == "loadgen" and (*k[:3], "bare") in by}


def pooled(runs: Iterable[dict], col: str) -> float:
    """A per-chunk figure over several runs together: the runs' totals (figure x chunks) over their chunks (a run
    without a chunk count weighs 1)."""
    weighted = [(r[col] * (r.get("chunks") or 1), r.get("chunks") or 1) for r in runs]
    return sum(w for w, _ in weighted) / sum(n for _, n in weighted)


def judge(results: Iterable[dict]) -> tuple[list[str], list[str]]:
    """(lines: every judged figure, misses: the lines of the goals missed)."""
    results = list(results)   # read twice: the pairs against the bare client, then loadgen alone
    lines, misses = [], []

    def verdict(ok: bool, line: str) -> None:
        lines.append(("ok    " if ok else "MISSED ") + line)
        if not ok:
            misses.append(line)

    judged = {k: v for k, v in sorted(pairs(results).items()) if RATES_PER_S[0] <= k[1] <= RATES_PER_S[1]}
    for (kind, rate, rep), (lg, bare) in judged.items():
        for col, how, bound in GOALS:
            if how != "over":
                continue
            a, b = lg.get(col), bare.get(col)
            if a is None or b is None:
                verdict(False, f"{kind} {rate:g}/s run {rep + 1}: {col} not measured (loadgen {a}, bare {b})")
            else:
                verdict(a - b <= bound, f"{kind} {rate:g}/s run {rep + 1}: {col} loadgen {a:.3f} - bare {b:.3f} = "
                                        f"{a - b:+.3f} ms (goal <= +{bound} ms)")
    cells: dict[tuple, list[tuple[dict, dict]]] = {}
    for (kind, rate, _), both in judged.items():
        cells.setdefault((kind, rate), []).append(both)
    for (kind, rate), runs in cells.items():
        for col, how, bound in GOALS:
            if how != "ratio":
                continue
            head = f"{kind} {rate:g}/s, {len(runs)} run{'s' * (len(runs) > 1)}: {col}"
            if any(lg.get(col) is None or not bare.get(col) for lg, bare in runs):
                verdict(False, f"{head} not measured in every run")
                continue
            ratio = pooled((lg for lg, _ in runs), col) / pooled((bare for _, bare in runs), col)
            each = ", ".join(f"{lg[col] / bare[col]:.2f}" for lg, bare in runs)
            verdict(ratio <= bound, f"{head} loadgen / bare = {ratio:.2f}x over the runs (each run: {each}) "
                                    f"(goal <= {bound}x)")
    for r in results:
        if r.get("client") != "loadgen" or r.get("rate_per_s") != ONE_CORE_RATE_PER_S or "error" in r:
            continue
        head = f"{r['kind']} {ONE_CORE_RATE_PER_S:g}/s run {r.get('rep', 0) + 1}"
        if r.get("server") != "fastmock":
            lines.append(f"-      {head}: not judged (server {r.get('server')}: "
                         "only fastmock takes 2,000/s on one core)")
            continue
        for col, how, bound in ONE_CORE_GOALS:
            v = r.get(col)
            ok = v is not None and (round(abs(v - 1), 9) <= bound if how == "cv" else v <= bound)
            line = (f"{head}: {col} {v:.3f} (goal " + (f"1 ± {bound})" if how == "cv" else f"<= {bound})")
                    if v is not None else f"{head}: {col} not measured")
            verdict(ok, line)
    return lines, misses
