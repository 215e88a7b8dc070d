"""`loadgen compare A B [C ...]`: did the runs (or sweeps) offer the same work, and is B better, worse or
indistinguishable from A on each metric, with bootstrap 95 % confidence intervals (analysis/bootstrap.py
states the resampling unit and why). docs/sweep-and-compare.md has the JSON schema and the rules.

A is the baseline; every other input is compared with it. Sweeps are compared point by point (rates
both measured) and as curves (knee, max goodput). `--fail-if` rules (fail_if.py) exit 4; an invalid
or interrupted input is named first in every format, and the rules are not evaluated against it
(exit 3) unless allow_invalid. Every "indistinguishable" carries its reasons.
"""
from __future__ import annotations

import math
from typing import Any
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import orjson
import polars as pl

from loadgen.analysis import bootstrap as bs
from loadgen.analysis import goodput, prefix_cache, repeats
from loadgen.config.kinds import INT64_MAX
from loadgen.config.slo import from_keys as slo_from_keys
from loadgen import metrics
from loadgen.analysis.summary import measured
from loadgen.analysis.fail_if import LATENCY as FAIL_IF_LATENCY, Rule, evaluate, parse_fail_if
from loadgen.errors import CompareError, ExitCode
from loadgen.results.folder import Manifest, loop_lateness_p99_ms, read_run

SCHEMA_VERSION = 1
LATENCY = FAIL_IF_LATENCY  # the latency metrics compared: the ones a --fail-if rule may name
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


def load_run(path: str | Path, slo_ms: dict | None, where: tuple[str, str] | None = None) -> RunData:
    """where: (column, value), e.g. ("class", "chat"): only those measured rows (a per-class comparison)."""
    run = read_run(path)
    rows = measured(run) if where is None else measured(run).filter(pl.col(where[0]) == where[1])
    req = metrics.latency_columns(rows).sort("intended_ns", "idx")
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
            # tools / response_format asked (config/structured.py): decoding by a grammar is other work
            "structured": c.get("structured"),
            # agentic sessions: how many tool rounds in a row, the tools' latencies and results (design.md)
            "agentic": _agentic(c.get("session")),
            "prompt_tokens": dist("planned_prompt_tokens"),
            "rate": (manifest.get("schedule") or {}).get("configured_rate_per_s"),
            "arrival_process": (c.get("arrivals") or {}).get("process"),
            "burstiness": (c.get("arrivals") or {}).get("burstiness"),
            "load": {k: load.get(k) for k in ("loop", "concurrency", "rate", "max_concurrency")},
            "requests": req.height,
            # a warm prefix cache skips prefill: the same prompts are less work (analysis/prefix_cache.py)
            "prefix_cache_hit_rate": prefix_cache.measured_rate(manifest, req)[0]}


def _agentic(session: dict | None) -> dict | None:
    if not session or not session.get("max_tool_rounds"):
        return None
    return {k: session.get(k) for k in ("max_tool_rounds", "tool_latency_ms", "tool_result_tokens")}


def _rel_differs(a, b, tol: float) -> bool:
    if a is None or b is None:
        return a != b
    return abs(a - b) > tol * max(abs(a), abs(b), 1e-12)


def same_work(a: dict, b: dict) -> list[dict]:
    diffs = []
    for f in ("model", "api", "max_tokens", "ignore_eos", "structured", "agentic", "arrival_process", "burstiness",
              "load", "requests"):
        if a.get(f) != b.get(f):
            diffs.append({"field": f, "a": a.get(f), "b": b.get(f)})
    for f in ("prompt_tokens", "max_tokens_realized"):
        da, db = a.get(f) or {}, b.get(f) or {}
        if any(_rel_differs(da.get(k), db.get(k), PROMPT_TOLERANCE) for k in set(da) | set(db)):
            name = "prompt-length distribution" if f == "prompt_tokens" else "max_tokens (realized)"
            diffs.append({"field": name, "a": da, "b": db})
    if _rel_differs(a.get("rate"), b.get("rate"), RATE_TOLERANCE):
        diffs.append({"field": "rate", "a": a.get("rate"), "b": b.get("rate")})
    ha, hb = a.get("prefix_cache_hit_rate"), b.get("prefix_cache_hit_rate")
    if ha is not None and hb is not None and abs(ha - hb) > prefix_cache.TOLERANCE:
        # compare goes on (the latencies are real), but the cache, not the server, may explain a change
        diffs.append({"field": "prefix-cache hit rate", "a": round(ha, 3), "b": round(hb, 3),
                      "why": "prefill skipped for cached prompt tokens: TTFT differs by the cache's state"})
    return diffs


def host_floor_ms(*runs: RunData) -> float:
    """The smallest change in ms a verdict may name: the larger of the runs' client loop-lateness p99 (how
    late the host let the client take its stamps, as each run measured it). A busy host shifts a run's times
    by up to that much; a change below it may be the host's, not the server's (e.g. a mean of 0.9 ms of
    `other` moving by 0.2 ms between a run and its rerun is -22 %, and its CI excludes 0)."""
    return max((loop_lateness_p99_ms(r.manifest) for r in runs), default=0.0)


def noise_floor(a: RunData, b: RunData) -> dict:
    """host_floor_ms of A and B, and where it comes from: which run's loop-lateness p99 set it (the JSON's
    `noise_floor`; every verdict in ms names it when it decided the verdict)."""
    a_ms, b_ms = loop_lateness_p99_ms(a.manifest), loop_lateness_p99_ms(b.manifest)
    side, run = ("B", b) if b_ms > a_ms else ("A", a)
    ms = max(a_ms, b_ms)
    return {"ms": ms, "a_ms": a_ms, "b_ms": b_ms, "run": side if ms > 0 else None,
            "path": run.path if ms > 0 else None,
            "source": (f"client loop-lateness p99 of {side} ({run.path})" if ms > 0
                       else "none (neither run measured its client loop lateness)")}


# why a metric is indistinguishable: reasons[] codes (JSON), their short form in the text table
REASON_SHORT = {"no_value": "no value", "within_noise": "both within noise", "ci_includes_zero": "CI spans zero",
                "below_min_effect": "< min effect", "below_noise_floor": "< noise floor"}


def _why(a_val, b_val, point_rel, rel_ci, resolved: bool, unit: str, min_effect: float, floor_ms: float,
         floor_source: str, by: str = "the bootstrap") -> tuple[list[str], list[str], bool]:
    """What keeps a change from being a verdict: (reason codes, their sentences, within_noise). Empty when
    nothing does. within_noise: a metric in ms whose both sides are below the noise floor, or both zero,
    has no meaningful relative change (a component of 0.2 ms against -0.65 ms is "-425 %")."""
    if a_val is None or b_val is None or math.isnan(a_val) or math.isnan(b_val):
        return ["no_value"], ["a side has no value"], False
    # both sides inside the floor, and so is their difference (a sign flip across it is a change)
    inside = unit == "ms" and max(abs(a_val), abs(b_val), abs(b_val - a_val)) < floor_ms
    if a_val == 0 and b_val == 0 or inside:
        return (["within_noise"], [f"both sides ({a_val:.4g} ms, {b_val:.4g} ms) are within the noise floor "
                                   f"{floor_ms:.4g} ms ({floor_source})" if a_val or b_val else "both are 0"], True)
    codes, texts = [], []
    if point_rel is None or rel_ci[0] is None:
        return ["no_value"], ["no relative change (A is 0, or the bootstrap has no interval)"], False
    if not resolved:
        codes.append("ci_includes_zero")
        texts.append(f"the 95 % CI of the change [{rel_ci[0]:+.1%}, {rel_ci[1]:+.1%}] includes 0: {by} "
                     f"cannot tell the runs apart")
    if abs(point_rel) < min_effect:
        codes.append("below_min_effect")
        texts.append(f"|change| {abs(point_rel):.1%} is below the minimum effect {min_effect:.0%} "
                     f"(run-to-run noise, --min-effect)")
    if unit == "ms" and abs(b_val - a_val) < floor_ms:
        codes.append("below_noise_floor")
        texts.append(f"|B - A| {abs(b_val - a_val):.4g} ms is below the noise floor {floor_ms:.4g} ms "
                     f"({floor_source})")
    return codes, texts, False


def _entry(metric, stat, unit, better, a_draws, b_draws, a_val, b_val, min_effect, floor_ms=0.0,
           floor_source: str = "client loop-lateness p99") -> dict:
    diff = b_draws - a_draws
    with np.errstate(invalid="ignore", divide="ignore"):
        rel = np.where(a_draws != 0, b_draws / a_draws - 1, np.nan)
    point_rel = (b_val / a_val - 1) if a_val not in (None, 0) and not math.isnan(a_val) else None
    rel_ci = bs.interval(rel)
    lo, hi = rel_ci  # both None (no draws) or both numbers
    resolved = lo is not None and hi is not None and (lo > 0 or hi < 0)
    codes, texts, within_noise = _why(a_val, b_val, point_rel, rel_ci, resolved, unit, min_effect,
                                      floor_ms if unit == "ms" else 0.0, floor_source)
    verdict = "indistinguishable"
    if not codes:
        up_is_good = better == "higher"
        # by the sign of B - A, not of the relative change (which flips when A is negative: `other`)
        verdict = "better" if (b_val > a_val) == up_is_good else "worse"
    if within_noise:  # a relative change of two values within the noise is not one (not printed, not gated)
        point_rel, rel_ci = None, [None, None]
    return {"metric": metric, "stat": stat, "unit": unit, "better": better, "a": _num(a_val), "b": _num(b_val),
            "a_ci": bs.interval(a_draws), "b_ci": bs.interval(b_draws),
            "diff": _num(b_val - a_val) if a_val is not None and b_val is not None else None,
            "diff_ci": bs.interval(diff), "rel": _num(point_rel), "rel_ci": rel_ci, "resolved": resolved,
            "verdict": verdict, "reasons": codes, "why": "; ".join(texts), "within_noise": within_noise,
            **({"floor_ms": floor_ms} if unit == "ms" else {})}


def _num(v):
    return None if v is None or (isinstance(v, float) and math.isnan(v)) else float(v)


def compare_runs(a: RunData, b: RunData, resamples: int = bs.RESAMPLES, seed: int = 0,
                 min_effect: float = MIN_EFFECT) -> list[dict]:
    rng = np.random.default_rng(seed)
    ia, ib = bs.block_indices(a.n, resamples, rng), bs.block_indices(b.n, resamples, rng)
    ca, cb = (bs.block_indices(x.interval_ns.size, resamples, rng) for x in (a, b))
    floor = noise_floor(a, b)
    floor_ms, src = floor["ms"], floor["source"]
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
            out.append(_entry(m, stat, "ms", "lower", da, db, va, vb, min_effect, floor_ms, src))
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
                                  bs.per_request(b.decomposition[c], None, ib), va, vb, min_effect, floor_ms, src))
    return out


# --- repeated runs (--repeat N): the across-run variance -------------------------------------------------
def _groups(path: str, column: str) -> set[str]:
    values = measured(read_run(path))[column].drop_nulls().unique().to_list()
    return set(values) if len(values) > 1 else set()


def compare_groups(a: str, b: str, slo_ms, resamples: int, seed: int, min_effect: float) -> dict:
    """by_class / by_model: {name: metrics} comparing A's and B's requests of each [[mix]] class (each model)
    both runs hold, when each holds more than one; None otherwise. The same rules as the whole run's."""
    out: dict = {}
    for section, column in (("by_class", "class"), ("by_model", "model")):
        common = sorted(_groups(a, column) & _groups(b, column))
        out[section] = {v: compare_runs(load_run(a, slo_ms, (column, v)), load_run(b, slo_ms, (column, v)),
                                        resamples, seed, min_effect) for v in common} or None
    return out


def _repeated_variance(a: dict, b: dict) -> str:
    """Which variance a comparison with a repeated side uses, in words (the JSON's `variance`)."""
    na, nb = len(a["runs"]), len(b["runs"])
    if a["repeated"] and b["repeated"]:
        return (f"across-run: Welch's t on the run means (A {na} runs, B {nb} runs), not the within-run "
                f"bootstrap")
    rep, one = ("A", "B") if a["repeated"] else ("B", "A")
    n = na if a["repeated"] else nb
    return (f"across-run of {rep} ({n} runs), assumed for {one}'s single run: {one} against the mean of {rep} "
            f"with sd*sqrt(1 + 1/{n}) and t at {n - 1} df, not the within-run bootstrap")


def _repeated_entry(key: tuple[str, str], a: dict, b: dict, min_effect: float, floor: dict, by: str) -> dict:
    metric, stat = key
    unit, better = next((u, bt) for m, s, u, bt, _ in repeats.FIGURES if (m, s) == key)
    va, vb = a["values"][key], b["values"][key]
    if a["repeated"] and b["repeated"]:
        t = repeats.welch(va, vb)
    elif a["repeated"]:
        t = repeats.single_vs_repeats(va, vb[0])
    else:
        t = repeats.single_vs_repeats(vb, va[0])
        t = {**t, "diff": -t["diff"], "diff_ci": [-t["diff_ci"][1], -t["diff_ci"][0]]}
    ma, mb = sum(va) / len(va), sum(vb) / len(vb)
    point_rel = mb / ma - 1 if ma else None
    rel_ci = [c / abs(ma) for c in t["diff_ci"]] if ma else [None, None]  # A's mean taken as exact
    resolved = t["diff_ci"][0] > 0 or t["diff_ci"][1] < 0
    floor_ms = floor["ms"] if unit == "ms" else 0.0
    codes, texts, within_noise = _why(ma, mb, point_rel, rel_ci, resolved, unit, min_effect, floor_ms,
                                      floor["source"], by)
    verdict = "indistinguishable" if codes else ("better" if (mb > ma) == (better == "higher") else "worse")
    if within_noise:
        point_rel, rel_ci = None, [None, None]
    return {"metric": metric, "stat": stat, "unit": unit, "better": better, "a": ma, "b": mb,
            "a_ci": repeats.spread(va)["ci"], "b_ci": repeats.spread(vb)["ci"], "a_runs": va, "b_runs": vb,
            "diff": t["diff"], "diff_ci": t["diff_ci"], "rel": _num(point_rel), "rel_ci": rel_ci,
            "resolved": resolved, "t": t["t"], "df": t["df"], "p": t["p"], "verdict": verdict, "reasons": codes,
            "why": "; ".join(texts), "within_noise": within_noise, **({"floor_ms": floor_ms} if unit == "ms" else {})}


def compare_repeated(a_path: str, b_path: str, slo_ms, min_effect: float, rate_per_s: float | None = None) -> dict:
    """Two inputs of which one or both are repeats folders: per figure of analysis/repeats.FIGURES, the
    change judged by the across-run variance (_repeated_variance says which); the other within-run
    figures (p90, means, the decomposition) are not compared. -> {variance, noise_floor, metrics, invalid,
    work: (A's, B's)}."""
    a, b = repeats.side(a_path, slo_ms), repeats.side(b_path, slo_ms)
    for path, x in ((a_path, a), (b_path, b)):
        if x["repeated"] and len(x["runs"]) < 2:  # an interrupted series may hold one run
            raise CompareError(f"{path}: a repeats folder of {len(x['runs'])} run(s); the across-run variance needs "
                               f"2 or more (compare {x['runs'][0] if x['runs'] else path} as a run instead)")
    lateness = [[loop_lateness_p99_ms(m) for m in x["manifests"]] for x in (a, b)]
    a_ms, b_ms = max(lateness[0]), max(lateness[1])
    who, x, late = ("B", b, lateness[1]) if b_ms > a_ms else ("A", a, lateness[0])
    worst = x["runs"][late.index(max(late))]
    ms = max(a_ms, b_ms)
    floor = {"ms": ms, "a_ms": a_ms, "b_ms": b_ms, "run": who if ms > 0 else None, "path": worst if ms > 0 else None,
             "source": (f"client loop-lateness p99 of {who} ({worst})" if ms > 0
                        else "none (no run measured its client loop lateness)")}
    variance = _repeated_variance(a, b)
    by = ("Welch's t on the run means (across-run variance)" if a["repeated"] and b["repeated"]
          else "the across-run variance of the repeated side")
    keys = [(m, s) for m, s, *_ in repeats.FIGURES if (m, s) in a["values"] and (m, s) in b["values"]]
    invalid = [invalid_input(label, run, manifest, rate_per_s) for label, x in (("A", a), ("B", b))
               for run, manifest in zip(x["runs"], x["manifests"])]
    return {"variance": variance, "noise_floor": floor,
            "metrics": [_repeated_entry(k, a, b, min_effect, floor, by) for k in keys],
            "invalid": [i for i in invalid if i is not None],
            "work": (load_run(a["runs"][0], slo_ms).work, load_run(b["runs"][0], slo_ms).work)}


TTFT_PARTS = ("queue", "prefill")   # the decomposition's components before the first token
CAUSE_NAMES = {"queue": "queueing", "prefill": "prefill"}
CAUSE_SHARE = 0.5   # a component is the cause when its change is at least this share of TTFT's, same sign


def ttft_cause(metrics: list[dict]) -> dict | None:
    """Why TTFT changed, from the decomposition: when the mean TTFT has a verdict (better or worse) and both
    runs have the decomposition, the component before the first token (queue, prefill) whose mean moved the
    most in TTFT's direction, named the cause when its change is at least CAUSE_SHARE of TTFT's mean change
    (means add up; percentiles do not). None when TTFT has no verdict or a side has no decomposition."""
    by = {(m["metric"], m["stat"]): m for m in metrics}
    t = by.get(("ttft", "mean"))
    d = {c: (by.get((f"decomposition.{c}", "mean")) or {}).get("diff") for c in TTFT_PARTS}
    if t is None or t["verdict"] == "indistinguishable" or not t["diff"] or any(v is None for v in d.values()):
        return None
    share = {c: v / t["diff"] for c, v in d.items()}
    top = max(share, key=lambda c: share[c])
    cause = CAUSE_NAMES[top] if share[top] >= CAUSE_SHARE else None
    moved = "fell" if t["diff"] < 0 else "rose"
    parts_s = ", ".join(f"{c} {v:+.4g} ms ({share[c]:.0%})" for c, v in d.items())
    why = (f"TTFT mean {moved} {abs(t['diff']):.4g} ms ({t['verdict']}): "
           + (f"{cause}: the decomposition's {top} mean explains {share[top]:.0%} of it" if cause else
              f"no component explains {CAUSE_SHARE:.0%} of it") + f" ({parts_s})")
    return {"metric": "ttft", "stat": "mean", "verdict": t["verdict"], "diff_ms": t["diff"],
            "components_ms": d, "shares": share, "cause": cause, "component": top if cause else None,
            "min_share": CAUSE_SHARE, "why": why}


def invalid_input(side: str, path: str, manifest: Manifest | dict[str, Any],
                  rate_per_s: float | None = None) -> dict | None:
    """None for a run that completed (manifest status `complete`, the summary's `valid`); else what the
    comparison says about it: which side, the folder, its status and why (manifest invalid_reasons, and
    the status itself when it is not `invalid`: an interrupted run, or one that never finished writing)."""
    status = manifest.get("status")
    if status == "complete":
        return None
    reasons = [str(r) for r in manifest.get("invalid_reasons") or []]
    if status != "invalid" or not reasons:
        reasons.append(f"run status is {status!r}")
    return {"side": side, "run": path, "status": status, "invalid_reasons": reasons,
            **({"rate_per_s": rate_per_s} if rate_per_s is not None else {})}


def _sweep_invalid(side: str, path: str, summary: dict) -> dict | None:
    # an interrupted sweep: its finished points stand, its knee and search do not describe the whole curve
    status = (summary.get("sweep") or {}).get("status")
    if status in (None, "complete"):
        return None
    return {"side": side, "run": path, "status": status,
            "invalid_reasons": [f"sweep status is {status!r}: its knee and max goodput are of the points it "
                                f"finished"]}


def kind_of(path: str) -> str:
    p = Path(path)
    if (p / "sweep.json").is_file():
        return "sweep"
    if repeats.is_repeats(p):
        return "repeats"
    if (p / "manifest.json").is_file():
        return "run"
    raise CompareError(f"{p}: neither a results folder (manifest.json), a repeats folder (repeats.json) nor a "
                       f"sweep folder (sweep.json)")


def _sweep_points(path: str) -> tuple[dict, dict[float, str]]:
    p = Path(path)
    s = p / "sweep_summary.json"
    if not s.is_file():
        raise CompareError(f"{s}: missing (the sweep did not finish writing its summary)")
    summary = orjson.loads(s.read_bytes())
    return summary, {pt["rate_per_s"]: str(p / pt["dir"]) for pt in summary["points"]}


def compare_pair(a: str, b: str, slo_ms, rules: list[Rule], resamples: int, seed: int, min_effect: float,
                 allow_invalid: bool = False) -> dict:
    ka, kb = kind_of(a), kind_of(b)
    runs = {"run", "repeats"}  # a repeated run compares with a run (the variance says how)
    if ka != kb and not {ka, kb} <= runs:
        raise CompareError(f"cannot compare a {ka} ({a}) with a {kb} ({b})")
    out: dict = {"a": a, "b": b, "kind": "run" if ka in runs else ka}
    invalid: list[dict | None] = []
    if "repeats" in (ka, kb):
        rc = compare_repeated(a, b, slo_ms, min_effect)
        invalid += rc["invalid"]
        diffs = same_work(*rc["work"])
        out.update(variance=rc["variance"], noise_floor=rc["noise_floor"], metrics=rc["metrics"])
        checked = [out["metrics"]]
    elif ka == "run":
        ra, rb = load_run(a, slo_ms), load_run(b, slo_ms)
        invalid += [invalid_input("A", a, ra.manifest), invalid_input("B", b, rb.manifest)]
        diffs = same_work(ra.work, rb.work)
        floor = noise_floor(ra, rb)
        out["noise_floor"] = floor
        out["metrics"] = compare_runs(ra, rb, resamples, seed, min_effect)
        out["ttft_cause"] = ttft_cause(out["metrics"])
        out.update(compare_groups(a, b, slo_ms, resamples, seed, min_effect))
        checked = [out["metrics"]]
    else:
        sa, pa = _sweep_points(a)
        sb, pb = _sweep_points(b)
        invalid += [_sweep_invalid("A", a, sa), _sweep_invalid("B", b, sb)]
        common = sorted(set(pa) & set(pb))
        diffs = []
        if set(pa) != set(pb):
            diffs.append({"field": "rate", "a": sorted(pa), "b": sorted(pb)})
        out["points"] = []
        for r in common:
            if repeats.is_repeats(pa[r]) or repeats.is_repeats(pb[r]):  # sweep --repeat N: its points
                rc = compare_repeated(pa[r], pb[r], slo_ms, min_effect, r)
                invalid += rc["invalid"]
                diffs += [d for d in same_work(*rc["work"])
                          if d not in diffs and d["field"] not in ("rate", "requests")]
                out["points"].append({"rate_per_s": r, "noise_floor": rc["noise_floor"], "variance": rc["variance"],
                                      "metrics": rc["metrics"]})
                continue
            ra, rb = load_run(pa[r], slo_ms), load_run(pb[r], slo_ms)
            invalid += [invalid_input("A", pa[r], ra.manifest, r), invalid_input("B", pb[r], rb.manifest, r)]
            for d in same_work(ra.work, rb.work):
                if d not in diffs and d["field"] not in ("rate", "requests"):
                    diffs.append(d)
            ms = compare_runs(ra, rb, resamples, seed, min_effect)
            out["points"].append({"rate_per_s": r, "noise_floor": noise_floor(ra, rb), "metrics": ms,
                                  "ttft_cause": ttft_cause(ms)})
        out["curves"] = {"knee_per_s": {"a": sa["knee"]["rate_per_s"], "b": sb["knee"]["rate_per_s"]},
                         "max_goodput_per_s": {"a": (sa.get("max_goodput") or {}).get("rate_per_s"),
                                               "b": (sb.get("max_goodput") or {}).get("rate_per_s")}}
        checked = [p["metrics"] for p in out["points"]]
    out["invalid"] = [x for x in invalid if x is not None]
    out["same_work"] = {"same": not diffs, "differences": diffs}
    out["fail_if"] = [_gate(rule, checked, out["invalid"], allow_invalid) for rule in rules]
    return out


def _gate(rule: Rule, checked: list[list[dict]], invalid: list[dict], allow_invalid: bool) -> dict:
    """One --fail-if rule over a comparison. Against an invalid side it is not evaluated (held None): its
    numbers do not describe the asked work, so neither "held" nor "not held" would be a finding."""
    if invalid and not allow_invalid:
        return {"rule": rule.text, "held": None, "value": None,
                "not_evaluated": "an input is invalid: " + ", ".join(f"{x['side']} {x['run']}" for x in invalid)}
    hits = [h for h in (evaluate(rule, ms) for ms in checked) if h is not None]
    held = [h for h in hits if h["held"]]
    return {"rule": rule.text, "held": bool(held), "value": (held or hits or [{"value": None}])[0]["value"]}


MAX_RESAMPLES = 1_000_000   # each resample is a pass over every request of both runs: more is a typo
MIN_RESAMPLES = 100


def method_problems(resamples: object, seed: object, min_effect: object) -> list[str]:
    """The bootstrap's options checked, each problem naming its flag (--resamples, --seed, --min-effect)."""
    def whole(flag: str, v: object, lo: int, hi: int) -> list[str]:
        ok = isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi
        return [] if ok else [f"{flag}: must be a whole number from {lo} to {hi}, got {v!r}"]

    ok = isinstance(min_effect, (int, float)) and not isinstance(min_effect, bool) and 0 <= min_effect <= 1
    return (whole("--resamples", resamples, MIN_RESAMPLES, MAX_RESAMPLES) + whole("--seed", seed, 0, INT64_MAX)
            + ([] if ok else [f"--min-effect: must be a fraction from 0 to 1, got {min_effect!r}"]))


def compare(inputs: list[str], slo_ms=None, fail_if: Sequence[str] = (), resamples: int = bs.RESAMPLES,
            seed: int = 0, min_effect: float = MIN_EFFECT, allow_invalid: bool = False) -> dict:
    if len(inputs) < 2:
        raise CompareError("compare needs at least two results or sweep folders")
    problems = method_problems(resamples, seed, min_effect)
    if problems:
        raise CompareError("; ".join(problems))
    rules = [parse_fail_if(t) for t in fail_if]
    comps = [compare_pair(inputs[0], b, slo_ms, rules, resamples, seed, min_effect, allow_invalid)
             for b in inputs[1:]]
    failed = [f"{c['b']}: {r['rule']} ({_change(r['value'], r['rule'])})" for c in comps for r in c["fail_if"]
              if r["held"]]
    invalid: list[dict] = []
    for c in comps:  # A is in every comparison: named once
        invalid += [x for x in c["invalid"] if x not in invalid]
    # invalid_inputs comes first: the first thing a reader of the JSON sees
    return {"invalid_inputs": invalid, "kind": "loadgen-compare", "schema_version": SCHEMA_VERSION,
            "method": {"resampling": bs.__doc__.split("\n\n")[1].replace("\n", " "), "resamples": resamples,
                       "seed": seed, "confidence": bs.CONFIDENCE, "min_effect": min_effect,
                       "percentiles": "nearest rank", "allow_invalid": allow_invalid},
            "baseline": inputs[0], "comparisons": comps, "failed_rules": failed,
            "rules_not_evaluated": bool(rules) and bool(invalid) and not allow_invalid}


def exit_code(result: dict) -> ExitCode:
    """compare's exit status: INVALID (3) when --fail-if rules were not evaluated because an input is invalid
    (the gate could not decide: not "passed", and not a usage error either: the command was right, an input
    run is not), FAIL_IF (4) when a rule held, else OK."""
    if result["rules_not_evaluated"]:
        return ExitCode.INVALID
    return ExitCode.FAIL_IF if result["failed_rules"] else ExitCode.OK


def invalid_lines(result: dict) -> list[str]:
    """One line per invalid input, for the first lines of the text (and the pages' banner)."""
    lines = []
    for x in result.get("invalid_inputs") or []:
        at = f" (point {x['rate_per_s']:g}/s)" if x.get("rate_per_s") is not None else ""
        lines.append(f"INVALID INPUT: {x['side']} {x['run']}{at} is {x['status']}: "
                     + "; ".join(x["invalid_reasons"]))
    return lines


def _change(v, rule_text: str) -> str:
    if v is None:
        return "-"
    return f"{v:+.1%}" if rule_text.rstrip().endswith("%") else f"{v:+.3g}"


def to_text(result: dict) -> str:
    lines = invalid_lines(result)   # first: a reader who sees one line sees this
    if result["rules_not_evaluated"]:
        lines.append("--fail-if NOT EVALUATED against an invalid input (exit 3); --allow-invalid evaluates it anyway")
    lines.append(f"baseline (A): {result['baseline']}")
    for c in result["comparisons"]:
        lines += ["", f"B: {c['b']}  ({c['kind']})"]
        for d in c["same_work"]["differences"]:
            lines.append(f"WARNING: NOT THE SAME WORK: {d['field']} differs: A {_show(d['a'])}  B {_show(d['b'])}"
                         + (f" ({d['why']})" if d.get("why") else ""))
        if c["kind"] == "run":
            lines += _variance_line(c) + [_floor_line(c["noise_floor"])]
            lines += _table(c["metrics"]) + _cause_line(c.get("ttft_cause"))
            for section, label in (("by_class", "class"), ("by_model", "model")):
                for name, ms in (c.get(section) or {}).items():
                    lines += ["", f"{label} {name}"] + _table([m for m in ms if (m["metric"], m["stat"]) in SWEEP_ROWS])
        else:
            cv = c["curves"]
            lines.append(f"knee        A {_show(cv['knee_per_s']['a'])}/s  B {_show(cv['knee_per_s']['b'])}/s")
            lines.append(f"max goodput A {_show(cv['max_goodput_per_s']['a'])}/s  "
                         f"B {_show(cv['max_goodput_per_s']['b'])}/s")
            for p in c["points"]:
                keep = [m for m in p["metrics"] if (m["metric"], m["stat"]) in SWEEP_ROWS]
                lines += ["", f"at {p['rate_per_s']:g}/s"] + _variance_line(p)
                lines += [_floor_line(p["noise_floor"])] + _table(keep) + _cause_line(p.get("ttft_cause"))
        for r in c["fail_if"]:
            state = "not evaluated" if r["held"] is None else "HELD" if r["held"] else "not held"
            lines.append(f"fail-if {r['rule']!r}: {state} ({r.get('not_evaluated') or _change(r['value'], r['rule'])})")
    lines += ["", "CI: 95 % moving-block bootstrap over requests (ITL: all of a request's tokens together); "
                  f"verdict needs the CI of the change to exclude 0 (else 'CI spans zero') and |change| >= "
                  f"{result['method']['min_effect']:.0%} (else '< min effect') and, in ms, >= the noise floor "
                  "(else '< noise floor'); 'both within noise': A and B are both below the floor, no relative "
                  "change is given (the JSON's `why` says each in full)"]
    if any("variance" in x for c in result["comparisons"] for x in (c, *c.get("points", []))):
        lines.append("repeated inputs (--repeat): their CIs are Student t over the run values, the change's from the "
                     "across-run variance named on each `variance` line, not the bootstrap")
    if result["failed_rules"]:
        lines += [f"FAILED: {f}" for f in result["failed_rules"]]
    return "\n".join(lines) + "\n"


def _variance_line(c: dict) -> list[str]:
    """A comparison (or sweep point) with a repeated input: which variance judged it (compare_repeated)."""
    return [f"variance: {c['variance']}"] if c.get("variance") else []


def _cause_line(cause: dict | None) -> list[str]:
    return [f"cause of the TTFT change: {cause['why']}"] if cause else []


def _floor_line(floor: dict) -> str:
    return (f"noise floor {floor['ms']:.4g} ms: {floor['source']} (loop-lateness p99: A {floor['a_ms']:.4g} ms, "
            f"B {floor['b_ms']:.4g} ms)")


SWEEP_ROWS = {("ttft", "p50"), ("ttft", "p99"), ("itl", "p50"), ("itl", "p99"), ("e2e", "p99"),
              ("throughput", "value"), ("goodput", "value")}


def _table(metrics: list[dict]) -> list[str]:
    rows = [f"{'metric':<28}{'stat':<6}{'A':>10}{'B':>10}{'change':>9}  {'95% CI of change':<20}verdict"]
    for m in metrics:
        ci = m["rel_ci"]
        ci_s = "-" if ci[0] is None else f"[{ci[0]:+.1%}, {ci[1]:+.1%}]"
        rel = "-" if m["rel"] is None else f"{m['rel']:+.1%}"
        why = ", ".join(REASON_SHORT[r] for r in m.get("reasons") or [])
        rows.append(f"{m['metric']:<28}{m['stat']:<6}{_fmt(m['a']):>10}{_fmt(m['b']):>10}{rel:>9}  {ci_s:<20}"
                    f"{m['verdict']}{f' ({why})' if why else ''}")
    return rows


def _fmt(v) -> str:
    if v is None:
        return "-"
    return f"{v:.3f}" if abs(v) < 10 else f"{v:.1f}"


def _show(v) -> str:
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k}: {_fmt(x) if isinstance(x, float) else x}" for k, x in v.items()) + "}"
    return str(v)
