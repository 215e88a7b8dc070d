"""`loadgen sweep`: one workload at a series of rates, one results folder per point, the saturation knee
and (with SLOs) the highest rate that meets an attainment target. docs/sweep-and-compare.md has the
files' schemas.

Rates: a list (`--rates 2,4,8/s`), or a geometric series from `--start` by `--factor` that stops at the
first point past the criterion (or at --max-rate / --max-points); `--refine K` then bisects K times
between the last point that met the criterion and the first that did not (geometric midpoints), so the
answer's resolution is hi/lo - 1 and the number of points is stated in the summary (`search`).

The knee (analysis/knee.py): a valid point is saturated when its completions fall behind its offers over
its steady-state window (metrics.steady_rates), its median request queues (TTFT p50 above the lowest
valid point's by more than that point's e2e p50), its TPOT p50 exceeds tpot_factor (2x) the lowest valid
point's, or (with --scrape-metrics) the server's own waiting gauge averages >= 1 over the window;
`saturated_by` names which. The knee is the highest rate at which this valid point and every lower valid
one keep up. An invalid point is run once more; invalid again, it is excluded from the knee
(`knee.excluded`, with its reasons; an explicit list passes over it, a geometric series takes it as its
upper bracket). The search does not escalate past a point that is error-dominated or over-saturated
(knee.stop_reason; `search.stopped` says which). Beside it, `ttft_knee_per_s` is the highest rate at
which p99 TTFT stays within `ttft_factor` of the lowest valid point's. With --scrape-metrics each point
also reports the server's peak waiting-queue depth and KV usage (`server_max_waiting`,
`server_max_kv_usage`). Max goodput: the highest rate whose run is valid and whose attainment
(goodput.py) is >= the target; `max_goodput.keeps_up` is false (and the text warns) when that rate is
past the knee, where a finite run meets the SLOs only until its queue grows past them.

Files: DIR/sweep.json (the manifest: spec, base config, each point's rate, folder and status, written
after every point), DIR/rate-<r>/ (a normal results folder with its summary.json; with --repeat N a repeats folder, the
point's row the mean of its repeats' rows, run/repeat.py), and at the end (also
after an interrupt) DIR/sweep_summary.json and DIR/sweep_summary.txt. `--resume` re-reads sweep.json,
keeps every finished point and measures only what is missing (the search is deterministic given the
points, so it continues where it stopped).
"""
from __future__ import annotations

import math
import shutil
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from datetime import datetime
from pathlib import Path
from typing import TextIO

import orjson
import polars as pl

from loadgen.analysis.diagnose import facts_from_metrics
from loadgen.analysis.explain import ExplainOptions
from loadgen.analysis.knee import (KNEE_TOLERANCE, TPOT_FACTOR, TTFT_FACTOR, WAITING_MEAN, base_point, knee,
                                   meets_attainment, saturation, stop_reason)
from loadgen.analysis.report_summary import build
from loadgen.config.client import ClientOptions
from loadgen.config.workload import RunConfig, with_overrides
from loadgen.errors import ExitCode, SweepError
from loadgen.metrics import number, steady_rates
from loadgen.probe.scrape import WAITING
from loadgen.results.folder import Json, read_run, write_json
from loadgen.run.launch import run_workload
from loadgen.run.outcome import RunOutcome
from loadgen.run.liveview import LiveView
from loadgen.run.repeat import mean_record, point_repeats, run_repeated
from loadgen.analysis.repeats import is_repeats

SCHEMA_VERSION = 1
MANIFEST, SUMMARY_JSON, SUMMARY_TXT = "sweep.json", "sweep_summary.json", "sweep_summary.txt"
LAT_METRICS = ("ttft", "tpot", "itl", "e2e")
DECOMP = ("queue", "prefill", "decode", "decode_stalls", "send_lag", "other")


@dataclass(frozen=True)
class SweepSpec:
    rates: tuple[float, ...] = ()       # an explicit list (per s), or:
    start_per_s: float | None = None    # a geometric series start * factor^k
    factor: float = 2.0
    max_rate_per_s: float | None = None
    max_points: int = 12
    refine: int = 0                     # bisection steps after the bracket is found
    max_goodput: bool = False           # search on attainment >= `attainment` instead of the knee
    attainment: float = 0.9
    slo_ms: dict = field(default_factory=dict)
    tolerance: float = KNEE_TOLERANCE
    ttft_factor: float = TTFT_FACTOR
    tpot_factor: float = TPOT_FACTOR
    waiting_mean: float = WAITING_MEAN


def default_sweep_out(config: RunConfig) -> Path:
    return Path("results") / f"{config.name}-sweep-{datetime.now().strftime('%Y%m%d-%H%M%S')}"


def round_rate(r: float) -> float:
    return float(f"{r:.4g}")  # a point's identity: 4 significant digits (also its folder name)


def point_dir(r: float) -> str:
    return f"rate-{round_rate(r):g}"


# --- the search (the knee rule: loadgen/analysis/knee.py) ---------------------------------------------
def search(measure: Callable[[float], dict], good: Callable[[dict], bool], spec: SweepSpec,
           stop: Callable[[dict], str | None] = lambda p: None, skip: Callable[[dict], bool] = lambda p: False
           ) -> dict:
    """Measure points until the criterion `good` is bracketed, then bisect spec.refine times. `stop(point)`
    names why no higher rate may be measured (error-dominated, over-saturated): an explicit list ends
    there, and such a point is never good. `skip(point)`: a point without a verdict (invalid twice): an
    explicit list passes over it; a series or a bisection cannot, and takes it as not good. Returns {"lo",
    "hi", "points", "resolution_rel", "stopped"}; lo = highest good rate (None if none)."""
    measured: dict[float, dict] = {}
    halted: list[str] = []

    def at(r: float) -> bool:
        r = round_rate(r)
        if r not in measured:
            measured[r] = measure(r)
            why = stop(measured[r])
            if why and not halted:
                halted.append(f"stopped escalating at {r:g}/s: {why}")
        return good(measured[r]) and not stop(measured[r])

    lo = hi = None
    stopped = ""
    if spec.rates:
        for r in sorted(spec.rates):
            ok = at(r)
            if skip(measured[round_rate(r)]):
                pass
            elif ok and hi is None:
                lo = round_rate(r)
            elif not ok and hi is None:
                hi = round_rate(r)
            if halted:
                break
        # an explicit list is measured whole (up to a stop); the bracket is the first miss and the good
        # point before it
    else:
        if spec.start_per_s is None:
            raise SweepError("a sweep needs rates or a start rate")
        r = spec.start_per_s
        ok = at(r)
        step = spec.factor if ok else 1 / spec.factor
        while True:
            if ok:
                lo = round_rate(r)
            else:
                hi = round_rate(r)
            if lo is not None and hi is not None:
                break
            r *= step
            if len(measured) >= spec.max_points:
                stopped = f"max_points ({spec.max_points}) reached"
                break
            if step > 1 and spec.max_rate_per_s is not None and r > spec.max_rate_per_s * (1 + 1e-9):
                stopped = f"max_rate ({spec.max_rate_per_s:g}/s) reached before the criterion failed"
                break
            ok = at(r)
    if lo is not None and hi is not None and lo < hi:
        for _ in range(spec.refine):
            mid = round_rate(math.sqrt(lo * hi))
            if mid in (lo, hi):
                break
            if at(mid):
                lo = mid
            else:
                hi = mid
    stopped = "; ".join([*halted, *([stopped] if stopped else [])])
    return {"lo": lo, "hi": hi, "points": len(measured),
            "resolution_rel": (hi / lo - 1) if lo and hi and hi > lo else None, "stopped": stopped or None}


# --- running ------------------------------------------------------------------------------------------
@dataclass
class SweepOutcome:
    path: Path
    status: str                 # complete | interrupted
    summary: dict

    @property
    def exit_code(self) -> int:
        return ExitCode.OK if self.status == "complete" else ExitCode.INTERRUPTED


def check_config(config: RunConfig) -> None:
    if config.concurrency:
        raise SweepError("sweep varies the arrival rate of an open loop; it cannot sweep a closed loop "
                         "(--concurrency)")
    if config.arrivals.process not in ("poisson", "constant", "gamma") or math.isinf(config.arrivals.rate_per_s):
        raise SweepError(f"sweep needs poisson, constant or gamma arrivals at a finite rate, not "
                         f"{config.arrivals.process!r} (the workload's arrivals.process)")


def spec_record(spec: SweepSpec) -> dict:
    return asdict(spec) | {"rates": list(spec.rates)}


def _base_record(config: RunConfig) -> dict:
    d = config.to_manifest()
    d.pop("out", None)
    for k in ("metrics_port", "metrics_host"):  # where the live figures are served changes no measurement
        d.pop(k, None)
    d["arrivals"].pop("rate_per_s", None)  # the swept quantity
    return d


def run_sweep(config: RunConfig, spec: SweepSpec, out: Path, *, resume: bool = False,
              opts: ExplainOptions | None = None, progress: TextIO | None = sys.stderr,
              run_point: Callable | None = None, client: ClientOptions | None = None,
              run_one: Callable[..., RunOutcome] | None = None, live: LiveView | None = None) -> SweepOutcome:
    """client: how every point talks to the target (headers, TLS; config/client.py), as a run's; run_one:
    how one run of a point is made (run_workload, or an Exporter's for --metrics-port: it takes the feed
    too). live: the terminal view (run/liveview.py; one-process points only): each point's run watched
    live, and each finished point added to its table; `progress` is then its stream."""
    run_one = run_one or run_workload
    check_config(config)
    for r in (*spec.rates, spec.start_per_s, spec.max_rate_per_s):  # every rate asked, before any point runs
        if r is not None:
            with_overrides(config, "sweep", arrivals=replace(config.arrivals, rate_per_s=r))
    # --repeat N: each point a repeats folder of N runs (run/repeat.py), judged on its repeats' mean record
    run_point = run_point or (partial(run_repeated, opts=opts, slo_ms=spec.slo_ms or None, client=client,
                                      run_one=run_one)
                              if config.repeat > 1 else partial(run_one, client=client))
    out = Path(out)
    manifest: Json = {"kind": "loadgen-sweep", "schema_version": SCHEMA_VERSION, "status": "running",
                "workload": config.source, "spec": spec_record(spec), "config": _base_record(config),
                "points": []}
    done: dict[float, dict] = {}
    if (out / MANIFEST).is_file():
        old = orjson.loads((out / MANIFEST).read_bytes())
        if not resume:
            raise SweepError(f"{out}: holds a sweep already; pass --resume to continue it or choose another --out")
        for key in ("spec", "config"):
            if old.get(key) != orjson.loads(orjson.dumps(manifest[key])):
                diff = sorted(k for k in set(old.get(key, {})) | set(manifest[key])
                              if old.get(key, {}).get(k) != orjson.loads(orjson.dumps(manifest[key])).get(k))
                raise SweepError(f"{out / MANIFEST}: --resume with a different {key} (differs in: "
                                 f"{', '.join(diff)}); use the same workload and flags, or another --out")
        for p in old.get("points", []):
            if p.get("status") in ("complete", "invalid") and any((out / p["dir"] / f).is_file()
                                                                  for f in ("summary.json", "repeats.json")):
                done[round_rate(p["rate_per_s"])] = p
    elif resume:
        raise SweepError(f"{out}: no {MANIFEST} to resume")
    elif out.exists() and any(out.iterdir()):
        raise SweepError(f"{out}: folder is not empty and holds no sweep; choose another --out")
    out.mkdir(parents=True, exist_ok=True)
    manifest["points"] = list(done.values())
    write_json(out / MANIFEST, manifest)
    records: dict[float, dict] = {}

    class Interrupted(Exception):
        pass

    def run_at(cfg: RunConfig, r: float):
        if live is None:
            return run_point(cfg, progress=progress)
        with live.watching(f"loadgen sweep: point {len(records) + 1} at {r:g}/s") as feed:
            return run_point(cfg, progress=progress, feed=feed)

    def measure(r: float) -> dict:
        if r in done:
            rec = point_record(out, done[r], spec)
            _say(progress, f"sweep: {r:g}/s kept from the earlier sweep")
        else:
            folder = out / point_dir(r)
            if folder.exists():
                shutil.rmtree(folder)  # an unfinished point of an interrupted sweep: measured again
            _say(progress, f"sweep: point {len(records) + 1} at {r:g}/s -> {folder}")
            cfg = with_overrides(config, "sweep", arrivals=replace(config.arrivals, rate_per_s=r), out=str(folder))
            outcome = run_at(cfg, r)
            entry = {"rate_per_s": r, "dir": point_dir(r), "status": outcome.status}
            if outcome.status == "invalid":  # once more: a host that took the CPU for a moment is no verdict
                first = list(outcome.invalid_reasons)
                _say(progress, f"sweep: {r:g}/s invalid ({'; '.join(first)}): measured once more")
                shutil.rmtree(folder)
                outcome = run_at(cfg, r)
                entry.update(status=outcome.status, rerun_of_invalid=first)
            manifest["points"].append(entry)
            write_json(out / MANIFEST, manifest)
            if outcome.status not in ("complete", "invalid"):
                raise Interrupted
            if not is_repeats(folder):  # a repeats folder's summaries are built by run_repeated
                build(folder, opts, spec.slo_ms or None)
            rec = point_record(out, entry, spec)
        records[r] = rec
        if live is not None:
            live.point(rec, saturated_by(rec) if rec["valid"] else None)
        return rec

    def saturated_by(p: dict) -> list[str]:  # against the lowest valid point measured so far
        return saturation(p, base_point(list(records.values())), spec.tolerance, spec.tpot_factor,
                          spec.waiting_mean)

    def unsaturated(p: dict) -> bool:
        return bool(p["valid"]) and not saturated_by(p)

    good = (lambda p: meets_attainment(p, spec.attainment)) if spec.max_goodput else unsaturated
    status, found = "complete", None
    try:
        found = search(measure, good, spec, stop_reason, skip=lambda p: not p["valid"])
    except (Interrupted, KeyboardInterrupt):
        status = "interrupted"
    manifest["status"] = status
    write_json(out / MANIFEST, manifest)
    for r, entry in done.items():  # kept points the search did not revisit (an interrupt came first)
        records.setdefault(r, point_record(out, entry, spec))
    summary = sweep_summary(out, manifest, list(records.values()), spec, found)
    write_json(out / SUMMARY_JSON, summary)
    (out / SUMMARY_TXT).write_text(summary_text(summary))
    return SweepOutcome(out, status, summary)


def point_record(out: Path, entry: dict, spec: SweepSpec) -> dict:
    """One row of the sweep summary, from the point's summary.json and requests.parquet (a repeats folder:
    the mean of its repeats' rows, with their spread in `repeats`)."""
    folder = out / entry["dir"]
    if is_repeats(folder):
        runs = [point_record(out, {**entry, "dir": f"{entry['dir']}/{r['dir']}", "status": r["status"]}, spec)
                for r in orjson.loads((folder / "repeats.json").read_bytes())["runs"]]
        # judged like any point (judge), on its repeats' means
        return mean_record(runs) | {"dir": entry["dir"], "status": entry["status"]} | point_repeats(folder, runs)
    s = orjson.loads((folder / "summary.json").read_bytes())
    run = read_run(folder)
    rows = run.requests
    first = rows.filter(~pl.col("warmup"))["intended_ns"].min()  # the end of warm-up; None: nothing measured
    steady = steady_rates(rows["intended_ns"].cast(pl.Float64).to_numpy(), rows["done_ns"].cast(pl.Float64).to_numpy(),
                          int(number(first))) if first is not None else None
    scraped = run.server_metrics()
    max_waiting, max_kv = facts_from_metrics(scraped)  # with --scrape-metrics, else None
    dec = (s.get("decomposition_ms") or {}).get("mean") or {}
    rec = {
        "rate_per_s": entry["rate_per_s"], "dir": entry["dir"], "status": entry["status"],
        "valid": bool(s.get("valid")), "invalid_reasons": s.get("invalid_reasons", []),
        "requests": s["requests"],
        "offered_per_s": steady and steady.offered_per_s,
        "completed_per_s": steady and steady.completed_per_s,
        "steady_window": steady and {"start_ns": steady.start_ns, "end_ns": steady.end_ns,
                                     "method": steady.method, "short": steady.short},
        "throughput": s["throughput"],
        "latency_ms": {m: {k: s["latency_ms"][m][k] for k in ("p50", "p90", "p99", "mean")} for m in LAT_METRICS},
        "decomposition_mean_ms": {c: dec.get(c) for c in DECOMP},
        "goodput": s.get("goodput"),
        "server_max_waiting": max_waiting, "server_max_kv_usage": max_kv,
        "server_mean_waiting": mean_waiting(scraped, steady.start_ns, steady.end_ns) if steady else None,
        "rerun_of_invalid": entry.get("rerun_of_invalid"),
        # measured vs implied by the workload (analysis/prefix_cache.py): each point draws its own salt
        "prefix_cache_hit_rate": (s.get("prefix_cache") or {}).get("hit_rate"),
        "prefix_cache_mismatch": (s.get("prefix_cache") or {}).get("mismatch"),
    }
    return rec


def mean_waiting(scraped: pl.DataFrame | None, start_ns: int, end_ns: int) -> float | None:
    """The server's waiting gauge (summed over its label sets per scrape), averaged over the scrapes taken
    within [start_ns, end_ns] (ns from t0); None when it was not scraped there."""
    if scraped is None:
        return None
    w = (scraped.filter(pl.col("name").is_in(list(WAITING)) & pl.col("t_ns").is_between(start_ns, end_ns))
         .group_by("t_ns").agg(pl.col("value").sum()))
    return float(number(w["value"].mean())) if w.height else None


def judge(pts: list[dict], spec: SweepSpec) -> None:
    """Each point's verdict against the lowest valid point: keeps_up and saturated_by (in place)."""
    base = base_point(pts)
    for p in pts:
        why = saturation(p, base, spec.tolerance, spec.tpot_factor, spec.waiting_mean) if p["valid"] else []
        p["saturated_by"], p["keeps_up"] = why, bool(p["valid"]) and not why
        if spec.slo_ms:
            p["meets_attainment"] = meets_attainment(p, spec.attainment)


def sweep_summary(out: Path, manifest: dict, records: list[dict], spec: SweepSpec, found: dict | None) -> dict:
    pts = sorted(records, key=lambda p: p["rate_per_s"])
    judge(pts, spec)
    max_goodput = None
    if spec.max_goodput:
        best = max((p for p in pts if meets_attainment(p, spec.attainment)), key=lambda p: p["rate_per_s"],
                   default=None)
        max_goodput = {"rate_per_s": best["rate_per_s"] if best else None,
                       "goodput_per_s": best["goodput"]["requests_per_s"] if best else None,
                       "attainment": best["goodput"]["attainment"] if best else None,
                       "target_attainment": spec.attainment,
                       "first_missed_per_s": (found or {}).get("hi"),
                       # past the knee the SLOs hold only for as long as the run is too short for the
                       # queue to grow past them: say so rather than call the rate sustainable
                       "keeps_up": best["keeps_up"] if best else None}
    return {"kind": "loadgen-sweep-summary", "schema_version": SCHEMA_VERSION,
            "sweep": {"path": str(out), "workload": manifest["workload"], "status": manifest["status"],
                      "mode": "max_goodput" if spec.max_goodput else "knee", "spec": manifest["spec"]},
            "slo": {f"{k}_ms": v for k, v in spec.slo_ms.items()} or None,
            "points": pts,
            "knee": knee(pts, spec.tolerance, spec.ttft_factor, spec.tpot_factor, spec.waiting_mean),
            "max_goodput": max_goodput,
            "search": found}


def summary_text(s: dict) -> str:
    def f(v, fmt="{:.1f}"):
        return "-" if v is None else fmt.format(v)

    lines = [f"sweep      {s['sweep']['path']}  ({s['sweep']['status']}, {s['sweep']['mode']})",
             f"workload   {s['sweep']['workload']}", "",
             f"{'rate/s':>8}{'offer/s':>8}{'done/s':>8}{'tok/s':>9}{'ttft50':>8}{'ttft99':>8}{'tpot50':>8}{'itl99':>8}"
             f"{'e2e99':>8}{'queue':>8}{'prefill':>8}{'decode':>8}{'attain':>8}{'good/s':>8}  ok"]
    for p in s["points"]:
        lat, d, g = p["latency_ms"], p["decomposition_mean_ms"], p.get("goodput") or {}
        tok_s = f(p["throughput"]["output_tokens_per_s"], "{:.0f}")
        lines.append(f"{p['rate_per_s']:>8g}{f(p['offered_per_s']):>8}{f(p['completed_per_s']):>8}{tok_s:>9}"
                     f"{f(lat['ttft']['p50']):>8}{f(lat['ttft']['p99']):>8}{f(lat['tpot']['p50'], '{:.2f}'):>8}"
                     f"{f(lat['itl']['p99'], '{:.2f}'):>8}{f(lat['e2e']['p99']):>8}{f(d['queue']):>8}"
                     f"{f(d['prefill']):>8}{f(d['decode']):>8}{f(g.get('attainment'), '{:.0%}'):>8}"
                     f"{f(g.get('requests_per_s')):>8}  {'yes' if p['keeps_up'] else 'NO'}"
                     + (f" ({', '.join(p['saturated_by'])})" if p.get("saturated_by") else "")
                     + ("" if p["valid"] else "  INVALID (excluded)")
                     + ("  (re-run: the first run was invalid)" if p.get("rerun_of_invalid") else ""))
    lines += _prefix_cache_lines(s["points"])
    lines += repeat_lines(s["points"])
    k = s["knee"]
    by = f" by {', '.join(k['saturated_by'])}" if k.get("saturated_by") else ""
    lines += ["", "latency in ms (decomposition: mean per request); offer/done over the steady-state window; "
                  "ok = not saturated (else the rules it broke)",
              f"knee       {f(k['rate_per_s'], '{:g}')}/s (offered {f(k['offered_per_s'])}/s; first saturated point: "
              f"{f(k['first_saturated_per_s'], '{:g}')}/s{by}, completing {f(k['completed_per_s_past_knee'])}/s); "
              f"p99 TTFT within the factor up to "
              f"{f(k['ttft_knee_per_s'], '{:g}')}/s",
              f"           rule: {k['rule']}"]
    for x in k.get("excluded") or []:
        lines.append(f"excluded   {x['rate_per_s']:g}/s: invalid ({'; '.join(x['reasons'])})")
    if s.get("max_goodput"):
        m = s["max_goodput"]
        lines.append(f"max goodput at {f(m['rate_per_s'], '{:g}')}/s: {f(m['goodput_per_s'])} req/s meet every SLO, "
                     f"attainment {f(m['attainment'], '{:.1%}')} (target {m['target_attainment']:.0%}; missed at "
                     f"{f(m['first_missed_per_s'], '{:g}')}/s)")
        if m["keeps_up"] is False:
            lines.append("           WARNING: past the knee (the server does not keep up there): the SLOs held only "
                         "because the run ended before the queue grew; a longer run would miss them")
    if s.get("search"):
        sr = s["search"]
        stopped = f"; {sr['stopped']}" if sr["stopped"] else ""
        lines.append(f"search     {sr['points']} points; bracket {f(sr['lo'], '{:g}')}..{f(sr['hi'], '{:g}')}/s, "
                     f"resolution {f(sr['resolution_rel'], '{:.1%}')}{stopped}")
    if s["sweep"]["status"] != "complete":
        lines.append(f"INTERRUPTED: the finished points are kept; `loadgen sweep ... --out {s['sweep']['path']} "
                     "--resume` continues")
    return "\n".join(lines) + "\n"


def _prefix_cache_lines(points: list[dict]) -> list[str]:
    """Each point's prefix-cache hit rate, and a warning per point whose rate its workload does not imply."""
    rates = [(p["rate_per_s"], p.get("prefix_cache_hit_rate")) for p in points]
    if all(h is None for _, h in rates):
        return []
    lines = ["", "prefix-cache hit rate  " + "  ".join(f"{r:g}/s {'-' if h is None else f'{h:.1%}'}"
                                                     for r, h in rates)]
    lines += [f"WARNING at {p['rate_per_s']:g}/s: {p['prefix_cache_mismatch']}" for p in points
              if p.get("prefix_cache_mismatch")]
    return lines


SPREAD_ROWS = (("ttft", "p99"), ("tpot", "p50"), ("itl", "p99"), ("e2e", "p99"), ("throughput", "value"))


def repeat_lines(points: list[dict]) -> list[str]:
    """sweep --repeat N: under the table (whose numbers are the repeats' means), each point's spread: the
    Student-t 95 % CI of a few figures over its repeats."""
    out = []
    for p in points:
        if not p.get("repeats"):
            continue
        by = {(f["metric"], f["stat"]): f for f in p["repeats"]["figures"]}
        cells = [f"{m}{st.lstrip('p') if st != 'value' else ''} [{f['ci'][0]:.4g}, {f['ci'][1]:.4g}]"
                 for m, st in SPREAD_ROWS if (f := by.get((m, st))) and f["ci"][0] is not None]
        out.append(f"{p['rate_per_s']:>8g}  {p['repeats']['n']} repeats, 95 % t CI: " + "  ".join(cells))
    return ["", "spread over the repeats (the table shows their means):", *out] if out else []


def _say(out: TextIO | None, text: str) -> None:
    if out is not None:
        out.write(text + "\n")
        out.flush()
