"""Validation of the twin (docs/twin.md) by coverage, against a live llama-server: `loadgen fit` it,
`loadgen predict` the mixed workload (twin_mixed.toml) with intervals at LEVEL, then `loadgen run` the same
plan (same seed) at each rate REPEATS times and count the measured figures that fall inside their predicted
intervals. Used by tests/e2e/test_twin.py and `make bench` (bench_twin.py).

Cells: below the knee (fractions < 1), p50 and p99 of TTFT, TPOT and e2e of each run; past it, each run's
completion rate (the capacity as measured). The repeats go round the rates (0.2, 0.6, 2 x capacity, then
again), so a rate's runs are minutes apart and meet whatever speed phases the host has then. No run is
discarded or tried again: the intervals carry the host's variation, or the coverage says they do not.

The bound (min_inside): a cell inside its interval is a draw of probability LEVEL when the intervals are
right; the test asks at least the count that Binomial(cells, LEVEL) reaches with probability 1 - ALPHA. Cells
of one run share its server speed, so the count varies more than a binomial one: ALPHA is small for that.

Point errors ((predicted - measured) / measured), the server's in-run speed (its own timings of the requests
that had it alone, over the profile's) and the run-queue wait of its compute thread are reported beside.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import orjson
import polars as pl

from loadgen.twin.fit_model import predicted_ttft_s
from loadgen.twin.intervals import Spread, load_spread
from loadgen.twin.predict import Plan, point, predict, with_settings
from loadgen.results.folder import read_run
from loadgen.sim.profiles import Profile, load_profile
from tests.e2e.waited import HOST_BUSY_MAX, HostBusy, Waited
from tests.integration.conftest import RELAXED_SELFCHECK, loadgen

WORKLOAD = str(Path(__file__).with_name("twin_mixed.toml"))
# light load, moderate load (below the knee), past the knee; x the predicted capacity, so that every machine
# is validated at the same utilizations (a fixed rate lands at 0.6 of one machine's capacity and 0.9 of
# another's)
FRACTIONS = (0.2, 0.6, 2.0)
FIT_WAITED_MAX = 0.25  # a fit's premise: the server's compute thread waited at most this share of its runnable time
REPEATS = 2
LEVEL = 0.8
ALPHA = 0.001
METRICS = ("ttft", "tpot", "e2e")
QUANTILES = ("p50", "p99")


# The measurement keeps running when the host parks the client now and then (send lag is a client fault the
# self-check flags, not what the twin is judged on): the table still shows what the server did. Past the
# knee llama-server may close a queued connection before answering (a fresh clone's run at 2x capacity: 1
# reset of 80 requests, which made it invalid under the default 1 % error rate): a failed request is one not
# completed, which the completion-rate cell counts, so up to MAX_ERROR_RATE of them keep the run judged.
MAX_ERROR_RATE = "5%"


def measure(url: str, rate: float, out: Path, profile: Profile, *args: str) -> tuple[dict, dict]:
    p = loadgen("run", WORKLOAD, "--url", url, "--rate", f"{rate:g}/s", "--out", str(out), "--no-calibrate",
                "--quiet", "--max-error-rate", MAX_ERROR_RATE, *RELAXED_SELFCHECK, *args, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    rows = read_run(out).requests
    warm = rows["warmup"].to_numpy() if "warmup" in rows.columns else np.zeros(rows.height, bool)
    return point(rows, warm), in_run_speed(rows, profile)


def in_run_speed(rows, profile: Profile) -> dict:
    """The server's speed during the run, from its own timings of the requests that had it to themselves:
    a prefill (llama.cpp's prompt_ms, ending at the first token) or a decode (predicted_ms per token after
    the first) during which no other request was in flight (between its send and its last token), over what
    the fitted profile says for that prompt alone or that decode at batch 1. Quartiles of those ratios
    (1.1 = 10 % slower than fitted). The speed checks around a run see a few seconds at its edges; this
    sees the whole run (a shift to a 20 % slower phase 100 s into a 150-s run was measured so)."""
    ok = rows.filter(rows["outcome"] == "ok")
    sent, first, last = (ok[c].to_numpy().astype(np.int64) for c in ("sent_ns", "first_token_ns", "last_token_ns"))
    prefill_ms, decode_ms = (ok[c].cast(pl.Float64).to_numpy() for c in ("server_prefill_ms", "server_decode_ms"))
    prompt, output = ok["prompt_tokens"].to_numpy(), ok["output_tokens"].to_numpy()

    index = np.arange(len(sent))

    def alone(i: int, a: int, b: int) -> bool:  # no other request in flight during [a, b]
        return not np.any((index != i) & (sent < b) & (last > a))

    ratios = []
    for i in range(len(sent)):
        if np.isfinite(prefill_ms[i]) and alone(i, int(first[i] - prefill_ms[i] * 1e6), int(first[i])):
            ratios.append(prefill_ms[i] / (model_prefill_s(profile, int(prompt[i])) * 1e3))
        if output[i] > 1 and np.isfinite(decode_ms[i]) and alone(i, int(first[i]), int(last[i])):
            model_ms = profile.decode_ns(1, int(prompt[i] + output[i] // 2)) / 1e6
            ratios.append(decode_ms[i] / (output[i] - 1) / model_ms)
    if not ratios:
        return {"n": 0, "q25": None, "q50": None, "q75": None}
    q = np.percentile(ratios, [25, 50, 75])
    return {"n": len(ratios), "q25": float(q[0]), "q50": float(q[1]), "q75": float(q[2])}


def model_prefill_s(profile: Profile, prompt_tokens: int) -> float:
    # what the profile says the server's own prompt time is: TTFT without the request overhead
    return predicted_ttft_s(profile, prompt_tokens) - profile.request_overhead_us * 1e-6


def min_inside(cells: int, level: float = LEVEL, alpha: float = ALPHA) -> int:
    """The largest k with P(Binomial(cells, level) < k) <= alpha: fewer inside says the intervals are too
    narrow (or the point is off) at that confidence."""
    below, k = 0.0, 0
    while k <= cells:
        p = math.comb(cells, k) * level ** k * (1 - level) ** (cells - k)
        if below + p > alpha:
            return k
        below += p
        k += 1
    return cells


class HostHeld(Exception):
    """The host held the server back where a judgement's premise needs its speed (the message says how)."""


@dataclass
class Twin:
    """A fitted server: `loadgen fit`'s report, the profile and its spread (the round profiles, the misfit)."""
    report: dict
    profile: Profile
    spread: Spread
    waited: float   # the server's compute thread's run-queue wait during the fit


def fit_twin(url: str, waited: Waited, work: Path, *fit_args: str) -> Twin:
    """`loadgen fit` the server: its twin with at least 2 rounds (intervals), else HostHeld when the server
    waited more than FIT_WAITED_MAX of its runnable time for a CPU meanwhile (beside two CPU burners a CPU vLLM
    once kept no round in 130 s, and once could not finish its first in 120 s), or the host's CPUs were busy
    more than HOST_BUSY_MAX of the time (beside two burners and two other suites a CPU vLLM's engine waited 4 %,
    yet no round finished in 120 s, its decode probes lengthened up to 768 tokens: they are lengthened when a
    batch's streams overlap too briefly, which a client and front end that wait for a CPU cause), else an
    AssertionError."""
    out = work / "profile.toml"
    waited.start()
    busy = HostBusy().start()
    p = loadgen("fit", "--url", url, "--out", str(out), "--format", "json", *fit_args, timeout=420)
    share, host = waited.share(), busy.share()
    if p.returncode:
        problem = p.stderr[-3000:]
    else:
        report = orjson.loads(p.stdout)
        profile = load_profile(str(out))
        spread = load_spread(str(out), profile)
        if len(spread.rounds) >= 2:
            return Twin(report, profile, spread, share)
        problem = (f"the fit kept {len(spread.rounds)} complete rounds in {report['probe_s']} s: no intervals; "
                   f"decode probes: " + ", ".join(f"batch {r['batch']} ctx {r['prompt_tokens']} x "
                                                  f"{r['output_tokens']} tokens"
                                                  for r in report["residuals"] if r["kind"] == "decode"))
    seen = (f"the server waited {share:.0%} of its runnable time for a CPU, the host's CPUs were busy "
            + (f"{host:.0%}" if host is not None else "(unknown)") + " of the time")
    if share > FIT_WAITED_MAX or (host is not None and host > HOST_BUSY_MAX):
        raise HostHeld(f"{problem}; {seen}")
    raise AssertionError(f"{problem}; {seen}")


def cover(url: str, waited: Waited, work: Path, twin: Twin, fractions=FRACTIONS, repeats: int = REPEATS,
          run_args: tuple[str, ...] = (), sets: dict | None = None) -> dict:
    """Predict the workload at `fractions` of the twin's capacity with intervals (with `sets`: predict --set,
    what if), measure it `repeats` times round the rates, and count the cells inside (the module's docstring)."""
    profile, spread = with_settings(twin.profile, twin.spread, sets or {})
    capacity = Plan(WORKLOAD, {}).capacity_per_s(profile)
    rates = [float(f"{f * capacity:.2g}") for f in fractions]
    pred = predict(WORKLOAD, profile, rates, spread=spread, level=LEVEL)
    runs, cells = [], []
    for rep in range(repeats):
        for f, r, p in zip(fractions, rates, pred["points"]):
            waited.start()
            meas, in_run = measure(url, r, work / f"rate-{r:g}-run-{rep}", profile, *run_args)
            run = {"rate_per_s": r, "fraction": f, "run": rep, "waited": waited.share(), "in_run": in_run,
                   "keeps_up": {"predicted": p["keeps_up"], "measured": meas["keeps_up"]},
                   "offered_per_s": meas["offered_per_s"], "cells": []}
            figures = ([("completed_per_s", p["completed_per_s"], p["completed_interval_per_s"],
                         meas["completed_per_s"])] if f > 1 else
                       [(f"{m}_{q}_ms", p["latency_ms"][m][q], p["latency_interval_ms"][m][q],
                         meas["latency_ms"][m][q]) for m in METRICS for q in QUANTILES])
            for name, point_v, (lo, hi), got in figures:
                c = {"figure": name, "predicted": point_v, "low": lo, "high": hi, "measured": got,
                     "inside": lo <= got <= hi, "error_rel": (point_v - got) / got, "width_rel": (hi - lo) / point_v}
                run["cells"].append(c)
                cells.append(c)
            runs.append(run)
    inside = sum(c["inside"] for c in cells)
    return {"predicted_capacity_per_s": capacity, "fractions": list(fractions), "level": LEVEL,
            "interval_rounds": len(spread.rounds), "runs": runs, "cells": len(cells), "inside": inside,
            "min_inside": min_inside(len(cells)), "knee": pred["knee"]}


def validate(url: str, server_pid: int, work: Path, fractions=FRACTIONS, repeats: int = REPEATS) -> dict:
    """llama-server's validation: fit it, then cover()."""
    waited = Waited(server_pid)
    twin = fit_twin(url, waited, work)
    return {**summary(twin), **cover(url, waited, work, twin, fractions, repeats)}


def summary(twin: Twin) -> dict:
    return {"fit": {k: twin.report[k] for k in ("form", "rms_rel", "max_abs_rel", "probe_s", "rounds",
                                                 "coefficients_us")}, "fit_waited": twin.waited}


def table(v: dict) -> str:
    f = v["fit"]
    lines = [f"fit: form {f['form']}, residual rms {f['rms_rel']:.1%} max {f['max_abs_rel']:.1%}, {f['rounds']} "
             f"rounds in {f['probe_s']} s, waited {v['fit_waited']:.1%}; capacity "
             f"{v['predicted_capacity_per_s']:.2f}/s, rates {', '.join(f'{x:g}' for x in v['fractions'])} x it; "
             f"{v['level']:.0%} intervals from {v['interval_rounds']} round profiles",
             "rate/s run  figure            predicted [low - high] (width)       measured  error   inside"]
    for r in v["runs"]:
        speed = r["in_run"]
        lines.append(f"{r['rate_per_s']:g}/s run {r['run'] + 1}: keeps up predicted/measured "
                     f"{r['keeps_up']['predicted']}/{r['keeps_up']['measured']}, waited {r['waited']:.0%}, server "
                     + (f"in-run speed {speed['q50']:.2f} ({speed['q25']:.2f}..{speed['q75']:.2f}, n {speed['n']})"
                        if speed["n"] else "in-run speed n 0"))
        for c in r["cells"]:
            lines.append(f"{r['rate_per_s']:6g} {r['run'] + 1:3d}  {c['figure']:<16} {c['predicted']:9.2f} "
                         f"[{c['low']:9.2f} - {c['high']:9.2f}] ({c['width_rel']:4.0%}) {c['measured']:9.2f} "
                         f"{c['error_rel']:+6.0%}   {'yes' if c['inside'] else 'NO'}")
    lines.append(f"coverage: {v['inside']} of {v['cells']} cells inside their {v['level']:.0%} intervals "
                 f"({v['inside'] / v['cells']:.0%}; at least {v['min_inside']} asked: Binomial({v['cells']}, "
                 f"{v['level']:g}) falls below it with probability <= {ALPHA:g})")
    return "\n".join(lines) + "\n"
