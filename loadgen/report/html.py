"""`loadgen report RUN --format html`: one self-contained HTML file (inline CSS and SVG, no script, no
request of any kind) with the run's tables, plots, diagnosis, configuration and validity verdict.

Numbers: every number printed in the page's text and tables is a value of the summary dict (the JSON
report), rendered by tables.show, and carries `data-k="dotted.path"`; text taken verbatim from it (the
diagnosis) carries `data-s`. The plots draw the run's own data (requests/tokens parquet, *.hlog,
server_metrics.parquet, telemetry.parquet, decomposition.parquet), thinned to figures.py's bounds, so the
file stays under SIZE_BOUND_BYTES whatever the run's size.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from html import escape
from pathlib import Path

import orjson
import polars as pl

from loadgen.analysis.decompose import COMPONENTS
from loadgen.analysis.telemetry import GAUGES
from loadgen.report import figures, tables
from loadgen.report.gantt_svg import gantt_chart
from loadgen.report.svg import COMPONENT_COLORS, Bar, Cdf, Series, cdf_chart, line_chart, stacked_bars
from loadgen.results.folder import Run, Summary

SIZE_BOUND_BYTES = 2_000_000
# The stacked bars split decode into its parts (decode = ideal + contention + stalls).
BAR_PARTS = ("send_lag", "connect", "queue", "prefill", "decode_ideal", "decode_contention", "decode_stalls", "other")
# The charts fill the page's width (their viewBox keeps the aspect; width/height attributes are the size without CSS),
# up to the body's max-width: a 1400 px window draws them ~1350 px wide, not at their 760 px drawing size.
CSS = """
body{font-family:sans-serif;margin:24px;max-width:1600px;color:#222}
h1{font-size:20px} h2{font-size:17px;margin-top:28px;border-bottom:1px solid #ddd} h3{font-size:14px;margin:10px 0 4px}
.row{display:flex;gap:28px;flex-wrap:wrap;align-items:flex-start}
table{border-collapse:collapse;margin:8px 0;font-size:13px}
td,th{border:1px solid #ddd;padding:3px 8px;text-align:right} td:first-child,th:first-child{text-align:left}
.verdict{padding:8px 12px;border-radius:4px;font-weight:bold}
.valid{background:#e6f4e6;border:1px solid #8c8} .invalid{background:#fbe9e9;border:1px solid #d88}
.note{color:#666;font-size:12px} svg.plot{display:block;margin:8px 0;width:100%;height:auto}
pre{background:#f6f6f6;padding:8px;font-size:11px;overflow:auto;max-height:400px}
"""


def table_html(t: tables.Table | None, s: Mapping[str, Any]) -> str:
    if t is None:
        return ""
    head = "".join(f"<th>{escape(h)}</th>" for h in t.headers)
    body = []
    for row in t.rows:
        body.append("<tr>" + "".join(_cell(c, s) for c in row) + "</tr>")
    note = f'<p class="note">{escape(t.note)}</p>' if t.note else ""
    return f"<h3>{escape(t.title)}</h3><table><tr>{head}</tr>{''.join(body)}</table>{note}"


def _cell(c: tables.Cell, s: Mapping[str, Any]) -> str:
    if isinstance(c, tables.Key):
        scale = ' data-scale="100"' if c.pct else f' data-scale="{c.scale!r}"' if c.scale != 1.0 else ""
        return f'<td data-k="{escape(c.path)}"{scale}>{escape(tables.text(c, s))}</td>'
    return f"<td>{escape(c)}</td>"


def key_span(s: Mapping[str, Any], path: str) -> str:
    """A summary value inline in text or in an SVG <text> (tspan works in both)."""
    return f'<tspan data-k="{escape(path)}">{escape(tables.show(tables.lookup(s, path)))}</tspan>'


def verdict_html(s: Summary) -> str:
    if s.get("valid"):
        return (f'<p class="verdict valid">Valid run: the generator kept its schedule (status '
                f'<span data-s="run.status">{escape(str(s["run"]["status"]))}</span>).</p>')
    reasons = "".join(f'<li data-s="invalid_reasons.{i}">{escape(r)}</li>'
                      for i, r in enumerate(s["invalid_reasons"]))
    return ('<div class="verdict invalid">INVALID run: its figures do not describe the server, for these reasons:'
            f"<ul>{reasons}</ul></div>")


def diagnosis_html(s: Summary) -> str:
    findings = s.get("diagnosis")
    if findings is None:
        return ""
    if not findings:
        return "<h2>Diagnosis</h2><p>No rule fired (analysis/diagnose.py lists the rules).</p>"
    items = "".join(f'<li><b>{escape(f["rule"])}</b>: <span data-s="diagnosis.{i}.finding">{escape(f["finding"])}'
                    f'</span><br><i>Remedy:</i> <span data-s="diagnosis.{i}.remedy">{escape(f["remedy"])}</span></li>'
                    for i, f in enumerate(findings))
    return f"<h2>Diagnosis</h2><ul>{items}</ul>"


def cdf_section(s: Summary, run: Run) -> str:
    samples = figures.latency_samples(run)
    out = []
    for m, label in (("ttft", "TTFT"), ("itl", "ITL (per token)"), ("e2e", "end-to-end")):
        xs, ps = figures.cdf_points(samples[m])
        if not xs:
            continue
        marks = [(v, f"{q} {key_span(s, f'latency_ms.{m}.{q}')}", "")
                 for q in ("p50", "p99") if (v := s["latency_ms"][m][q]) is not None]
        out.append(cdf_chart(f"CDF of {label}", [Cdf(label, xs, ps, markers=marks)], plot_id=f"cdf-{m}"))
    return "<h2>Latency distributions</h2>" + "".join(out) if out else ""


def over_time_section(run: Run, metrics: pl.DataFrame | None) -> str:
    out: list[str] = []
    lat = []
    per_metric = {m: figures.interval_percentiles(run.path, m) for m in ("ttft", "itl", "e2e")}
    srv, thr = figures.server_series(metrics), figures.throughput(run)
    gpu = figures.telemetry_series(run.telemetry())
    # one time axis for every chart of the section (scrapes may start before t0)
    t_all = [t for ts in (*per_metric.values(), srv, thr, *gpu.values()) if ts is not None for t in ts.t_s]
    x_range = (min([0.0, *t_all]), max([1.0, *t_all]))  # a run killed before its first part has no times
    warm = figures.warmup_span(run)  # shaded and labelled on each chart, not an unexplained zero
    for m, ts in per_metric.items():
        if ts is None or all(v is None for v in ts.values["p99"]):
            continue   # no sample in any interval (a pooling run's ttft and itl): no line, no legend entry
        lat.append(Series(f"{m} p50", ts.t_s, ts.values["p50"], dashed=True))
        lat.append(Series(f"{m} p99", ts.t_s, ts.values["p99"]))
    if lat:
        colors = {"ttft": "#d62728", "itl": "#1f77b4", "e2e": "#2ca02c"}
        for ser in lat:
            ser.color = colors[ser.label.split()[0]]
        out.append(line_chart("Latency over time (per interval of the HdrHistogram logs)", lat, y_kind="log",
                              x_label="s from t0 (interval in which requests finished)", y_label="ms",
                              plot_id="latency-time", x_range=x_range, shade=warm))
    out += telemetry_charts(gpu, x_range, warm)
    if srv is not None:
        counts = [Series(k, srv.t_s, v) for k, v in srv.values.items() if not k.startswith("KV")]
        if counts:
            out.append(line_chart("Server: requests waiting and running (/metrics)", counts, x_label="s from t0",
                                  y_label="requests", plot_id="server-queue",
                                  x_range=x_range, shade=warm))
        if "KV usage %" in srv.values:
            out.append(line_chart("Server: KV cache usage (/metrics)", [Series("KV usage %", srv.t_s,
                                  srv.values["KV usage %"], color="#9467bd")], x_label="s from t0", y_label="%",
                                  plot_id="server-kv", x_range=x_range, shade=warm))
    if thr is not None:
        req = [Series(k, thr.t_s, v, dashed=k.startswith("offered")) for k, v in thr.values.items() if "req" in k]
        out.append(line_chart("Throughput over time: requests", req, x_label="s from t0", y_label="req/s",
                              plot_id="throughput-req", x_range=x_range, shade=warm))
        out.append(line_chart("Throughput over time: output tokens", [Series("output tok/s", thr.t_s,
                              thr.values["output tok/s"], color="#2ca02c")], x_label="s from t0", y_label="tok/s",
                              plot_id="throughput-tok", x_range=x_range, shade=warm))
    return "<h2>Over time</h2>" + "".join(out) if out else ""


def telemetry_charts(gpu: dict[str, figures.TimeSeries], x_range: tuple[float, float],
                     warm: tuple[float, float, str] | None) -> list[str]:
    """A chart per DCGM gauge scraped (--scrape), a line per GPU, under the latency chart on its time axis."""
    out = []
    for gauge in GAUGES:
        ts = gpu.get(gauge.key)
        if ts is None:
            continue
        name, _, unit = gauge.label.rpartition(" ")
        out.append(line_chart(f"GPU telemetry over time: {name} ({gauge.name}, --scrape)",
                              [Series(label, ts.t_s, v) for label, v in ts.values.items()], x_label="s from t0",
                              y_label=unit, plot_id=f"gpu-{gauge.key}", x_range=x_range, shade=warm))
    return out


def decomposition_section(s: Summary, d: pl.DataFrame | None) -> str:
    agg = s.get("decomposition_ms")
    if not agg or not agg.get("n"):
        return ""
    bars = []
    for label, k in tables.DECOMPOSITION_COLUMNS:
        n_path = "decomposition_ms.n" if k == "mean" else f"decomposition_ms.{k}.n"
        bars.append(Bar(label, [(c, agg[k][c], f' data-k="decomposition_ms.{k}.{c}"') for c in BAR_PARTS],
                        note=f" (n {key_span(s, n_path)})"))
    out = ["<h2>Where the time went</h2>", stacked_bars("Decomposition of e2e (mean ms)", bars,
                                                         plot_id="decomposition")]
    bins = s.get("by_prompt_tokens") or []
    if d is not None and d.height and bins:
        per = figures.decomposition_by_bin(d, bins, BAR_PARTS)
        out.append(stacked_bars("Decomposition by prompt length (mean ms per bin)", [
            Bar(f"{b['bin']['prompt_tokens_min']}-{b['bin']['prompt_tokens_max']} tok",
                [(c, b[c], "") for c in BAR_PARTS],
                note=f" (n {key_span(s, f'by_prompt_tokens.{i}.n')})") for i, b in enumerate(per)],
            plot_id="decomposition-by-length"))
    windows = s.get("decomposition_windows") or []
    if len(windows) > 1:
        t = [w["t_s"] for w in windows]
        out.append(line_chart("Decomposition over the run (mean ms per window of send time)",
                              [Series(c, t, [w[c] for w in windows], color=COMPONENT_COLORS[c]) for c in
                               ("queue", "prefill", "decode", "decode_stalls")], x_label="s from t0 (window start)",
                              y_label="ms", plot_id="decomposition-windows"))
    return "".join(out)


def gantt_section(s: Summary, d: pl.DataFrame | None) -> str:
    if d is None or d.height == 0:
        return ""
    rows, prefills = figures.gantt(d)
    return ("<h2>Per-request timeline</h2><p class=\"note\">Consecutive requests around the most-stalled one "
            f"(a sample of the {key_span(s, 'decomposition_ms.n')} decomposed). Purple: a stall, drawn over the "
            "prefill of the request that caused it "
            "(click to jump to that request's row); dashed purple rule: that prefill's first token, joining the "
            "rows it stalled.</p>" + gantt_chart("Send lag / queue / prefill / decode per request", rows, prefills,
                                                 plot_id="gantt"))


def render_run(summary: Summary, run: Run, decomposition: pl.DataFrame | None = None,
               metrics: pl.DataFrame | None = None) -> str:
    s = summary
    title = f"loadgen report: {s['run'].get('name') or Path(str(s['run']['path'])).name}"
    t = tables
    body = [
        f"<h1>{escape(title)}</h1>",
        f'<p class="note">run <span data-s="run.path">{escape(str(s["run"]["path"]))}</span> · target '
        f'<span data-s="run.target">{escape(str(s["run"]["target"]))}</span></p>',
        verdict_html(s),
        '<h2>Summary</h2><div class="row"><div>', table_html(t.overview(s), s), "</div><div>",
        table_html(t.latency(s), s), "</div></div>",
        table_html(t.errors(s), s),
        table_html(t.telemetry(s), s),
        table_html(t.breakdown(s, "by_class"), s), table_html(t.breakdown(s, "by_model"), s),
        diagnosis_html(s),
        cdf_section(s, run),
        decomposition_section(s, decomposition),
        '<div class="row"><div>', table_html(t.decomposition(s, COMPONENTS), s), "</div><div>",
        table_html(t.by_prompt(s), s), table_html(t.server_crosscheck(s), s), "</div></div>",
        gantt_section(s, decomposition),
        over_time_section(run, metrics),
        '<h2>Run</h2><div class="row"><div>', table_html(t.generator(s), s), table_html(t.config_rows(s), s),
        "</div><div>", table_html(t.histograms(s), s), "</div></div>",
    ]
    if isinstance(s.get("config"), dict):
        body.append('<details><summary>Full configuration (summary.json <code>config</code>)</summary>'
                    f'<pre data-json="config">{escape(orjson.dumps(s["config"], option=orjson.OPT_INDENT_2).decode())}'
                    "</pre></details>")
    return page(title, body)


def page(title: str, body: list[str]) -> str:
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{escape(title)}</title><style>{CSS}</style></head><body>" + "".join(body) + "</body></html>\n")
