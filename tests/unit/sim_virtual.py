"""Drive the sim's engine in virtual time (no sockets, no sleeps)."""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from loadgen.sim.engine import Engine, EngineConfig
from loadgen.sim.profiles import load_profile


@dataclass
class Req:
    request_id: str
    arrival_ns: int
    prompt: list[int]
    max_tokens: int
    scheduled_ns: int | None = None
    preemptions: int = 0
    stall_ns: int = 0
    cached_tokens: int = 0
    priority: int = 0
    token_ns: list[int] = field(default_factory=list)


def prompt(n: int, salt: int = 0) -> list[int]:
    return [(salt * 7919 + i) % 100_000 for i in range(n)]


def engine(profile="tiny", speed=1.0, **overrides) -> Engine:
    p = load_profile(profile)
    return Engine(p, EngineConfig.from_profile(p, **overrides), speed)


def simulate(e: Engine, reqs: list[Req], on_step=None) -> list:
    pending = deque(sorted(reqs, key=lambda r: r.arrival_ns))
    t, steps = 0, []
    while pending or e.has_work():
        while pending and pending[0].arrival_ns <= t:
            e.add(pending.popleft())
        step = e.schedule(t) if e.has_work() else None
        if step is None:
            t = max(t, pending[0].arrival_ns)
            continue
        if on_step:
            on_step(e, step)
        for seq, _done in e.complete(step):
            seq.req.token_ns.append(step.end_ns)
        steps.append(step)
        t = step.end_ns
    return steps


def ttft(r: Req) -> int:
    return r.token_ns[0] - r.arrival_ns


def tpot(r: Req) -> float:
    return (r.token_ns[-1] - r.token_ns[0]) / (len(r.token_ns) - 1)
