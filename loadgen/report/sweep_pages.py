"""HTML and Markdown pages of a sweep (`sweep_summary.json`) and of a comparison (`loadgen compare --format
json`), both as documented in docs/sweep-and-compare.md. A thin layer over the run report's pieces: the
same table specifications (tables.py, numbers rendered from the dict and tagged with their path), the same
charts (svg.py: curves against the rate, confidence bands, overlaid CDFs, forest plot of relative changes).

`loadgen report PATH --format html|md` picks the page by what PATH is: a results folder (the run report),
a sweep folder (holding sweep_summary.json) or a sweep_summary.json, or a compare JSON file.
Every key is read with .get: a missing block is left out, never invented.
"""
from __future__ import annotations

from html import escape
from pathlib import Path

from loadgen.analysis.compare import REASON_SHORT
from loadgen.errors import InputError
from loadgen.report import tables
from loadgen.report.html import key_span, page, table_html
from loadgen.report.markdown import code, inert, table_md
from loadgen.report.svg import COMPONENT_COLORS, PALETTE, Cdf, Series, cdf_chart, interval_chart, line_chart
from loadgen.report import figures
from loadgen.results.folder import ResultsError, read_run

Key = tables.Key
LAT = ("ttft", "tpot", "itl", "e2e")
VERDICT_COLORS = {"better": "#2ca02c", "worse": "#d62728", "indistinguishable": "#7f7f7f"}


def kind_of(d: dict) -> str | None:
    return {"loadgen-sweep-summary": "sweep", "loadgen-compare": "compare"}.get(d.get("kind", ""))


# --- sweep -------------------------------------------------------------------------------------------------

def sweep_table(d: dict) -> tables.Table:
    cols = [("rate (req/s)", "rate_per_s"), ("status", "status"), ("offered", "offered_per_s"),
            ("completed", "completed_per_s"), ("TTFT p50", "latency_ms.ttft.p50"), ("TTFT p99", "latency_ms.ttft.p99"),
            ("TPOT p99", "latency_ms.tpot.p99"), ("e2e p99", "latency_ms.e2e.p99"),
            ("tok/s", "throughput.output_tokens_per_s"), ("keeps up", "keeps_up")]
    if any(p.get("prefix_cache_hit_rate") is not None for p in d.get("points", [])):
        cols.append(("prefix-cache hits", "prefix_cache_hit_rate"))  # analysis/prefix_cache.py
    if any(p.get("goodput") for p in d.get("points", [])):
        cols += [("goodput", "goodput.requests_per_s"), ("attainment", "goodput.attainment")]
    rows: list[list[tables.Cell]] = []
    for i, p in enumerate(d.get("points", [])):
        row: list[tables.Cell] = []
        for _, path in cols:
            try:
                tables.lookup(p, path)
                row.append(Key(f"points.{i}.{path}"))
            except (KeyError, IndexError, TypeError):
                row.append("-")
        rows.append(row)
    return tables.Table("Points (latency ms, rates req/s)", [c for c, _ in cols], rows)


SPREAD = (("TTFT p99", "ttft", "p99"), ("TPOT p50", "tpot", "p50"), ("e2e p99", "e2e", "p99"),
          ("throughput", "throughput", "value"))


def spread_table(d: dict) -> tables.Table | None:
    """sweep --repeat N: each point's spread over its repeats (the points table shows their means): per
    figure the sd and the Student-t 95 % CI of the mean (repeats.json's)."""
    pts = [(i, p) for i, p in enumerate(d.get("points", [])) if p.get("repeats")]
    if not pts:
        return None
    rows: list[list[tables.Cell]] = []
    for i, p in pts:
        figs = [(f["metric"], f["stat"]) for f in p["repeats"]["figures"]]
        row: list[tables.Cell] = [Key(f"points.{i}.rate_per_s"), Key(f"points.{i}.repeats.n")]
        for _, m, st in SPREAD:
            j = figs.index((m, st)) if (m, st) in figs else None
            row += (["-", "-"] if j is None else [Key(f"points.{i}.repeats.figures.{j}.sd"),
                                                  Key(f"points.{i}.repeats.figures.{j}.ci")])
        rows.append(row)
    headers = ["rate (req/s)", "repeats"] + [h for label, _, _ in SPREAD for h in (f"{label} sd", f"{label} 95% CI")]
    return tables.Table("Spread over the repeats (Student t, N-1 df; the points above are their means)", headers,
                        rows)


KNEE_ROWS = (("knee", "knee (req/s)", "rate_per_s"), ("knee", "first saturated (req/s)", "first_saturated_per_s"),
             ("knee", "TTFT knee (req/s)", "ttft_knee_per_s"),
             ("knee", "low-load TTFT p99 (ms)", "low_load_ttft_p99_ms"),
             ("max_goodput", "max goodput at (req/s)", "rate_per_s"),
             ("max_goodput", "goodput (req/s)", "goodput_per_s"), ("max_goodput", "attainment", "attainment"),
             ("search", "points", "points"), ("search", "resolution (relative)", "resolution_rel"))


def knee_table(d: dict) -> tables.Table | None:
    rows: list[list[tables.Cell]] = [[label, Key(f"{block}.{k}")] for block, label, k in KNEE_ROWS
                                     if k in (d.get(block) or {})]
    return tables.Table("Saturation", ["", "value"], rows) if rows else None


def _curve(d: dict, path: str) -> tuple[list[float], list[float | None]]:
    xs, ys = [], []
    for p in d.get("points", []):
        try:
            v = tables.lookup(p, path)
        except (KeyError, IndexError, TypeError):
            v = None
        xs.append(p["rate_per_s"])
        ys.append(v)
    return xs, ys


def _knee_marker(d: dict) -> list[tuple[float, str, str]]:
    k = (d.get("knee") or {}).get("rate_per_s")
    return [(k, f"knee {key_span(d, 'knee.rate_per_s')}/s", "#444")] if k else []


def predicted(pred: dict | None, m: str, q: str, color: str | None) -> list[Series]:
    """`loadgen predict --format json`'s curve of latency_ms.m.q over its rates, with its interval as the
    band where it has one (docs/twin.md); [] without a prediction or that metric."""
    pts = sorted(pred["points"], key=lambda p: p["rate_per_s"]) if pred else []
    if not pred or not pts or m not in pts[0].get("latency_ms", {}):
        return []
    bands = [(p.get("latency_interval_ms") or {}).get(m, {}).get(q) for p in pts]
    band = ([b and b[0] for b in bands], [b and b[1] for b in bands]) if any(bands) else None
    return [Series(f"predicted {m} {q}", [p["rate_per_s"] for p in pts], [p["latency_ms"][m][q] for p in pts],
                   color=color, band=band, dashed=q == "p50", title=f"loadgen predict, profile {pred.get('profile')}"
                   + (f", {pred['interval']['level']:.0%} interval" if pred.get("interval") else ""))]


def sweep_html(d: dict, prediction: dict | None = None) -> str:
    """The sweep's page; with a prediction (`loadgen predict --format json` of the same workload), its
    curves and intervals over the measured ones."""
    sw = d.get("sweep", {})
    marks = _knee_marker(d)
    cap = ((prediction or {}).get("knee") or {}).get("capacity_per_s")
    if cap:
        marks.append((cap, "predicted capacity", "#999"))
    charts = []
    lat = []
    for i, m in enumerate(("ttft", "e2e")):
        for q, dashed in (("p50", True), ("p99", False)):
            xs, ys = _curve(d, f"latency_ms.{m}.{q}")
            lat.append(Series(f"{m} {q}", xs, ys, color=PALETTE[i], dashed=dashed, points=True))
            lat += predicted(prediction, m, q, PALETTE[4 + i])
    charts.append(line_chart("Latency vs rate", lat, y_kind="log", x_label="rate (req/s)", y_label="ms",
                             plot_id="sweep-latency", markers=marks))
    tok = []
    for i, m in enumerate(("tpot", "itl")):
        for q, dashed in (("p50", True), ("p99", False)):
            xs, ys = _curve(d, f"latency_ms.{m}.{q}")
            tok.append(Series(f"{m} {q}", xs, ys, color=PALETTE[2 + i], dashed=dashed, points=True))
            tok += predicted(prediction, m, q, PALETTE[6 + i])
    charts.append(line_chart("Per-token latency vs rate", tok, x_label="rate (req/s)", y_label="ms",
                             plot_id="sweep-tpot", markers=marks))
    xs, offered = _curve(d, "offered_per_s")
    # a point cannot complete more than it was offered (metrics.steady_rates clips it; an older summary or a
    # prediction may not): the completed curve is drawn no higher than the offered one
    completed = [c if c is None or o is None else min(c, o) for c, o in zip(_curve(d, "completed_per_s")[1], offered)]
    thr = [Series("offered", xs, offered, dashed=True, points=True),
           Series("completed", xs, completed, points=True)]
    if any(p.get("goodput") for p in d.get("points", [])):
        thr.append(Series("goodput", *_curve(d, "goodput.requests_per_s"), points=True))
    charts.append(line_chart("Throughput and goodput vs rate", thr, x_label="rate (req/s)", y_label="req/s",
                             plot_id="sweep-throughput", markers=marks))
    charts.append(line_chart("Output tokens/s vs rate", [Series("output tok/s", *_curve(
        d, "throughput.output_tokens_per_s"), points=True, color=PALETTE[2])], x_label="rate (req/s)",
        y_label="tok/s", plot_id="sweep-tokens", markers=marks))
    comps = ("queue", "prefill", "decode", "decode_stalls", "send_lag")
    charts.append(line_chart("Decomposition vs rate (mean ms)", [
        Series(c, *_curve(d, f"decomposition_mean_ms.{c}"), color=COMPONENT_COLORS[c], points=True)
        for c in comps], x_label="rate (req/s)", y_label="ms", plot_id="sweep-decomposition", markers=marks))
    slo = d.get("slo")
    body = [f"<h1>loadgen sweep: {escape(str(sw.get('workload')))}</h1>",
            f'<p class="note">folder <span data-s="sweep.path">{escape(str(sw.get("path")))}</span> · mode '
            f'<span data-s="sweep.mode">{escape(str(sw.get("mode")))}</span> · status '
            f'<span data-s="sweep.status">{escape(str(sw.get("status")))}</span></p>',
            table_html(knee_table(d), d),
            "<p class=\"note\">SLOs: " + (", ".join(f'{escape(k)} <span data-k="slo.{escape(k)}">'
                                                   f'{escape(tables.show(v))}</span>' for k, v in slo.items())
                                         if slo else "none") + "</p>",
            "".join(charts), table_html(sweep_table(d), d)]
    if spread_table(d) is not None:
        body.append(table_html(spread_table(d), d))
    return page(f"loadgen sweep: {sw.get('workload')}", body)


def sweep_md(d: dict) -> str:
    sw = d.get("sweep", {})
    lines = [f"### loadgen sweep: {inert(sw.get('workload'))}", "", f"{code(sw.get('path'))} · mode "
             f"{inert(sw.get('mode'))} · status {inert(sw.get('status'))}", ""]
    lines += table_md(knee_table(d), d) + table_md(sweep_table(d), d)
    if spread_table(d) is not None:
        lines += table_md(spread_table(d), d)
    return "\n".join(lines).rstrip() + "\n"


# --- compare -----------------------------------------------------------------------------------------------

def _label(m: dict) -> str:
    return str(m.get("metric")) if m.get("stat") == "value" else f"{m.get('stat')} {m.get('metric')}"


def metrics_table(c: dict, i: int) -> tables.Table:
    """All metrics of comparison i; for a sweep comparison one block of rows per rate (first column)."""
    sweep = c.get("kind") == "sweep"
    blocks = ([(f"comparisons.{i}.points.{j}", p.get("metrics", [])) for j, p in enumerate(c.get("points", []))]
              if sweep else [(f"comparisons.{i}", c.get("metrics", []))])
    rows: list[list[tables.Cell]] = []
    for base, metrics in blocks:
        for j, m in enumerate(metrics):
            p = f"{base}.metrics.{j}"
            rows.append([*([Key(f"{base}.rate_per_s")] if sweep else []),
                         f"{_label(m)} ({m.get('unit', '')})", Key(f"{p}.a"), Key(f"{p}.a_ci"),
                         Key(f"{p}.b"), Key(f"{p}.b_ci"), Key(f"{p}.rel", pct=True), Key(f"{p}.rel_ci", pct=True),
                         Key(f"{p}.verdict"), ", ".join(REASON_SHORT.get(r, r) for r in m.get("reasons") or [])])
    return tables.Table("Metrics", [*(["rate (req/s)"] if sweep else []), "metric", "A", "A CI", "B", "B CI",
                                    "change", "change CI", "verdict", "why"], rows)


def _forest(metrics: list[dict], title: str, plot_id: str) -> str:
    # relative changes (fractions) drawn in % on the axis
    rows = [(_label(m), m["rel"] * 100,
             [x * 100 for x in m["rel_ci"]] if m.get("rel_ci") and None not in m["rel_ci"] else None,
             VERDICT_COLORS.get(m.get("verdict", ""), "#444"), "") for m in metrics if m.get("rel") is not None]
    if not rows:
        return ""
    return interval_chart(title, rows, x_label="change of B from A (%), confidence interval", plot_id=plot_id)


def _overlaid_cdfs(c: dict, i: int) -> str:
    """The two runs' CDFs, overlaid, when their results folders are still readable (not part of the JSON)."""

    try:
        runs = [read_run(c["a"]), read_run(c["b"])]
    except (ResultsError, KeyError, OSError):
        return ""
    samples = [figures.latency_samples(r) for r in runs]
    out = []
    for m, label in (("ttft", "TTFT"), ("itl", "ITL"), ("e2e", "e2e")):
        cdfs = [Cdf(f"{'AB'[k]}: {Path(str(c['ab'[k]])).name}", *figures.cdf_points(s[m]), color=PALETTE[k])
                for k, s in enumerate(samples)]
        out.append(cdf_chart(f"CDF of {label}: A and B overlaid", cdfs, plot_id=f"compare-{i}-cdf-{m}"))
    return "".join(out)


def _sweep_curves(c: dict, i: int) -> str:
    """Per metric of a sweep comparison: A's and B's curves against the rate with their confidence bands."""
    by_metric: dict[tuple[str, str], dict[str, list]] = {}
    units: dict[tuple[str, str], str] = {}
    for p in c.get("points", []):
        for m in p.get("metrics", []):
            key = (m.get("metric"), m.get("stat"))
            e = by_metric.setdefault(key, {"x": [], "a": [], "b": [], "a_ci": [], "b_ci": []})
            units.setdefault(key, m.get("unit", ""))
            e["x"].append(p["rate_per_s"])
            for k in ("a", "b"):
                e[k].append(m.get(k))
                e[k + "_ci"].append(m.get(k + "_ci") or [None, None])
    out = []
    for (metric, stat), e in by_metric.items():
        if metric not in (*LAT, "throughput", "goodput") or stat not in ("p99", "value", "p50"):
            continue
        series = [Series(f"{k.upper()}", e["x"], e[k], color=PALETTE[n], points=True,
                         band=([ci[0] for ci in e[k + "_ci"]], [ci[1] for ci in e[k + "_ci"]]))
                  for n, k in enumerate(("a", "b"))]
        out.append(line_chart(f"{stat} {metric} vs rate: A and B with confidence bands", series, x_label="rate (req/s)",
                              y_label=units[(metric, stat)], plot_id=f"compare-{i}-{metric}-{stat}"))
    return "".join(out)


def _invalid_html(d: dict) -> str:
    """The banner at the top of the page: each invalid or interrupted input, with its reasons."""
    bad = d.get("invalid_inputs") or []
    if not bad:
        return ""
    items = []
    for j, x in enumerate(bad):
        at = (f' (point <span data-k="invalid_inputs.{j}.rate_per_s">{escape(tables.show(x["rate_per_s"]))}</span>'
              "/s)" if x.get("rate_per_s") is not None else "")
        reasons = "; ".join(f'<span data-s="invalid_inputs.{j}.invalid_reasons.{k}">{escape(str(r))}</span>'
                            for k, r in enumerate(x.get("invalid_reasons") or []))
        items.append(f'<li>{escape(str(x.get("side")))} <span data-s="invalid_inputs.{j}.run">'
                     f'{escape(str(x.get("run")))}</span>{at} is <span data-s="invalid_inputs.{j}.status">'
                     f'{escape(str(x.get("status")))}</span>: {reasons}</li>')
    gate = ("<p>The --fail-if rules were not evaluated (--allow-invalid evaluates them).</p>"
            if d.get("rules_not_evaluated") else "")
    return f'<div class="verdict invalid">INVALID INPUT: its numbers do not describe the asked work.<ul>' \
           f'{"".join(items)}</ul>{gate}</div>'


def _invalid_md(d: dict) -> list[str]:
    lines = []
    for x in d.get("invalid_inputs") or []:
        at = f" (point {tables.show(x['rate_per_s'])}/s)" if x.get("rate_per_s") is not None else ""
        lines.append(f"**INVALID INPUT**: {inert(x.get('side'))} {code(x.get('run'))}{at} is "
                     f"{inert(x.get('status'))}: " + "; ".join(inert(r) for r in x.get("invalid_reasons") or []))
    if d.get("rules_not_evaluated"):
        lines.append("The --fail-if rules were not evaluated (--allow-invalid evaluates them).")
    return [*lines, ""] if lines else []


def compare_html(d: dict, *, read_runs: bool = True) -> str:
    body = [_invalid_html(d), f"<h1>loadgen compare: baseline {escape(str(d.get('baseline')))}</h1>"]
    method = d.get("method") or {}
    body.append(f'<p class="note"><span data-s="method.resampling">{escape(str(method.get("resampling", "")))}'
                '</span> · '
                f'<span data-k="method.resamples">{escape(tables.show(method.get("resamples")))}</span> resamples · '
                f'confidence <span data-k="method.confidence">{escape(tables.show(method.get("confidence")))}</span>'
                f' · percentiles {escape(str(method.get("percentiles", "")))}</p>')
    failed = d.get("failed_rules") or []
    if failed:
        body.append('<div class="verdict invalid">Failed rules:<ul>' + "".join(
            f'<li data-s="failed_rules.{j}">{escape(r)}</li>' for j, r in enumerate(failed)) + "</ul></div>")
    for i, c in enumerate(d.get("comparisons", [])):
        body.append(f'<h2>B <span data-s="comparisons.{i}.b">{escape(str(c.get("b")))}</span> vs A '
                    f'<span data-s="comparisons.{i}.a">{escape(str(c.get("a")))}</span></h2>')
        diffs = (c.get("same_work") or {}).get("differences") or []
        if diffs:
            body.append('<p class="verdict invalid">Not the same work: ' + ", ".join(
                f'<span data-s="comparisons.{i}.same_work.differences.{j}.field">{escape(str(x.get("field")))}'
                "</span>" for j, x in enumerate(diffs)) + "</p>")
        if c.get("variance"):  # a repeated input (--repeat): which variance judged the changes
            body.append(f'<p class="note">variance: <span data-s="comparisons.{i}.variance">'
                        f'{escape(str(c["variance"]))}</span></p>')
        floor = c.get("noise_floor") or {}
        if floor:
            body.append(f'<p class="note">noise floor <span data-k="comparisons.{i}.noise_floor.ms">'
                        f'{escape(tables.show(floor.get("ms")))}</span> ms: <span data-s="comparisons.{i}.'
                        f'noise_floor.source">{escape(str(floor.get("source")))}</span></p>')
        if c.get("kind") == "sweep":
            body.append(_sweep_curves(c, i))
        else:
            body.append(_forest(c.get("metrics", []), "Relative change of B from A", f"compare-{i}-forest"))
            if read_runs:
                body.append(_overlaid_cdfs(c, i))
        body.append(table_html(metrics_table(c, i), d))
        if c.get("ttft_cause"):   # compare.ttft_cause: what moved TTFT, from the decomposition
            body.append(f'<p class="note">Cause of the TTFT change: <span data-s="comparisons.{i}.ttft_cause.why">'
                        f'{escape(c["ttft_cause"]["why"])}</span></p>')
        rules = c.get("fail_if") or []
        if rules:
            state = {None: "not evaluated", True: "HELD", False: "not held"}
            body.append("<ul>" + "".join(f'<li><span data-s="comparisons.{i}.fail_if.{j}.rule">{escape(r["rule"])}'
                                         f'</span>: {state[r.get("held")]}</li>'
                                         for j, r in enumerate(rules)) + "</ul>")
    return page(f"loadgen compare: {d.get('baseline')}", body)


def compare_md(d: dict) -> str:
    lines = _invalid_md(d) + [f"### loadgen compare: baseline {code(d.get('baseline'))}", ""]
    lines += [f"- **FAILED** {inert(r)}" for r in d.get("failed_rules") or []]
    for i, c in enumerate(d.get("comparisons", [])):
        lines += ["", f"**B {code(c.get('b'))} vs A {code(c.get('a'))}**", ""]
        diffs = (c.get("same_work") or {}).get("differences") or []
        if diffs:
            lines += ["Not the same work: " + ", ".join(inert(x.get("field")) for x in diffs), ""]
        if c.get("variance"):
            lines += [f"variance: {c['variance']}", ""]
        lines += table_md(metrics_table(c, i), d)
        if c.get("ttft_cause"):
            lines += ["", f"Cause of the TTFT change: {c['ttft_cause']['why']}"]
    return "\n".join(lines).rstrip() + "\n"


def render(d: dict, fmt: str, prediction: dict | None = None) -> str:
    kind = kind_of(d)
    if prediction is not None and (kind, fmt) != ("sweep", "html"):
        raise InputError([f"--prediction: drawn on a sweep's HTML page only, not on a {kind}'s {fmt} page"])
    if kind == "sweep":
        return sweep_html(d, prediction) if fmt == "html" else sweep_md(d)
    return compare_html(d) if fmt == "html" else compare_md(d)
