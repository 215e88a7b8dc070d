"""`compare --fail-if RULE`: a gate for CI jobs (exit 4 when a rule holds).

RULE = [STAT] METRIC OP CHANGE
  STAT     p50 | p90 | p99 | mean   (latency metrics: required; the others have one value)
  METRIC   ttft | ttfa | ttft_from_send | tpot | itl | e2e (ms) | throughput (req/s) | token_throughput (tok/s)
           | goodput (req/s) | attainment (share)
  OP       > | <
  CHANGE   relative `+10%`, or absolute in the metric's unit: `+5ms` / `+0.5s` (latency), `-2/s` (rates),
           a bare number for attainment
The rule holds when B's change from A (relative or absolute, as CHANGE is written) is beyond CHANGE in
the direction of OP, and the change is resolved: the 95 % CI of the difference excludes 0 (so noise
alone does not fail a job).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from loadgen.config.units import parse_duration_ns
from loadgen.errors import FailIfError

LATENCY = ("ttft", "ttfa", "ttft_from_send", "tpot", "itl", "e2e")  # compare.py reads these too
SINGLE = ("throughput", "token_throughput", "goodput", "attainment")
STATS = ("p50", "p90", "p99", "mean")
_RULE = re.compile(r"\s*(?:(?P<stat>[a-z0-9]+)\s+)?(?P<metric>[a-z0-9_]+)\s*(?P<op>[<>])\s*"
                   r"(?P<value>[+-]?[0-9]*\.?[0-9]+)\s*(?P<unit>%|[a-zµ]+|/s)?\s*")


@dataclass(frozen=True)
class Rule:
    text: str
    metric: str
    stat: str            # "value" for the single-valued metrics
    op: str              # ">" | "<"
    threshold: float     # a fraction when relative, else in the metric's unit (ms for latency)
    relative: bool


def parse_fail_if(text: str) -> Rule:
    m = _RULE.fullmatch(text.lower())
    if not m:
        raise FailIfError(f"--fail-if {text!r}: expected e.g. 'p99 ttft > +10%' or 'throughput < -5%'")
    stat, metric, op, value, unit = m["stat"], m["metric"], m["op"], float(m["value"]), m["unit"]
    if metric not in LATENCY + SINGLE:
        raise FailIfError(f"--fail-if {text!r}: unknown metric {metric!r} (one of: {', '.join(LATENCY + SINGLE)})")
    if metric in LATENCY:
        if stat not in STATS:
            raise FailIfError(f"--fail-if {text!r}: {metric} needs a statistic first: {', '.join(STATS)}")
    elif stat is not None:
        raise FailIfError(f"--fail-if {text!r}: {metric} has a single value; drop {stat!r}")
    if unit == "%":
        return Rule(text, metric, stat or "value", op, value / 100, True)
    if metric in LATENCY:
        if unit is None:
            raise FailIfError(f"--fail-if {text!r}: give a unit: +10% (relative) or +5ms (absolute)")
        assert stat is not None  # a latency metric's statistic was checked above
        try:
            ms = parse_duration_ns(f"{abs(value)}{unit}") / 1e6 * (1 if value >= 0 else -1)
        except ValueError as e:
            raise FailIfError(f"--fail-if {text!r}: {e}") from None
        return Rule(text, metric, stat, op, ms, False)
    if metric == "attainment" and unit is None or metric != "attainment" and unit == "/s":
        return Rule(text, metric, "value", op, value, False)
    raise FailIfError(f"--fail-if {text!r}: {metric} takes a relative change (+5%) or "
                      f"{'a bare share (-0.05)' if metric == 'attainment' else 'a rate (-2/s)'}")


def evaluate(rule: Rule, metrics: list[dict]) -> dict | None:
    """metrics: compare_runs() entries. None when the metric is not there (e.g. goodput without SLOs)."""
    e = next((m for m in metrics if m["metric"] == rule.metric and m["stat"] == rule.stat), None)
    if e is None:
        return None
    change = e["rel"] if rule.relative else e["diff"]
    if change is None:
        return {"held": False, "value": None}
    beyond = change > rule.threshold if rule.op == ">" else change < rule.threshold
    ci = e["diff_ci"]
    resolved = ci[0] is not None and (ci[0] > 0 or ci[1] < 0)
    return {"held": bool(beyond and resolved), "value": change}
