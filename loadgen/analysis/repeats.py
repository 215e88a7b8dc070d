"""Across-run statistics of a repeated run (`--repeat N`, run/repeat.py): per figure, each run's value,
their mean, sample standard deviation and a 95 % Student-t confidence interval of the mean with N-1
degrees of freedom (repeats.json); and the comparison of two repeated runs by Welch's t on the run means
(`loadgen compare`), which sees what moves *between* runs (the server's state, the host's load), where
the within-run bootstrap (bootstrap.py) sees only the spread between one run's requests.

A figure is one number per run read from that run's own summary.json, so the statistics can be recomputed
from the repeat folders. Student's t quantiles come from the regularized incomplete beta function (a
continued fraction, Lentz's method), inverted by bisection: no scipy.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import orjson

from loadgen.analysis.report_summary import build
from loadgen.results.folder import write_json

SCHEMA_VERSION = 1
REPEATS_JSON = "repeats.json"
CONFIDENCE = 0.95
# (metric, stat, unit, better, where in summary.json): named as compare names them, so --fail-if rules
# ("p99 ttft > +10%", "throughput < -5%") read a repeated comparison as they read a single one
FIGURES: tuple[tuple[str, str, str, str, tuple[str, ...]], ...] = (
    *((m, s, "ms", "lower", ("latency_ms", m, s)) for m in ("ttft", "tpot", "itl", "e2e") for s in ("p50", "p99")),
    ("throughput", "value", "req/s", "higher", ("throughput", "requests_per_s")),
    ("token_throughput", "value", "tok/s", "higher", ("throughput", "output_tokens_per_s")),
    ("goodput", "value", "req/s", "higher", ("goodput", "requests_per_s")),
)


# --- Student's t ---------------------------------------------------------------------------------------
def _betacf(a: float, b: float, x: float) -> float:
    """The continued fraction of the incomplete beta function (modified Lentz), to 1e-15 relative."""
    tiny, qab, qap, qam = 1e-300, a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 10_000):
        m2 = 2 * m
        for aa in (m * (b - m) * x / ((qam + m2) * (a + m2)), -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))):
            d = 1.0 + aa * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + aa / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def betainc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b), 0 <= x <= 1."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with df > 0 degrees of freedom (df need not be whole: Welch's)."""
    tail = 0.5 * betainc(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t > 0 else tail


def t_quantile(p: float, df: float) -> float:
    """The p-quantile of Student's t (0 < p < 1): t_cdf inverted by bisection to 1e-12."""
    if not 0.0 < p < 1.0 or not df > 0:
        raise ValueError(f"t_quantile needs 0 < p < 1 and df > 0, got p={p}, df={df}")
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        hi *= 2.0
    while hi - lo > 1e-12 * max(1.0, hi):
        mid = (lo + hi) / 2.0
        lo, hi = (mid, hi) if t_cdf(mid, df) < p else (lo, mid)
    return (lo + hi) / 2.0


# --- one figure over N runs ----------------------------------------------------------------------------
def spread(values: list[float], confidence: float = CONFIDENCE) -> dict[str, Any]:
    """mean, sample sd (N-1), the t CI of the mean (N-1 df; None with one run) and the CV (sd / mean)."""
    n = len(values)
    if n == 0:
        return {"n": 0, "mean": None, "sd": None, "ci": [None, None], "cv": None}
    mean = sum(values) / n
    if n == 1:
        return {"n": 1, "mean": mean, "sd": None, "ci": [None, None], "cv": None}
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = t_quantile((1 + confidence) / 2, n - 1) * sd / math.sqrt(n)
    return {"n": n, "mean": mean, "sd": sd, "ci": [mean - half, mean + half], "cv": sd / mean if mean else None}


def _at(summary: dict, path: tuple[str, ...]) -> float | None:
    v: Any = summary
    for k in path:
        v = v.get(k) if isinstance(v, dict) else None
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def figures(summaries: list[dict], confidence: float = CONFIDENCE) -> list[dict]:
    """Per figure, each run's value and their spread; a figure some run lacks (goodput without SLOs, a
    latency no request had) lists its values with None and has no statistics."""
    out = []
    for metric, stat, unit, better, path in FIGURES:
        values = [_at(s, path) for s in summaries]
        if all(v is None for v in values):
            continue
        present = [v for v in values if v is not None]
        stats = spread(present, confidence) if len(present) == len(values) else spread([], confidence)
        out.append({"metric": metric, "stat": stat, "unit": unit, "better": better, "values": values, **stats})
    return out


def repeats_record(folder: Path, runs: list[dict], summaries: list[dict], note: str) -> dict:
    """repeats.json: the folder, each run (dir, status, valid), the figures' spread and a note on what the
    repeats share (docs/results.md)."""
    return {"kind": "loadgen-repeats", "schema_version": SCHEMA_VERSION, "path": str(folder),
            "repeats": len(runs), "confidence": CONFIDENCE,
            "interval": f"Student t, {len(runs) - 1} degrees of freedom, over the run values",
            "note": note, "runs": runs, "figures": figures(summaries)}


def is_repeats(path: str | Path) -> bool:
    try:
        return (Path(path) / REPEATS_JSON).is_file()
    except OSError:  # a name the system refuses (too long): not a repeats folder; read_run then says why
        return False


def read(path: str | Path) -> dict:
    return orjson.loads((Path(path) / REPEATS_JSON).read_bytes())


def rebuild(folder: str | Path, opts: Any = None, slo_ms: dict[str, float] | None = None) -> dict:
    """`loadgen report` on a repeats folder: each repeat's summary.json built again (as report builds a
    run's; --slo adds goodput), and repeats.json rewritten from them."""
    folder = Path(folder)
    old = read(folder)
    summaries = [dict(build(folder / r["dir"], opts, slo_ms)[1]) for r in old["runs"]]
    rec = repeats_record(folder, old["runs"], summaries, old["note"])
    write_json(folder / REPEATS_JSON, rec)
    return rec


def to_text(rec: dict) -> str:
    """The across-run table of `loadgen report DIR` on a repeats folder."""
    n = rec["repeats"]
    lines = [f"repeats    {rec['path']}  ({n} runs)", f"note       {rec['note']}"]
    for r in rec["runs"]:
        lines.append(f"  {r['dir']:<12}{r['status']:<12}" + ("" if r["valid"] else "INVALID: " + "; ".join(
            r.get("invalid_reasons") or [])))
    lines += ["", f"{'metric':<18}{'stat':<6}{'unit':<7}{'mean':>10}{'sd':>9}{'cv':>7}  "
                  f"{'95% CI (t, ' + str(n - 1) + ' df)':<22}per run"]
    for f in rec["figures"]:
        ci = "-" if f["ci"][0] is None else f"[{_fmt(f['ci'][0])}, {_fmt(f['ci'][1])}]"
        cv = "-" if f["cv"] is None else f"{f['cv']:.1%}"
        lines.append(f"{f['metric']:<18}{f['stat']:<6}{f['unit']:<7}{_fmt(f['mean']):>10}{_fmt(f['sd']):>9}"
                     f"{cv:>7}  {ci:<22}" + " ".join(_fmt(v) for v in f["values"]))
    return "\n".join(lines) + "\n"


def _fmt(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:.3f}" if abs(v) < 10 else f"{v:.1f}"


# --- two repeated runs: Welch's t on the run means -----------------------------------------------------
def welch(a: list[float], b: list[float], confidence: float = CONFIDENCE) -> dict[str, Any]:
    """Welch's unequal-variance t on two samples of run values (each >= 2): the difference of the means
    (B - A), its CI, t, the Welch-Satterthwaite df and the two-sided p. A zero variance on both sides gives
    an exact difference (CI of zero width)."""
    ma, mb = sum(a) / len(a), sum(b) / len(b)
    va = sum((x - ma) ** 2 for x in a) / (len(a) - 1) / len(a)
    vb = sum((x - mb) ** 2 for x in b) / (len(b) - 1) / len(b)
    diff, se = mb - ma, math.sqrt(va + vb)
    if se == 0:
        return {"diff": diff, "diff_ci": [diff, diff], "t": None, "df": None, "p": 0.0 if diff else 1.0}
    df = (va + vb) ** 2 / ((va ** 2 / (len(a) - 1) if va else 0.0) + (vb ** 2 / (len(b) - 1) if vb else 0.0))
    t = diff / se
    half = t_quantile((1 + confidence) / 2, df) * se
    return {"diff": diff, "diff_ci": [diff - half, diff + half], "t": t, "df": df,
            "p": 2.0 * (1.0 - t_cdf(abs(t), df))}


def single_vs_repeats(repeated: list[float], single: float, confidence: float = CONFIDENCE) -> dict[str, Any]:
    """One run against N >= 2 repeats: the single run is assumed to vary from run to run as the repeated
    side does (its sd, N-1 df), so B - A has the standard error sd * sqrt(1 + 1/N) (a prediction interval).
    Returned as (single - mean of the repeats)."""
    n = len(repeated)
    m = sum(repeated) / n
    sd = math.sqrt(sum((x - m) ** 2 for x in repeated) / (n - 1))
    diff, se = single - m, sd * math.sqrt(1 + 1 / n)
    if se == 0:
        return {"diff": diff, "diff_ci": [diff, diff], "t": None, "df": n - 1, "p": 0.0 if diff else 1.0}
    half = t_quantile((1 + confidence) / 2, n - 1) * se
    t = diff / se
    return {"diff": diff, "diff_ci": [diff - half, diff + half], "t": t, "df": n - 1,
            "p": 2.0 * (1.0 - t_cdf(abs(t), n - 1))}


# --- what `loadgen compare` reads of a side ------------------------------------------------------------
def side(path: str | Path, slo_ms: dict[str, float] | None = None) -> dict[str, Any]:
    """A compare input as run values: {"repeated": bool, "runs": [folder], "manifests": [manifest],
    "values": {(metric, stat): [one value per run]}}. A repeats folder gives each repeat's summary.json
    (built again when missing, or when slo_ms asks for goodput); a results folder is one run."""
    p = Path(path)
    folders = [p / r["dir"] for r in read(p)["runs"]] if is_repeats(p) else [p]
    summaries = []
    for f in folders:
        s_path = f / "summary.json"
        cached = orjson.loads(s_path.read_bytes()) if s_path.is_file() else None
        if cached is None or (slo_ms and not cached.get("goodput")) or not is_repeats(p):
            cached = dict(build(f, None, slo_ms, write=False)[1])  # a single run: as compare reads it
        summaries.append(cached)
    values = {(m, s): [_at(x, where) for x in summaries] for m, s, _, _, where in FIGURES}
    return {"repeated": is_repeats(p), "runs": [str(f) for f in folders],
            "manifests": [orjson.loads((f / "manifest.json").read_bytes()) for f in folders],
            "values": {k: v for k, v in values.items() if all(x is not None for x in v)}}
