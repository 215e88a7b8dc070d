"""`loadgen predict`: a workload's latency at other rates, from a profile (shipped or written by
`loadgen fit`), by running the simulator's engine (sim/engine.py, the same step loop `loadgen sim`
serves) in virtual time: no server, no sockets, no sleeping, deterministic for a seed.

Each request reaches the engine at its planned time + the profile's request_overhead_us; its first
token is at the end of the step that completes its prompt, each next token at the end of its next
step. The rows carry requests.parquet's timestamp columns, so TTFT, TPOT and e2e come from
loadgen.metrics like a measured run's (dispatched = intended: no client lateness is predicted).

Capacity (`capacity_per_s`): the largest rate the engine sustains = its completion rate while saturated,
in steady state. The plan's (prompt, output) pairs are repeated until there are at least
CAPACITY_MIN_REQUESTS (and CAPACITY_SLOT_ROUNDS x max_num_seqs) requests and offered at a constant rate
CAPACITY_OVERLOAD times an all-at-once estimate; the completions counted are those at which a request
was waiting for admission (the engine had more work than it takes: saturated), after the first
max_num_seqs of them (the transient while the queue forms). Neither the drain of a finite burst (the
batch shrinks and speeds up: counting it had put a knee above the capacity) nor the waves of a batch
admitted all at once (its sequences finish together: a few % slower than the staggered batch an open
loop keeps) are counted. A try whose queue hardly formed (fewer than CAPACITY_MIN_SATURATED counted, or
completions keeping up with the offer) is run again offering CAPACITY_OVERLOAD times more.

The knee is `loadgen sweep`'s (analysis/knee.py: knee, keeps_up; a rate keeps up when the completion rate,
fitted over the last tokens, is within 5 % of the offered rate, fitted over the intended sends), with
one rule more, from the same model: a point whose rate (asked or offered) is above the capacity does not
keep up (`above_capacity`: its queue grows without bound, however a finite run of it drains). Its keys
are over the given rates, plus knee.bisected_rate_per_s: the same rule bisected (KNEE_STEPS steps,
geometric) between the given rates, widened until they bracket it, which virtual time makes cheap; and
knee.capacity_per_s. So every knee is at most the capacity (tests/unit/test_predict.py checks it, and
that a long run at 0.9 x the capacity keeps its queue while one at 1.1 x grows it, over several
profiles). Workloads with conversations
(turns that wait for a reply) are not predicted (the plan's send times depend on replies).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
import polars as pl

from loadgen import metrics
from loadgen.errors import InputError
from loadgen.sim.engine import Engine, EngineConfig
from loadgen.sim.profiles import Profile
from loadgen.analysis.knee import keeps_up
from loadgen.analysis.knee import knee as sweep_knee
from loadgen.config.workload import load
from loadgen.plan.schedule import build
from loadgen.twin.intervals import LEVEL, Spread, band

KNEE_STEPS = 10
CAPACITY_MIN_REQUESTS = 1000
CAPACITY_SLOT_ROUNDS = 6           # requests per slot at least: the batch turns over many times
CAPACITY_OVERLOAD = 1.25           # the capacity run offers this times the all-at-once estimate
CAPACITY_TRIES = 4                 # each further try offers CAPACITY_OVERLOAD times more
CAPACITY_MIN_SATURATED = 100       # completions counted while the queue was not empty, at least
LATENCIES = ("ttft", "tpot", "e2e")


@dataclass
class _Req:  # what the engine needs of a request (engine.Request)
    request_id: str
    arrival_ns: int
    prompt: range
    max_tokens: int
    scheduled_ns: int | None = None
    preemptions: int = 0
    stall_ns: int = 0
    cached_tokens: int = 0
    priority: int = 0
    stalled: bool = False


def simulate(profile: Profile, intended_ns: np.ndarray, prompt_tokens: np.ndarray, max_tokens: np.ndarray
             ) -> pl.DataFrame:
    """One row per request: intended_ns, dispatched_ns, first_token_ns, last_token_ns, output_tokens,
    outcome ('ok', or 'error' for a request the engine refuses: longer than the model or KV pool), and
    scheduled_ns (when the engine first admitted it; null when refused)."""
    eng = Engine(profile, EngineConfig.from_profile(profile))
    lag = round(profile.request_overhead_us * 1e3)
    n = len(intended_ns)
    order = np.argsort(intended_ns, kind="stable")
    first = np.full(n, -1, dtype=np.int64)
    last = np.full(n, -1, dtype=np.int64)
    out = np.zeros(n, dtype=np.int64)
    ok = np.ones(n, dtype=bool)
    index = {}
    reqs = []
    for i in order:
        r = _Req(str(i), int(intended_ns[i]) + lag, range(int(prompt_tokens[i])), int(max_tokens[i]))
        index[id(r)] = i
        reqs.append(r)
    k, t = 0, 0
    while k < n or eng.has_work():
        while k < n and reqs[k].arrival_ns <= t:
            try:
                eng.add(reqs[k])
            except ValueError:
                ok[index[id(reqs[k])]] = False
            k += 1
        step = eng.schedule(t)
        if step is None:
            if k >= n:
                break  # nothing can run and nothing will arrive (cannot happen with a sane profile)
            t = max(t, reqs[k].arrival_ns)
            continue
        for seq, _done in eng.complete(step):
            i = index[id(seq.req)]
            if first[i] < 0:
                first[i] = step.end_ns
            last[i] = step.end_ns
            out[i] = seq.num_output
        t = step.end_ns
    done = ok & (first >= 0)
    return pl.DataFrame({
        "intended_ns": intended_ns.astype(np.int64), "dispatched_ns": intended_ns.astype(np.int64),
        "first_token_ns": pl.Series(first).replace(-1, None), "last_token_ns": pl.Series(last).replace(-1, None),
        "output_tokens": out, "outcome": np.where(done, "ok", "error"),
        "scheduled_ns": pl.Series([r.scheduled_ns for r in reqs], dtype=pl.Int64)[np.argsort(order)]})


def point(rows: pl.DataFrame, warmup: np.ndarray) -> dict:
    """Latency distributions (ms) and rates of one simulated or measured run's rows (ok, not warm-up)."""
    df = metrics.latency_columns(rows.filter(~pl.Series(warmup)), suffix="_ms", names=LATENCIES)
    okr = df.filter(metrics.OK_ROWS)
    p = {"requests": df.height, "ok": okr.height, "valid": True,
         "offered_per_s": metrics.fitted_rate_per_s(okr["intended_ns"].to_numpy()),
         "completed_per_s": metrics.fitted_rate_per_s(okr["last_token_ns"].to_numpy()),
         "latency_ms": {m: metrics.distribution(okr[f"{m}_ms"]) for m in LATENCIES}}
    p["keeps_up"] = keeps_up(p)
    return p


class Plan:
    """The workload's schedule at any rate (config.load + schedule.build with --rate)."""

    def __init__(self, workload: str, overrides: dict):
        self.workload, self.overrides = workload, dict(overrides)
        base = self._build(None)
        if base.after is not None and (np.asarray(base.after) >= 0).any():
            raise InputError([f"{workload}: conversations (turns that wait for a reply) cannot be predicted"])

    def _build(self, rate: float | None):
        o = dict(self.overrides)
        if rate is not None:
            o["--rate"] = f"{rate:.6g}/s"
        return build(load(self.workload, o))

    def run(self, profile: Profile, rate: float | None, at_once: bool = False,
            capacity_per_s: float | None = None) -> dict:
        """One point; with capacity_per_s, a point above it does not keep up (judge)."""
        s = self._build(rate)
        intended = np.zeros_like(s.intended_ns) if at_once else s.intended_ns
        rows = simulate(profile, intended, s.prompt_tokens, s.max_tokens)
        p = point(rows, np.asarray(s.warmup, dtype=bool))
        return judge(p, rate, capacity_per_s) if capacity_per_s is not None else p

    def capacity_per_s(self, profile: Profile) -> float | None:
        """The engine's steady completion rate while saturated (the module's docstring); None when too
        few requests complete to count it."""
        s = self._build(None)
        if not len(s):
            return None
        n = max(CAPACITY_MIN_REQUESTS, CAPACITY_SLOT_ROUNDS * profile.max_num_seqs, len(s))
        reps = math.ceil(n / len(s))
        prompt, out = np.tile(s.prompt_tokens, reps)[:n], np.tile(s.max_tokens, reps)[:n]
        # A first estimate, all at once: admitted together, the batch then runs in waves, a few % slower
        # than the staggered batch of an open loop, so the offer below is an overload.
        done = np.sort(simulate(profile, np.zeros(n, dtype=np.int64), prompt, out)
                       .filter(pl.col("outcome") == "ok")["last_token_ns"].to_numpy())
        if done.size < 2 or done[-1] <= done[0]:
            return None
        offered = CAPACITY_OVERLOAD * (done.size - 1) / ((done[-1] - done[0]) / 1e9)
        for _ in range(CAPACITY_TRIES):
            rows = simulate(profile, (np.arange(n) * (1e9 / offered)).astype(np.int64), prompt, out)
            rate, counted = saturated_rate(rows, round(profile.request_overhead_us * 1e3), profile.max_num_seqs)
            if rate is not None and counted >= CAPACITY_MIN_SATURATED and rate < offered:
                return rate
            offered *= CAPACITY_OVERLOAD  # the queue hardly formed: offer more
        return None


def saturated_rate(rows: pl.DataFrame, lag_ns: int, skip: int) -> tuple[float | None, int]:
    """(completions per second while a request was waiting for admission, how many were counted): the
    completions at which the engine had more work than it admits, after the first `skip` of them (the
    transient while the queue forms); simulate()'s rows, lag_ns its admission lag."""
    ok = rows.filter(pl.col("outcome") == "ok")
    arrived = np.sort(rows["intended_ns"].to_numpy() + lag_ns)
    admitted = np.sort(ok["scheduled_ns"].to_numpy())
    done = np.sort(ok["last_token_ns"].to_numpy())
    waiting = np.searchsorted(arrived, done, side="right") - np.searchsorted(admitted, done, side="right")
    busy = done[waiting > 0][skip:]
    if busy.size < 2 or busy[-1] <= busy[0]:
        return None, int(busy.size)
    return float((busy.size - 1) / ((busy[-1] - busy[0]) / 1e9)), int(busy.size)


def judge(p: dict, rate: float | None, capacity_per_s: float | None) -> dict:
    """The point's keeps_up with the capacity rule: above the capacity (its asked or its offered rate) it
    does not keep up, whatever a finite run of it shows."""
    rates = [r for r in (rate, p["offered_per_s"]) if r is not None]
    above = capacity_per_s is not None and any(r > capacity_per_s for r in rates)
    return {**p, "above_capacity": above, "keeps_up": p["keeps_up"] and not above}


def knee(plan: Plan, profile: Profile, points: list[dict], capacity_per_s: float | None) -> dict:
    """`loadgen sweep`'s knee over the given rates (same keys; points judged with the capacity), plus the
    same rule bisected between them in virtual time, and the capacity."""
    out = _capacity_bound(sweep_knee(points), points)
    rates = [p["rate_per_s"] for p in points]

    def up(r: float) -> bool:
        return plan.run(profile, r, capacity_per_s=capacity_per_s)["keeps_up"]
    lo, hi = min(rates), max(rates)
    while lo > 1e-6 and not up(lo):
        lo /= 2
    while up(hi) and hi < 1e6:
        lo, hi = hi, hi * 2
    for _ in range(KNEE_STEPS):
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if up(mid) else (lo, mid)
    out.update({"bisected_rate_per_s": lo, "bisected_first_saturated_per_s": hi, "bisected_resolution_rel": hi / lo - 1,
                "capacity_per_s": capacity_per_s,
                "bisected_rule": f"the same rule bisected {KNEE_STEPS} times (geometric) between the given rates, "
                                 "widened until they bracket it; a rate above the capacity does not keep up; "
                                 "capacity: the completion rate of the saturated engine in steady state (the "
                                 f"plan's requests, at least {CAPACITY_MIN_REQUESTS}, offered past it; completions "
                                 "counted while a request waited for admission)"})
    return out


def _capacity_bound(out: dict, points: list[dict]) -> dict:
    """The sweep's knee over the given rates with judge()'s rule: the first point above the capacity is
    saturated when the sweep's own rule found none before it (the knee is the point below it)."""
    pts = sorted(points, key=lambda p: p["rate_per_s"])
    above = next((i for i, p in enumerate(pts) if p.get("above_capacity")), None)
    first = out["first_saturated_per_s"]
    if above is None or (first is not None and first <= pts[above]["rate_per_s"]):
        return out
    bad, at = pts[above], (pts[above - 1] if above else None)
    return {**out, "rate_per_s": at and at["rate_per_s"], "offered_per_s": at and at.get("offered_per_s"),
            "first_saturated_per_s": bad["rate_per_s"], "first_saturated_offered_per_s": bad.get("offered_per_s"),
            "completed_per_s_past_knee": bad.get("completed_per_s"), "saturated": True,
            "rule": out["rule"] + "; a point above the capacity does not keep up"}


def with_settings(profile: Profile, spread: Spread, sets: dict) -> tuple[Profile, Spread]:
    """What if (`predict --set`): the profile and each of its round profiles with the engine settings `sets`
    changed alike."""
    return (replace(profile, **sets), replace(spread, rounds=[replace(r, **sets) for r in spread.rounds]))


def predict(workload: str, profile: Profile, rates: list[float], overrides: dict | None = None,
            spread: Spread | None = None, level: float = LEVEL) -> dict:
    """Each rate's point and the knee from `profile`; with the fit's round profiles (twin/intervals.py),
    each figure's interval at `level` beside it."""
    plan = Plan(workload, overrides or {})
    capacity = plan.capacity_per_s(profile)
    points = [{"rate_per_s": r, **plan.run(profile, r, capacity_per_s=capacity)} for r in rates]
    d = {"profile": profile.name, "workload": workload, "points": points,
         "knee": knee(plan, profile, points, capacity), "percentiles": metrics.PERCENTILE_RULE}
    if spread is not None and len(spread.rounds) >= 2:
        _intervals(d, plan, spread, level)
    return d


def _intervals(d: dict, plan: Plan, spread: Spread, level: float) -> None:
    """Adds each point's latency_interval_ms / completed_interval_per_s / keeps_up_share, the knee's
    capacity_interval_per_s / bisected_interval_per_s and d["interval"], from the same plan through each
    round's profile."""
    each = []
    for rp in spread.rounds:
        cap = plan.capacity_per_s(rp)
        pts = [{"rate_per_s": p["rate_per_s"], **plan.run(rp, p["rate_per_s"], capacity_per_s=cap)}
               for p in d["points"]]
        each.append((pts, knee(plan, rp, pts, cap)))
    def b(point: float | None, alternatives: list) -> list[float] | None:
        return band(point, alternatives, level, spread.misfit_rel, spread.recheck_se_log)
    for i, p in enumerate(d["points"]):
        alt = [pts[i] for pts, _ in each]
        p["latency_interval_ms"] = {m: {q: b(v, [a["latency_ms"][m][q] for a in alt])
                                        for q, v in p["latency_ms"][m].items()} for m in LATENCIES}
        p["completed_interval_per_s"] = b(p["completed_per_s"], [a["completed_per_s"] for a in alt])
        p["keeps_up_share"] = sum(a["keeps_up"] for a in alt) / len(alt)
    k = d["knee"]
    k["capacity_interval_per_s"] = b(k["capacity_per_s"], [kn["capacity_per_s"] for _, kn in each])
    k["bisected_interval_per_s"] = b(k["bisected_rate_per_s"], [kn["bisected_rate_per_s"] for _, kn in each])
    d["interval"] = {"level": level, "rounds": len(spread.rounds), "misfit_rel": spread.misfit_rel,
                     "recheck_se_log": spread.recheck_se_log,
                     "rule": "point x exp(+- t((1 + level) / 2, n - 1) x sqrt(s^2 (1 + 1/n) + log(1 + misfit)^2 "
                             "+ r^2)), s the standard deviation of the log of the figure predicted with each of the "
                             "fit's n round profiles, misfit the fit's rms relative residual, r a recheck's standard "
                             "error (docs/twin.md, Intervals)"}


def to_text(d: dict) -> str:
    what_if = "".join(f", {k} = {v}" for k, v in d.get("set", {}).items())
    lines = [f"predicted latency of {d['workload']} with profile {d['profile']}{what_if} (ms; simulator, virtual time)",
             f"{'rate/s':>8} {'done/s':>8} {'TTFT p50':>9} {'p99':>9} {'TPOT p50':>9} {'p99':>8} "
             f"{'e2e p50':>9} {'p99':>9}  keeps up"]

    def f(v):
        return f"{v:9.1f}" if v is not None else f"{'-':>9}"
    for p in d["points"]:
        lat = p["latency_ms"]
        done = p["completed_per_s"]
        lines.append(f"{p['rate_per_s']:8.3g} {done if done is None else round(done, 3):>8} "
                     f"{f(lat['ttft']['p50'])} {f(lat['ttft']['p99'])} {f(lat['tpot']['p50'])}"
                     f"{f(lat['tpot']['p99'])[1:]} {f(lat['e2e']['p50'])} {f(lat['e2e']['p99'])}  "
                     f"{'yes' if p['keeps_up'] else 'NO, above capacity' if p.get('above_capacity') else 'NO'}")
    k = d["knee"]

    def r(v):
        return "-" if v is None else f"{v:.3g}/s"
    lines.append(f"knee: {r(k['rate_per_s'])} of the given rates (first saturated {r(k['first_saturated_per_s'])}); "
                 f"bisected {r(k['bisected_rate_per_s'])}; capacity {r(k['capacity_per_s'])}")
    lines.append(f"rule: {k['rule']}; {k['bisected_rule']}")
    if "interval" in d:
        lines += _interval_text(d)
    return "\n".join(lines) + "\n"


def _interval_text(d: dict) -> list[str]:
    def b(v: list[float] | None, fmt: str = ".1f") -> str:
        return "-" if v is None else f"{v[0]:{fmt}}-{v[1]:{fmt}}"
    i = d["interval"]
    lines = [f"{i['level']:.0%} intervals (the same plan through each of the fit's {i['rounds']} round profiles, "
             f"and its misfit {i['misfit_rel']:.1%}" + (f", the recheck's standard error {i['recheck_se_log']:.1%}"
                                                       if i.get("recheck_se_log") else "") + "; ms):"]
    for p in d["points"]:
        lat = p["latency_interval_ms"]
        lines.append(f"{p['rate_per_s']:8.3g}  TTFT p50 {b(lat['ttft']['p50'])}  p99 {b(lat['ttft']['p99'])}  "
                     f"TPOT p50 {b(lat['tpot']['p50'])}  p99 {b(lat['tpot']['p99'])}  e2e p50 {b(lat['e2e']['p50'])}  "
                     f"p99 {b(lat['e2e']['p99'])}  done/s {b(p['completed_interval_per_s'], '.3g')}  "
                     f"keeps up in {p['keeps_up_share']:.0%} of the rounds")
    k = d["knee"]
    lines.append(f"capacity {b(k['capacity_interval_per_s'], '.3g')}/s; bisected knee "
                 f"{b(k['bisected_interval_per_s'], '.3g')}/s")
    return lines
