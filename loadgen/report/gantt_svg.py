"""The per-request timeline: one row per request, its send lag / connect / queue / prefill / decode as
coloured segments on a time axis (s from t0), stalls marked where the prefill that caused them ran.

A stall mark is a purple band on the stalled request's decode segment over the causing request's prefill
interval; it links (`<a href="#g-ID">`) to the causing request's row when that row is in the sample, and
a dashed purple rule at the cause's first token joins its row to the rows it stalled.
"""
from __future__ import annotations

from html import escape

from loadgen.report import figures
from loadgen.report.svg import COMPONENT_COLORS, MARGIN, Canvas, Scale, extent, ticks

ROW_H = 11
STALL_COLOR = "#9467bd"


def _f(v: float) -> str:
    return f"{v:.1f}"


def _anchor(request_id: str) -> str:
    return "g-" + "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in request_id)


def gantt_chart(title: str, rows: list[figures.GanttRow], prefills: dict[str, tuple[float, float]], *,
                width: int = 980, max_marks: int = figures.GANTT_MARKS, plot_id: str = "") -> str:
    top, bottom, label_w = 34, 46, 150
    height = top + bottom + ROW_H * max(1, len(rows))
    lo = min((s[1] for r in rows for s in r.segments), default=0.0)
    hi = max((s[2] for r in rows for s in r.segments), default=1.0)
    x_range = extent("lin", [lo, hi])
    x = Scale("lin", *x_range, label_w, width - MARGIN[1])
    y = Scale("lin", 0.0, float(max(1, len(rows))), top, height - bottom)
    c = Canvas(title, x, y, width=width, height=height, x_label="s from t0", plot_id=plot_id)
    c.axes(ticks("lin", *x_range), [])
    index = {r.request_id: i for i, r in enumerate(rows)}
    p = c.parts
    for i, r in enumerate(rows):
        y0 = y(i) + 1
        label = r.request_id if r.prompt_tokens is None else f"{r.request_id} ({r.prompt_tokens} tok)"
        p.append(f'<text id="{_anchor(r.request_id)}" x="{label_w - 4}" y="{_f(y0 + ROW_H - 3)}" '
                 f'text-anchor="end" font-size="9">{escape(label)}</text>')
        for comp, a, b in r.segments:
            p.append(f'<rect class="mark seg" x="{_f(x(a))}" y="{_f(y0)}" width="{max(0.6, x(b) - x(a)):.1f}" '
                     f'height="{ROW_H - 2}" fill="{COMPONENT_COLORS[comp]}"><title>{escape(r.request_id)} '
                     f'{comp}: {(b - a) * 1e3:.1f} ms</title></rect>')
    marks = 0
    for i, r in enumerate(rows):
        decode = next((s for s in r.segments if s[0] == "decode"), None)
        if decode is None:
            continue
        for cause in r.stall_causes:
            if cause not in prefills or marks >= max_marks:
                continue
            a, b = max(prefills[cause][0], decode[1]), min(prefills[cause][1], decode[2])
            if b <= a:
                continue
            marks += 1
            where = "" if cause in index else " (not in this sample)"
            mark = (f'<rect class="mark stall" x="{_f(x(a))}" y="{_f(y(i) + 1)}" width="{max(1.5, x(b) - x(a)):.1f}" '
                    f'height="{ROW_H - 2}" fill="{STALL_COLOR}" fill-opacity="0.85">'
                    f'<title>{escape(r.request_id)} stalled by the prefill of {escape(cause)}{where}</title></rect>')
            p.append(f'<a href="#{_anchor(cause)}">{mark}</a>' if cause in index else mark)
    for cause, (_, first) in prefills.items():
        if cause not in index:
            continue
        stalled = [i for i, r in enumerate(rows) if cause in r.stall_causes]
        if not stalled:
            continue
        ys = [y(i) + ROW_H / 2 for i in (*stalled, index[cause])]
        p.append(f'<line class="mark link" x1="{_f(x(first))}" y1="{_f(min(ys))}" x2="{_f(x(first))}" '
                 f'y2="{_f(max(ys))}" stroke="{STALL_COLOR}" stroke-dasharray="3,2" stroke-width="1">'
                 f'<title>prefill of {escape(cause)} stalled {len(stalled)} requests shown</title></line>')
    c.legend = [(comp, COMPONENT_COLORS[comp], False) for comp in ("send_lag", "connect", "queue", "prefill",
                                                                    "decode", "other")]
    c.legend.append(("stall (cause's prefill)", STALL_COLOR, False))
    return c.svg()
