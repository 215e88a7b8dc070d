"""`loadgen predict`: a workload's latency at other rates, from a profile (shipped or written by
`loadgen fit`), by running the simulator's engine (sim/engine.py, the same step loop `loadgen sim`
serves) in virtual time: no server, no sockets, no sleeping, deterministic for a seed.

Each request reaches the engine at its planned time + the profile's request_overhead_us; its first
token is at the end of the step that completes its prompt, each next token at the end of its next
step. The rows carry requests.parquet's timestamp columns, so TTFT, TPOT and e2e come from
loadgen.metrics like a measured run's (dispatched = intended: no client lateness is predicted).

The knee is `loadgen sweep`'s (analysis/knee.py: knee, keeps_up; a rate keeps up when the completion rate,
fitted over the last tokens, is within 5 % of the offered rate, fitted over the intended sends), with
its keys over the given rates, plus knee.bisected_rate_per_s: the same rule bisected (KNEE_STEPS steps,
geometric) between the given rates, widened until they bracket it, which virtual time makes cheap; and
knee.capacity_per_s, the completion rate when every request is offered at once (what the engine
sustains past the knee). Workloads with conversations
(turns that wait for a reply) are not predicted (the plan's send times depend on replies).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

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

KNEE_STEPS = 10
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
    stalled: bool = False


def simulate(profile: Profile, intended_ns: np.ndarray, prompt_tokens: np.ndarray, max_tokens: np.ndarray
             ) -> pl.DataFrame:
    """One row per request: intended_ns, dispatched_ns, first_token_ns, last_token_ns, output_tokens,
    outcome ('ok', or 'error' for a request the engine refuses: longer than the model or KV pool)."""
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
        "output_tokens": out, "outcome": np.where(done, "ok", "error")})


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

    def run(self, profile: Profile, rate: float | None, at_once: bool = False) -> dict:
        s = self._build(rate)
        intended = np.zeros_like(s.intended_ns) if at_once else s.intended_ns
        rows = simulate(profile, intended, s.prompt_tokens, s.max_tokens)
        return point(rows, np.asarray(s.warmup, dtype=bool))


def knee(plan: Plan, profile: Profile, points: list[dict]) -> dict:
    """`loadgen sweep`'s knee over the given rates (same keys), plus the same rule bisected between
    them in virtual time and the capacity (every request offered at once)."""
    out = sweep_knee(points)
    rates = [p["rate_per_s"] for p in points]

    def up(r: float) -> bool:
        return plan.run(profile, r)["keeps_up"]
    lo, hi = min(rates), max(rates)
    while lo > 1e-6 and not up(lo):
        lo /= 2
    while up(hi) and hi < 1e6:
        lo, hi = hi, hi * 2
    for _ in range(KNEE_STEPS):
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if up(mid) else (lo, mid)
    out.update({"bisected_rate_per_s": lo, "bisected_first_saturated_per_s": hi, "bisected_resolution_rel": hi / lo - 1,
                "capacity_per_s": plan.run(profile, rates[0], at_once=True)["completed_per_s"],
                "bisected_rule": f"the same rule bisected {KNEE_STEPS} times (geometric) between the given rates, "
                                 "widened until they bracket it; capacity: completion rate with every request "
                                 "offered at once"})
    return out


def predict(workload: str, profile: Profile, rates: list[float], overrides: dict | None = None) -> dict:
    plan = Plan(workload, overrides or {})
    points = [{"rate_per_s": r, **plan.run(profile, r)} for r in rates]
    return {"profile": profile.name, "workload": workload, "points": points, "knee": knee(plan, profile, points),
            "percentiles": metrics.PERCENTILE_RULE}


def to_text(d: dict) -> str:
    lines = [f"predicted latency of {d['workload']} with profile {d['profile']} (ms; simulator, virtual time)",
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
                     f"{'yes' if p['keeps_up'] else 'NO'}")
    k = d["knee"]

    def r(v):
        return "-" if v is None else f"{v:.3g}/s"
    lines.append(f"knee: {r(k['rate_per_s'])} of the given rates (first saturated {r(k['first_saturated_per_s'])}); "
                 f"bisected {r(k['bisected_rate_per_s'])}; capacity {r(k['capacity_per_s'])}")
    lines.append(f"rule: {k['rule']}; {k['bisected_rule']}")
    return "\n".join(lines) + "\n"
