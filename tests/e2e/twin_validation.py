"""Validation of the twin (docs/twin.md) against a live llama-server: `loadgen fit` it, `loadgen predict`
the mixed workload (twin_mixed.toml) at each rate, `loadgen run` the same plan (same seed) against it,
and compare per metric and rate. Used by tests/e2e/test_twin.py and `make bench` (bench_twin.py).

Errors are relative: (predicted - measured) / measured. The knee, measured: each rate either keeps up
(completion rate within 5 % of offered, the sweep's rule) or not; the capacity is the completion rate at
a rate past the knee, predicted and measured on the same plan. Below the knee = the rates that keep up in
both.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import orjson

from loadgen.predict import Plan, point
from loadgen.results import read_run
from loadgen.sim.profiles import load_profile
from tests.integration.conftest import RELAXED_SELFCHECK, loadgen

WORKLOAD = str(Path(__file__).with_name("twin_mixed.toml"))
RATES = (1.0, 2.5, 6.0)
METRICS = ("ttft", "tpot", "e2e")


def fit(url: str, out: Path) -> dict:
    p = loadgen("fit", "--url", url, "--out", str(out), "--format", "json", timeout=180)
    assert p.returncode == 0, p.stderr[-3000:]
    return orjson.loads(p.stdout)


# The measurement keeps running when the host parks the client now and then (send lag is a client fault the
# self-check flags, not what the twin is judged on): the table still shows what the server did.
def measure(url: str, rate: float, out: Path) -> dict:
    p = loadgen("run", WORKLOAD, "--url", url, "--rate", f"{rate:g}/s", "--out", str(out), "--no-calibrate",
                "--quiet", *RELAXED_SELFCHECK, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    rows = read_run(out).requests
    return point(rows, rows["warmup"].to_numpy() if "warmup" in rows.columns else np.zeros(rows.height, bool))


def validate(url: str, work: Path, rates=RATES) -> dict:
    fitted = fit(url, work / "profile.toml")
    profile = load_profile(str(work / "profile.toml"))
    plan = Plan(WORKLOAD, {})
    rows = []
    for r in rates:
        pred = plan.run(profile, r)
        meas = measure(url, r, work / f"rate-{r:g}")
        row = {"rate_per_s": r, "offered_per_s": meas["offered_per_s"],
               "keeps_up": {"predicted": pred["keeps_up"], "measured": meas["keeps_up"]},
               "completed_per_s": {"predicted": pred["completed_per_s"], "measured": meas["completed_per_s"]}}
        for m in METRICS:
            for q in ("p50", "p99"):
                a, b = pred["latency_ms"][m][q], meas["latency_ms"][m][q]
                row[f"{m}_{q}"] = {"predicted_ms": a, "measured_ms": b, "error_rel": (a - b) / b}
        rows.append(row)
    # the same probes again: how far the server's speed moved while it was measured (a shared machine)
    again = fit(url, work / "profile-after.toml")
    before = {_key(r): r["measured_ms"] for r in fitted["residuals"]}
    drift = sorted(r["measured_ms"] / before[_key(r)] - 1 for r in again["residuals"] if _key(r) in before)
    past = [x for x in rows if not x["keeps_up"]["measured"]]
    cap = None
    if past:
        c = past[-1]["completed_per_s"]
        cap = {"rate_per_s": past[-1]["rate_per_s"], "predicted_per_s": c["predicted"], "measured_per_s": c["measured"],
               "error_rel": (c["predicted"] - c["measured"]) / c["measured"]}
    return {"fit": {k: fitted[k] for k in ("form", "rms_rel", "max_abs_rel", "probe_s", "rounds", "coefficients_us")},
            "points": rows, "capacity": cap,
            "drift": {"median_rel": drift[len(drift) // 2], "min_rel": drift[0], "max_rel": drift[-1],
                      "rule": "each probe's time in a second fit after the runs / in the first, minus 1"}}


def _key(r: dict) -> tuple:
    return r["kind"], r.get("batch"), r["prompt_tokens"]


def table(v: dict) -> str:
    f = v["fit"]
    head = " ".join(f"{m + ' ' + q:>22}" for m in METRICS for q in ("p50", "p99"))
    lines = [f"fit: form {f['form']}, residual rms {f['rms_rel']:.1%} max {f['max_abs_rel']:.1%}, "
             f"{f['rounds']} rounds in {f['probe_s']} s",
             "predicted/measured ms (error)",
             f"{'rate/s':>6} {'keeps up p/m':>12}  {head}"]
    for x in v["points"]:
        k = x["keeps_up"]
        cells = []
        for m in METRICS:
            for q in ("p50", "p99"):
                c = x[f"{m}_{q}"]
                cells.append(f"{c['predicted_ms']:7.1f}/{c['measured_ms']:7.1f} {c['error_rel']:+5.0%}")
        up = ("yes" if k["predicted"] else "NO") + "/" + ("yes" if k["measured"] else "NO")
        lines.append(f"{x['rate_per_s']:6g} {up:>12}  " + " ".join(f"{c:>22}" for c in cells))
    c = v["capacity"]
    d = v["drift"]
    lines.append(f"server speed drift during the runs (probe times, second fit vs first): "
                 f"median {d['median_rel']:+.0%}, "
                 f"range {d['min_rel']:+.0%}..{d['max_rel']:+.0%}")
    lines.append("capacity (completion rate past the knee): " + (
        f"predicted {c['predicted_per_s']:.2f}/s, measured {c['measured_per_s']:.2f}/s at {c['rate_per_s']:g}/s "
        f"offered ({c['error_rel']:+.1%})" if c else "no rate was past the knee"))
    return "\n".join(lines) + "\n"
