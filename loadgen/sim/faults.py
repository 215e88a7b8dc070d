"""Fault injection for the simulator: `--faults SPEC`, seeded by `--seed`.

SPEC is a comma-separated list of `kind=value` parts:

  http500=P            fraction P of requests answered 500 (OpenAI-style JSON error body)
  http429=P            fraction P answered 429
  http503=P            fraction P answered 503
  reset_after=K:P      fraction P of requests: the connection is reset (TCP RST) after K tokens
                       were sent (K=0: before any token; non-streaming: before the body)
  malformed=P          fraction P of requests: streaming, one malformed (truncated JSON) event
                       before the middle token (the tokens themselves all arrive);
                       non-streaming, the JSON body is cut in half
  slow_headers=D:P     fraction P of requests send their response headers D late (e.g. 200ms)
  stall=S@T            the whole engine stops for S starting T after the simulator started
                       (e.g. 2s@10s); may be repeated. Fixed mode: a request's clock stops
                       during the stall (tokens due after T move later by the overlap)

P is a probability in [0, 1]; the per-request kinds exclude each other, so their P sum to <= 1.
Which request gets which fault is a pure function of (--seed, X-Request-Id), so a rerun with the
same ids reproduces it. Each request's fault is recorded in the truth column `fault`.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field

from loadgen.config.units import parse_duration_ns

PER_REQUEST_KINDS = ("http500", "http429", "http503", "reset_after", "malformed", "slow_headers")


@dataclass(frozen=True)
class Fault:
    kind: str  # one of PER_REQUEST_KINDS
    status: int = 200  # http500/429/503: the status answered
    after_tokens: int = 0  # reset_after: K
    delay_ns: int = 0  # slow_headers: D

    def label(self) -> str:
        if self.kind == "reset_after":
            return f"reset_after={self.after_tokens}"
        if self.kind == "slow_headers":
            return f"slow_headers={self.delay_ns}ns"
        return self.kind


@dataclass(frozen=True)
class Stall:
    start_ns: int  # from simulator start
    duration_ns: int


@dataclass
class FaultPlan:
    seed: int = 0
    per_request: list[tuple[Fault, float]] = field(default_factory=list)
    stalls: list[Stall] = field(default_factory=list)

    def for_request(self, request_id: str) -> Fault | None:
        if not self.per_request:
            return None
        u = random.Random(f"{self.seed}:{request_id}").random()
        acc = 0.0
        for fault, p in self.per_request:
            acc += p
            if u < acc:
                return fault
        return None


def _prob(part: str, text: str) -> float:
    try:
        p = float(text)
    except ValueError:
        raise ValueError(f"--faults part {part!r}: {text!r} is not a probability") from None
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"--faults part {part!r}: probability {text!r} must be in [0, 1]")
    return p


def _duration(part: str, text: str) -> int:
    try:
        ns = parse_duration_ns(text)
    except ValueError as e:
        raise ValueError(f"--faults part {part!r}: {e}") from None
    if ns < 0:
        raise ValueError(f"--faults part {part!r}: duration must be >= 0")
    return ns


def parse_faults(spec: str, seed: int = 0) -> FaultPlan:
    plan = FaultPlan(seed=seed)
    if not spec or not spec.strip():
        return plan
    for raw in spec.split(","):
        part = raw.strip()
        if not part:
            raise ValueError(f"--faults {spec!r}: empty part (stray comma?)")
        kind, eq, value = part.partition("=")
        kind, value = kind.strip(), value.strip()
        if not eq or not value:
            raise ValueError(f"--faults part {part!r}: expected kind=value")
        if kind in ("http500", "http429", "http503"):
            plan.per_request.append((Fault(kind, status=int(kind[4:])), _prob(part, value)))
        elif kind == "malformed":
            plan.per_request.append((Fault(kind), _prob(part, value)))
        elif kind in ("reset_after", "slow_headers"):
            arg, colon, p = value.partition(":")
            if not colon:
                raise ValueError(f"--faults part {part!r}: expected {kind}={'K' if kind == 'reset_after' else 'D'}:P")
            if kind == "reset_after":
                if not arg.strip().isdigit():
                    raise ValueError(f"--faults part {part!r}: K must be a whole number of tokens")
                plan.per_request.append((Fault(kind, after_tokens=int(arg)), _prob(part, p)))
            else:
                plan.per_request.append((Fault(kind, delay_ns=_duration(part, arg)), _prob(part, p)))
        elif kind == "stall":
            dur, at, start = value.partition("@")
            if not at:
                raise ValueError(f"--faults part {part!r}: expected stall=S@T, e.g. stall=2s@10s")
            plan.stalls.append(Stall(start_ns=_duration(part, start), duration_ns=_duration(part, dur)))
        else:
            raise ValueError(f"--faults part {part!r}: unknown kind {kind!r} (known: "
                             f"{', '.join(PER_REQUEST_KINDS + ('stall',))})")
    total = sum(p for _, p in plan.per_request)
    if total > 1.0 + 1e-9:
        raise ValueError(f"--faults {spec!r}: per-request probabilities sum to {total:g} > 1")
    return plan


def stall_overlap_ns(stalls: list[Stall], t0_ns: int, start_ns: int, due_ns: int) -> int:
    """Fixed mode: how much later a token due at due_ns goes out, for a request that arrived at
    start_ns, when the clock stops during each stall (t0_ns = simulator start)."""
    shift = 0
    for s in sorted(stalls, key=lambda s: s.start_ns):
        a, b = t0_ns + s.start_ns, t0_ns + s.start_ns + s.duration_ns
        if due_ns + shift >= a and start_ns < b:
            shift += b - max(a, start_ns)
    return shift
