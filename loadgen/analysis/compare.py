"""`loadgen compare A B [C ...]`: did the runs (or sweeps) offer the same work, and is B better, worse or
indistinguishable from A on each metric, with bootstrap 95 % confidence intervals (analysis/bootstrap.py
states the resampling unit and why). docs/sweep-and-compare.md has the JSON schema and the rules.

A is the baseline; every other input is compared with it. Sweeps are compared point by point (rates
both measured) and as curves (knee, max goodput). `--fail-if` rules (fail_if.py) exit 4.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import orjson
import polars as pl

from loadgen.analysis import bootstrap as bs
from loadgen.analysis import goodput
from loadgen.config.slo import from_keys as slo_from_keys
from loadgen import metrics
from loadgen.analysis.summary import measured
from loadgen.analysis.fail_if import Rule, evaluate, parse_fail_if
from loadgen.results.folder import Manifest, loop_lateness_p99_ms, read_run

SCHEMA_VERSION = 1
LATENCY = ("ttft", "ttft_from_send", "tpot", "itl", "e2e")
STATS = {"p50": 0.5, "p90": 0.9, "p99": 0.99, "mean": None}
DECOMP = ("queue", "prefill", "decode", "decode_stalls", "other")
PROMPT_TOLERANCE = 0.05   # realized prompt/output length statistics may differ this much (relative)
RATE_TOLERANCE = 0.01
# Changes smaller than this are "indistinguishable" even when their CI excludes 0. The bootstrap sees the
# spread between the requests of each run, not what moves between two runs (the machine's load, the
# server's state): a metric set by the server's fixed step time (e.g. p99 ITL under chunked prefill) has
# a CI of about +-0.5 % yet moved by more than 2 % between a run and its rerun on the shared 2-core
# development machine (tests/integration/test_compare.py).
MIN_EFFECT = 0.05


class CompareError(Exception):
    pass


@dataclass
class RunData:
    path: str
    manifest: Manifest
    latency: dict[str, np.ndarray]      # per measured request (intended order), ms, NaN = no value
    itl: tuple[np.ndarray, np.ndarray]  # samples (ms), owner = request position
    interval_ns: np.ndarray             # per completion (done order): time since the previous one
    ok: np.ndarray                      # per completion: 1 if ok
    tokens: np.ndarray                  # per completion: output tokens of an ok request
    met: np.ndarray | None              # per completion: 1 if it met every SLO
    met_req: np.ndarray | None          # per request: 1 if it met every SLO
    decomposition: dict[str, np.ndarray] | None
    work: dict

    @property
    def n(self) -> int:
        return len(next(iter(self.latency.values())))


def load_run(path: str | Path, slo_ms: dict | None) -> RunData:
    run = read_run(path)
    req = metrics.latency_columns(measured(run)).sort("intended_ns", "idx")
    ok = metrics.OK_ROWS
    lat = {m: req.select(pl.when(ok).then(pl.col(m)).cast(pl.Float64)).to_series().fill_null(np.nan).to_numpy()
           for m in LATENCY if m != "itl"}
    ids = req["request_id"]
    ok_mask = req.select(ok).to_series()
    samples, owner = goodput.request_itl_samples_ms(run.tokens, ids.filter(ok_mask))
    ok_pos = np.flatnonzero(ok_mask.to_numpy())
    itl = (samples, ok_pos[owner] if owner.size else owner)
    lat["itl"] = np.full(req.height, np.nan)  # placeholder: ITL is resampled by cluster
    slo = slo_ms or slo_from_keys(run.manifest.get("slo") or {}) or None
    met_req = None
    if slo:
        met_req = goodput.meets(req, run.tokens, slo)["met"].cast(pl.Float64).to_numpy()
    done = req.with_columns(met=pl.Series(met_req) if met_req is not None else pl.lit(None)).filter(
        pl.col("done_ns").is_not_null()).sort("done_ns")
    t = done["done_ns"].to_numpy()
    start = metrics.number(req["intended_ns"].min()) if req.height else 0
    interval = np.diff(np.concatenate(([start], t))).astype(np.float64) if t.size else np.empty(0)
    dec = None
    p = Path(path) / "decomposition.parquet"
    if p.is_file():
        d = pl.read_parquet(p)
        joined = (req.select("request_id").with_row_index("_pos").join(d, on="request_id", how="left")
                  .sort("_pos"))  # in req's order, whatever order the join returns
        dec = {c: joined[f"{c}_ms"].cast(pl.Float64).fill_null(np.nan).to_numpy() for c in DECOMP
               if f"{c}_ms" in joined.columns}
    return RunData(str(path), run.manifest, lat, itl, interval,
                   done.select(ok).to_series().cast(pl.Float64).to_numpy(),
                   done.select(pl.when(ok).then(pl.col("output_tokens")).otherwise(0)).to_series()
                   .fill_null(0).cast(pl.Float64).to_numpy(),
                   done["met"].cast(pl.Float64).to_numpy() if met_req is not None else None, met_req, dec,
                   work_of(run.manifest, req))


def work_of(manifest: Manifest, req: pl.DataFrame) -> dict:
    """The fields that say what work a run offered (compared by same_work)."""
    c = manifest.get("config", {})

    def dist(col: str) -> dict:
        v = req[col].drop_nulls().cast(pl.Float64)
        if not v.len():
            return {}
        p50, p90 = metrics.quantiles(v.to_numpy(), (0.5, 0.9))
        return {"mean": v.mean(), "p50": p50, "p90": p90}

    load = manifest.get("load") or {"loop": "open"}
    return {"model": c.get("model"), "api": c.get("api"),
            "max_tokens": c.get("output_tokens"), "max_tokens_realized": dist("max_tokens"),
            "ignore_eos": (c.get("extra_body") or {}).get("ignore_eos"),
            "prompt_tokens": dist("planned_prompt_tokens"),
            "rate": (manifest.get("schedule") or {}).get("configured_rate_per_s"),
            "arrival_process": (c.get("arrivals") or {}).get("process"),
            "burstiness": (c.get("arrivals") or {}).get("burstiness"),
            "load": {k: load.get(k) for k in ("loop", "concurrency", "rate", "max_concurrency")},
            "requests": req.height}


def _rel_differs(a, b, tol: float) -> bool:
    if a is None or b is None:
        return a != b
    return abs(a - b) > tol * max(abs(a), abs(b), 1e-12)


def same_work(a: dict, b: dict) -> list[dict]:
    diffs = []
    for f in ("model", "api", "max_tokens", "ignore_eos", "arrival_process", "burstiness", "load", "requests"):
        if a.get(f) != b.get(f):
            diffs.append({"field": f, "a": a.get(f), "b": b.get(f)})
    for f in ("prompt_tokens", "max_tokens_realized"):
        da, db = a.get(f) or {}, b.get(f) or {}
        if any(_rel_differs(da.get(k), db.get(k), PROMPT_TOLERANCE) for k in set(da) | set(db)):
            name = "prompt-length distribution" if f == "prompt_tokens" else "max_tokens (realized)"
            diffs.append({"field": name, "a": da, "b": db})
    if _rel_differs(a.get("rate"), b.get("rate"), RATE_TOLERANCE):
        diffs.append({"field": "rate", "a": a.get("rate"), "b": b.get("rate")})
    return diffs


def host_floor_ms(*runs: RunData) -> float:
    """The smallest change in ms a verdict may name: the larger of the runs' client loop-lateness p99 (how
    late the host let the client take its stamps, as each run measured it). A busy host shifts a run's times
    by up to that much; a change below it may be the host's, not the server's (e.g. a mean of 0.9 ms of
    `other` moving by 0.2 ms between a run and its rerun is -22 %, and its CI excludes 0)."""
    return max((loop_lateness_p99_ms(r.manifest) for r in runs), default=0.0)


def _entry(metric, stat, unit, better, a_draws, b_draws, a_val, b_val, min_effect, floor_ms=0.0) -> dict:
    diff = b_draws - a_draws
    with np.errstate(invalid="ignore", divide="ignore"):
        rel = np.where(a_draws != 0, b_draws / a_draws - 1, np.nan)
    point_rel = (b_val / a_val - 1) if a_val not in (None, 0) and not math.isnan(a_val) else None
    rel_ci = bs.interval(rel)
    lo, hi = rel_ci  # both None (no draws) or both numbers
    resolved = lo is not None and hi is not None and (lo > 0 or hi < 0)
    verdict = "indistinguishable"
    big = unit != "ms" or (a_val is not None and b_val is not None and abs(b_val - a_val) >= floor_ms)
    if resolved and point_rel is not None and abs(point_rel) >= min_effect and big:
        up_is_good = better == "higher"
        verdict = "better" if (point_rel > 0) == up_is_good else "worse"
    return {"metric": metric, "stat": stat, "unit": unit, "better": better, "a": _num(a_val), "b": _num(b_val),
            "a_ci": bs.interval(a_draws), "b_ci": bs.interval(b_draws),
            "diff": _num(b_val - a_val) if a_val is not None and b_val is not None else None,
            "diff_ci": bs.interval(diff), "rel": _num(point_rel), "rel_ci": rel_ci, "resolved": resolved,
            "verdict": verdict, **({"floor_ms": floor_ms} if unit == "ms" else {})}


def _num(v):
    return None if v is None or (isinstance(v, float) and math.isnan(v)) else float(v)


def compare_runs(a: RunData, b: RunData, resamples: int = bs.RESAMPLES, seed: int = 0,
                 min_effect: float = MIN_EFFECT) -> list[dict]:
    rng = np.random.default_rng(seed)
    ia, ib = bs.block_indices(a.n, resamples, rng), bs.block_indices(b.n, resamples, rng)
    ca, cb = (bs.block_indices(x.interval_ns.size, resamples, rng) for x in (a, b))
    floor_ms = host_floor_ms(a, b)
    out = []
    for m in LATENCY:
        for stat, p in STATS.items():
            if m == "itl":
                da = bs.clustered(*a.itl, a.n, p, ia)
                db = bs.clustered(*b.itl, b.n, p, ib)
                va = bs.stat(a.itl[0], p)
                vb = bs.stat(b.itl[0], p)
            else:
                da, db = bs.per_request(a.latency[m], p, ia), bs.per_request(b.latency[m], p, ib)
                va, vb = bs.stat(a.latency[m], p), bs.stat(b.latency[m], p)
            out.append(_entry(m, stat, "ms", "lower", da, db, va, vb, min_effect, floor_ms))
    ns = 1e-9

    def rate(x: RunData, num: np.ndarray, idx) -> tuple[np.ndarray, float]:
        return bs.ratio(num, x.interval_ns * ns, idx), (num.sum() / (x.interval_ns.sum() * ns)
                                                        if x.interval_ns.sum() > 0 else math.nan)

    for name, get, unit in (("throughput", lambda x: x.ok, "req/s"), ("token_throughput", lambda x: x.tokens, "tok/s"),
                            ("goodput", lambda x: x.met, "req/s")):
        if get(a) is None or get(b) is None:
            continue
        (da, va), (db, vb) = rate(a, get(a), ca), rate(b, get(b), cb)
        out.append(_entry(name, "value", unit, "higher", da, db, va, vb, min_effect))
    if a.met_req is not None and b.met_req is not None:
        out.append(_entry("attainment", "value", "share", "higher", bs.per_request(a.met_req, None, ia),
                          bs.per_request(b.met_req, None, ib), bs.stat(a.met_req, None), bs.stat(b.met_req, None),
                          min_effect))
    if a.decomposition and b.decomposition:
        for c in DECOMP:
            if c in a.decomposition and c in b.decomposition:
                va, vb = bs.stat(a.decomposition[c], None), bs.stat(b.decomposition[c], None)
                out.append(_entry(f"decomposition.{c}", "mean", "ms", "lower",
                                  bs.per_request(a.decomposition[c], None, ia),
                                  bs.per_request(b.decomposition[c], None, ib), va, vb, min_effect, floor_ms))
    return out


def kind_of(path: str) -> str:
    p = Path(path)
    if (p / "sweep.json").is_file():
        return "sweep"
    if (p / "manifest.json").is_file():
        return "run"
    raise CompareError(f"{p}: neither a results folder (manifest.json) nor a sweep folder (sweep.json)")


def _sweep_points(path: str) -> tuple[dict, dict[float, str]]:
    p = Path(path)
    s = p / "sweep_summary.json"
    if not s.is_file():
        raise CompareError(f"{s}: missing (the sweep did not finish writing its summary)")
    summary = orjson.loads(s.read_bytes())
    return summary, {pt["rate_per_s"]: str(p / pt["dir"]) for pt in summary["points"]}


def compare_pair(a: str, b: str, slo_ms, rules: list[Rule], resamples: int, seed: int, min_effect: float) -> dict:
    ka, kb = kind_of(a), kind_of(b)
    if ka != kb:
        raise CompareError(f"cannot compare a {ka} ({a}) with a {kb} ({b})")
    out: dict = {"a": a, "b": b, "kind": ka}
    if ka == "run":
        ra, rb = load_run(a, slo_ms), load_run(b, slo_ms)
        diffs = same_work(ra.work, rb.work)
        out["metrics"] = compare_runs(ra, rb, resamples, seed, min_effect)
        checked = [out["metrics"]]
    else:
        sa, pa = _sweep_points(a)
        sb, pb = _sweep_points(b)
        common = sorted(set(pa) & set(pb))
        diffs = []
        if set(pa) != set(pb):
            diffs.append({"field": "rate", "a": sorted(pa), "b": sorted(pb)})
        out["points"] = []
        for r in common:
            ra, rb = load_run(pa[r], slo_ms), load_run(pb[r], slo_ms)
            for d in same_work(ra.work, rb.work):
                if d not in diffs and d["field"] not in ("rate", "requests"):
                    diffs.append(d)
            out["points"].append({"rate_per_s": r, "metrics": compare_runs(ra, rb, resamples, seed, min_effect)})
        out["curves"] = {"knee_per_s": {"a": sa["knee"]["rate_per_s"], "b": sb["knee"]["rate_per_s"]},
                         "max_goodput_per_s": {"a": (sa.get("max_goodput") or {}).get("rate_per_s"),
                                               "b": (sb.get("max_goodput") or {}).get("rate_per_s")}}
        checked = [p["metrics"] for p in out["points"]]
    out["same_work"] = {"same": not diffs, "differences": diffs}
    out["fail_if"] = []
    for rule in rules:
        hits = [h for h in (evaluate(rule, ms) for ms in checked) if h is not None]
        held = [h for h in hits if h["held"]]
        out["fail_if"].append({"rule": rule.text, "held": bool(held),
                               "value": (held or hits or [{"value": None}])[0]["value"]})
    return out


def compare(inputs: list[str], slo_ms=None, fail_if: Sequence[str] = (), resamples: int = bs.RESAMPLES,
            seed: int = 0, min_effect: float = MIN_EFFECT) -> dict:
    if len(inputs) < 2:
        raise CompareError("compare needs at least two results or sweep folders")
    rules = [parse_fail_if(t) for t in fail_if]
    comps = [compare_pair(inputs[0], b, slo_ms, rules, resamples, seed, min_effect) for b in inputs[1:]]
    failed = [f"{c['b']}: {r['rule']} ({_change(r['value'], r['rule'])})" for c in comps for r in c["fail_if"]
              if r["held"]]
    return {"kind": "loadgen-compare", "schema_version": SCHEMA_VERSION,
            "method": {"resampling": bs.__doc__.split("\n\n")[1].replace("\n", " "), "resamples": resamples,
                       "seed": seed, "confidence": bs.CONFIDENCE, "min_effect": min_effect,
                       "percentiles": "nearest rank"},
            "baseline": inputs[0], "comparisons": comps, "failed_rules": failed}


def _change(v, rule_text: str) -> str:
    if v is None:
        return "-"
    return f"{v:+.1%}" if rule_text.rstrip().endswith("%") else f"{v:+.3g}"


def to_text(result: dict) -> str:
    lines = [f"baseline (A): {result['baseline']}"]
    for c in result["comparisons"]:
        lines += ["", f"B: {c['b']}  ({c['kind']})"]
        for d in c["same_work"]["differences"]:
            lines.append(f"WARNING: NOT THE SAME WORK: {d['field']} differs: A {_show(d['a'])}  B {_show(d['b'])}")
        if c["kind"] == "run":
            lines += _table(c["metrics"])
        else:
            cv = c["curves"]
            lines.append(f"knee        A {_show(cv['knee_per_s']['a'])}/s  B {_show(cv['knee_per_s']['b'])}/s")
            lines.append(f"max goodput A {_show(cv['max_goodput_per_s']['a'])}/s  "
                         f"B {_show(cv['max_goodput_per_s']['b'])}/s")
            for p in c["points"]:
                keep = [m for m in p["metrics"] if (m["metric"], m["stat"]) in SWEEP_ROWS]
                lines += ["", f"at {p['rate_per_s']:g}/s"] + _table(keep)
        for r in c["fail_if"]:
            lines.append(f"fail-if {r['rule']!r}: {'HELD' if r['held'] else 'not held'} "
                         f"({_change(r['value'], r['rule'])})")
    lines += ["", "CI: 95 % moving-block bootstrap over requests (ITL: all of a request's tokens together); "
                  f"verdict needs the CI of the change to exclude 0 and |change| >= "
                  f"{result['method']['min_effect']:.0%} and, in ms, >= the runs' client loop-lateness p99"]
    if result["failed_rules"]:
        lines += [f"FAILED: {f}" for f in result["failed_rules"]]
    return "\n".join(lines) + "\n"


SWEEP_ROWS = {("ttft", "p50"), ("ttft", "p99"), ("itl", "p50"), ("itl", "p99"), ("e2e", "p99"),
              ("throughput", "value"), ("goodput", "value")}


def _table(metrics: list[dict]) -> list[str]:
    rows = [f"{'metric':<28}{'stat':<6}{'A':>10}{'B':>10}{'change':>9}  {'95% CI of change':<20}verdict"]
    for m in metrics:
        ci = m["rel_ci"]
        ci_s = "-" if ci[0] is None else f"[{ci[0]:+.1%}, {ci[1]:+.1%}]"
        rel = "-" if m["rel"] is None else f"{m['rel']:+.1%}"
        rows.append(f"{m['metric']:<28}{m['stat']:<6}{_fmt(m['a']):>10}{_fmt(m['b']):>10}{rel:>9}  {ci_s:<20}"
                    f"{m['verdict']}")
    return rows


def _fmt(v) -> str:
    if v is None:
        return "-"
    return f"{v:.3f}" if abs(v) < 10 else f"{v:.1f}"


def _show(v) -> str:
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k}: {_fmt(x) if isinstance(x, float) else x}" for k, x in v.items()) + "}"
    return str(v)
