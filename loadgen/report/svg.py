"""Plain inline SVG charts, generated as text: no JavaScript, no charting library, nothing fetched.

Every chart is one `<svg class="plot">` element; every drawn datum (a line, a band, a bar, a point) carries
`class="mark ..."`, so a browser test can check that a plot drew something. Hover text is native SVG
`<title>`. Charts take plain Python lists (already thinned by the caller: see figures.py for the bounds)
and are reused by the run report (html.py) and by the sweep/compare pages (sweep_html.py).

Scales: "lin", "log" (base 10; non-positive values are left out) and "nines" for percentile axes:
p -> -log10(1 - p), so 0.9, 0.99, 0.999 are evenly spaced and the tail a p99 row hides gets room.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from html import escape

from loadgen.report import _f as fmt

PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf",
           "#7f7f7f", "#bcbd22")
# One colour per decomposition component (analysis/decompose.py COMPONENTS), shared by every chart.
COMPONENT_COLORS = {"send_lag": "#7f7f7f", "connect": "#c7c7c7", "queue": "#ff7f0e", "prefill": "#d62728",
                    "decode": "#1f77b4", "decode_ideal": "#1f77b4", "decode_contention": "#9ecae1",
                    "decode_stalls": "#9467bd", "other": "#bcbd22"}
WIDTH, HEIGHT = 760, 300
MARGIN = (56, 150, 34, 46)  # left, right (legend), top, bottom in px


Value = float | None  # a point's coordinate; None (like nan, inf or a value off a log axis) is a gap: not drawn


@dataclass
class Series:
    label: str
    xs: Sequence[Value]
    ys: Sequence[Value]
    color: str | None = None
    band: tuple[Sequence[Value], Sequence[Value]] | None = None  # (low, high) per x: a confidence band
    dashed: bool = False
    points: bool = False    # a marker at every point (few points: sweep curves)
    title: str | None = None


@dataclass
class Scale:
    kind: str                     # "lin" | "log" | "nines"
    lo: float
    hi: float
    px0: float
    px1: float

    def __call__(self, v: float) -> float:
        a, b, x = _t(self.kind, self.lo), _t(self.kind, self.hi), _t(self.kind, v)
        f = 0.5 if b == a else (x - a) / (b - a)
        return self.px0 + f * (self.px1 - self.px0)


def _t(kind: str, v: float) -> float:
    if kind == "log":
        return math.log10(v)
    if kind == "nines":
        return -math.log10(max(1e-12, 1.0 - v))
    return v


def drawable(kind: str, v: float | None) -> bool:
    if v is None or not math.isfinite(v):
        return False
    return v > 0 if kind == "log" else (0 <= v < 1 if kind == "nines" else True)


def extent(kind: str, values: Sequence[Value], zero: bool = False) -> tuple[float, float]:
    vs = [v for v in values if v is not None and drawable(kind, v)]
    if not vs:
        return (1.0, 10.0) if kind == "log" else (0.0, 1.0)
    lo, hi = min(vs), max(vs)
    if kind == "log":
        return 10 ** math.floor(math.log10(lo)), 10 ** math.ceil(math.log10(hi) + 1e-9)
    if zero:
        lo = min(lo, 0.0)
    if hi == lo:
        hi = lo + 1.0
    step = nice_step((hi - lo) / 8)
    return math.floor(lo / step) * step, math.ceil(hi / step) * step


def nice_step(raw: float) -> float:
    if raw <= 0:
        return 1.0
    e = 10 ** math.floor(math.log10(raw))
    return next(m * e for m in (1, 2, 5, 10) if m * e >= raw)


def ticks(kind: str, lo: float, hi: float) -> list[tuple[float, str]]:
    if kind == "log":
        out = []
        for d in range(round(math.log10(lo)), round(math.log10(hi)) + 1):
            for m in ((1, 2, 5) if round(math.log10(hi)) - round(math.log10(lo)) <= 3 else (1,)):
                v = m * 10.0 ** d
                if lo <= v <= hi:
                    out.append((v, _num(v)))
        return out
    if kind == "nines":
        out = [(0.0, "0"), (0.5, "50%")]
        z = 1
        while 1 - 10.0 ** -z <= hi + 1e-12:
            out.append((1 - 10.0 ** -z, f"{100 * (1 - 10.0 ** -z):.{max(0, z - 2)}f}%"))
            z += 1
        return out
    step = nice_step((hi - lo) / 5)
    first = math.ceil(lo / step - 1e-9)
    return [(i * step, _num(i * step)) for i in range(first, math.floor(hi / step + 1e-9) + 1)]


def _num(v: float) -> str:
    if v == 0:
        return "0"
    if abs(v) >= 1e4 or abs(v) < 1e-3:
        return f"{v:.0e}".replace("e+0", "e").replace("e-0", "e-")
    return f"{v:g}"


def _f(v: float) -> str:
    return f"{v:.1f}"


class Canvas:
    """One chart: frame, axes, and an element list; `svg()` closes it."""

    def __init__(self, title: str, x: Scale, y: Scale, *, width: int = WIDTH, height: int = HEIGHT,
                 x_label: str = "", y_label: str = "", plot_id: str = ""):
        self.title, self.x, self.y, self.w, self.h = title, x, y, width, height
        self.parts: list[str] = []
        self.legend: list[tuple[str, str, bool]] = []
        self.x_label, self.y_label, self.plot_id = x_label, y_label, plot_id
        self.markers = 0

    def axes(self, x_ticks: list[tuple[float, str]], y_ticks: list[tuple[float, str]]) -> None:
        x0, x1 = self.x.px0, self.x.px1
        y0, y1 = max(self.y.px0, self.y.px1), min(self.y.px0, self.y.px1)   # bottom, top in px
        p = self.parts
        p.append(f'<rect class="frame" x="{_f(x0)}" y="{_f(y1)}" width="{_f(x1 - x0)}" height="{_f(y0 - y1)}" '
                 'fill="#fff" stroke="#999"/>')
        for v, label in x_ticks:
            px = self.x(v)
            p.append(f'<line x1="{_f(px)}" y1="{_f(y1)}" x2="{_f(px)}" y2="{_f(y0)}" stroke="#eee"/>'
                     f'<text x="{_f(px)}" y="{_f(y0 + 14)}" text-anchor="middle">{escape(label)}</text>')
        for v, label in y_ticks:
            py = self.y(v)
            p.append(f'<line x1="{_f(x0)}" y1="{_f(py)}" x2="{_f(x1)}" y2="{_f(py)}" stroke="#eee"/>'
                     f'<text x="{_f(x0 - 4)}" y="{_f(py + 4)}" text-anchor="end">{escape(label)}</text>')
        if self.x_label:
            p.append(f'<text x="{_f((x0 + x1) / 2)}" y="{_f(y0 + 32)}" text-anchor="middle">'
                     f'{escape(self.x_label)}</text>')
        if self.y_label:
            p.append(f'<text transform="translate(12,{_f((y0 + y1) / 2)}) rotate(-90)" text-anchor="middle">'
                     f'{escape(self.y_label)}</text>')

    def _drawable(self, xs: Sequence[Value], ys: Sequence[Value]) -> list[tuple[float, float]]:
        return [(x, y) for x, y in zip(xs, ys)
                if x is not None and y is not None and drawable(self.x.kind, x) and drawable(self.y.kind, y)]

    def line(self, s: Series, color: str) -> None:
        pts = self._drawable(s.xs, s.ys)
        title = f"<title>{escape(s.title or s.label)}</title>"
        if s.band:
            lo, hi = self._drawable(s.xs, s.band[0]), self._drawable(s.xs, s.band[1])
            if lo and hi:
                ring = " ".join(f"{_f(self.x(x))},{_f(self.y(y))}" for x, y in [*hi, *reversed(lo)])
                self.parts.append(f'<polygon class="mark band" points="{ring}" fill="{color}" fill-opacity="0.18" '
                                  f'stroke="none">{title}</polygon>')
        if len(pts) >= 2:
            d = " ".join(f"{_f(self.x(x))},{_f(self.y(y))}" for x, y in pts)
            dash = ' stroke-dasharray="5,3"' if s.dashed else ""
            self.parts.append(f'<polyline class="mark line" points="{d}" fill="none" stroke="{color}" '
                              f'stroke-width="1.6"{dash}>{title}</polyline>')
        if s.points or len(pts) == 1:
            for x, y in pts:
                self.parts.append(f'<circle class="mark point" cx="{_f(self.x(x))}" cy="{_f(self.y(y))}" r="3" '
                                  f'fill="{color}">{title}</circle>')
        self.legend.append((s.label, color, s.dashed))

    def marker(self, x: float, label: str, color: str, attrs: str = "") -> None:
        """A vertical rule at x with a label at its top (e.g. the summary's p99)."""
        if not drawable(self.x.kind, x) or not (min(self.x.lo, self.x.hi) <= x <= max(self.x.lo, self.x.hi)):
            return
        px, top = self.x(x), min(self.y.px0, self.y.px1)
        self.markers += 1
        # in the right half the label runs leftwards from the rule, so it stays inside the plot and off the
        # legend (drawn right of the plot)
        right = px > (self.x.px0 + self.x.px1) / 2
        tx, anchor = (px - 3, ' text-anchor="end"') if right else (px + 3, "")
        self.parts.append(f'<line class="mark rule" x1="{_f(px)}" y1="{_f(top)}" x2="{_f(px)}" '
                          f'y2="{_f(max(self.y.px0, self.y.px1))}" stroke="{color}" stroke-dasharray="2,2"/>'
                          f'<text x="{_f(tx)}" y="{_f(top + 12 * self.markers)}"{anchor} '
                          f'fill="{color}" font-size="10"{attrs}>{label}</text>')

    def shade(self, x_from: float, x_to: float, label: str) -> None:
        """A grey band over [x_from, x_to] (clipped to the axis) with a label at its top, e.g. the warm-up
        whose requests the statistics leave out. Not a `.mark`: it draws no datum."""
        lo, hi = sorted((self.x.lo, self.x.hi))
        a, b = max(lo, x_from), min(hi, x_to)
        if not (drawable(self.x.kind, a) and drawable(self.x.kind, b)) or b <= a:
            return
        top, bottom = min(self.y.px0, self.y.px1), max(self.y.px0, self.y.px1)
        self.parts.append(f'<rect class="shade" x="{_f(self.x(a))}" y="{_f(top)}" width="{_f(self.x(b) - self.x(a))}" '
                          f'height="{_f(bottom - top)}" fill="#999" fill-opacity="0.15"><title>{escape(label)}</title>'
                          f'</rect><text class="shade-label" x="{_f(self.x(a) + 3)}" y="{_f(bottom - 4)}" fill="#666" '
                          f'font-size="10">{escape(label)}</text>')

    def svg(self) -> str:
        lx = self.x.px1 + 10
        leg = []
        for i, (label, color, dashed) in enumerate(self.legend):
            y = min(self.y.px0, self.y.px1) + 8 + 16 * i
            dash = ' stroke-dasharray="5,3"' if dashed else ""
            leg.append(f'<line x1="{_f(lx)}" y1="{_f(y)}" x2="{_f(lx + 18)}" y2="{_f(y)}" stroke="{color}" '
                       f'stroke-width="3"{dash}/><text x="{_f(lx + 22)}" y="{_f(y + 4)}">{escape(label)}</text>')
        ident = f' id="{escape(self.plot_id)}"' if self.plot_id else ""
        return (f'<svg class="plot"{ident} xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {self.w} {self.h}" '
                f'width="{self.w}" height="{self.h}" font-family="sans-serif" font-size="11" role="img">'
                f'<title>{escape(self.title)}</title>'
                f'<text x="{MARGIN[0]}" y="18" font-size="13" font-weight="bold">{escape(self.title)}</text>'
                + "".join(self.parts) + "".join(leg) + "</svg>")


def frame(title: str, x_kind: str, x_range: tuple[float, float], y_kind: str, y_range: tuple[float, float], *,
          width: int = WIDTH, height: int = HEIGHT, x_label: str = "", y_label: str = "", plot_id: str = "",
          x_ticks: list[tuple[float, str]] | None = None) -> Canvas:
    left, right, top, bottom = MARGIN
    x = Scale(x_kind, *x_range, left, width - right)
    y = Scale(y_kind, *y_range, height - bottom, top)
    c = Canvas(title, x, y, width=width, height=height, x_label=x_label, y_label=y_label, plot_id=plot_id)
    c.axes(x_ticks if x_ticks is not None else ticks(x_kind, *x_range), ticks(y_kind, *y_range))
    return c


def line_chart(title: str, series: list[Series], *, x_kind: str = "lin", y_kind: str = "lin",
               x_label: str = "", y_label: str = "", y_zero: bool = True, plot_id: str = "",
               x_range: tuple[float, float] | None = None, width: int = WIDTH, height: int = HEIGHT,
               markers: Sequence[tuple[float, str, str]] = (),
               shade: tuple[float, float, str] | None = None) -> str:
    """Several series against one x (time, rate, ...), optional confidence bands; markers: vertical rules
    (x, label html, colour), e.g. a sweep's knee; shade: a labelled band (x from, x to, label), e.g. warm-up."""
    xs = [x for s in series for x in s.xs]
    ys = [y for s in series for y in (*s.ys, *((*s.band[0], *s.band[1]) if s.band else ()))]
    c = frame(title, x_kind, x_range or extent(x_kind, xs), y_kind, extent(y_kind, ys, zero=y_zero),
              x_label=x_label, y_label=y_label, plot_id=plot_id, width=width, height=height)
    if shade is not None:  # under the lines
        c.shade(*shade)
    for i, s in enumerate(series):
        c.line(s, s.color or PALETTE[i % len(PALETTE)])
    for x, label, color in markers:
        c.marker(x, label, color)
    return c.svg()


def interval_chart(title: str, rows: list[tuple[str, float | None, list | None, str, str]], *, x_label: str = "",
                   plot_id: str = "", width: int = WIDTH) -> str:
    """One row per estimate: a point and its confidence interval on a common axis with a rule at 0 (a forest
    plot). rows: (label, value, [low, high] or None, colour, extra attrs of the point, e.g. data-k)."""
    row_h, top, bottom, label_w = 22, 34, 46, 190
    height = top + bottom + row_h * max(1, len(rows))
    vals = [v for _, v, ci, _, _ in rows for v in (v, *(ci or ())) if v is not None and math.isfinite(v)]
    lo, hi = extent("lin", [*vals, 0.0], zero=False)
    x = Scale("lin", lo, hi, label_w, width - MARGIN[1])
    y = Scale("lin", 0.0, float(max(1, len(rows))), top, top + row_h * max(1, len(rows)))
    c = Canvas(title, x, y, width=width, height=height, x_label=x_label, plot_id=plot_id)
    c.axes(ticks("lin", lo, hi), [])
    c.parts.append(f'<line x1="{_f(x(0))}" y1="{top}" x2="{_f(x(0))}" y2="{_f(y(len(rows)))}" stroke="#444"/>')
    for i, (label, v, ci, color, attrs) in enumerate(rows):
        cy = y(i) + row_h / 2
        c.parts.append(f'<text x="{label_w - 6}" y="{_f(cy + 4)}" text-anchor="end">{escape(label)}</text>')
        if ci and None not in ci:
            c.parts.append(f'<line class="mark ci" x1="{_f(x(ci[0]))}" y1="{_f(cy)}" x2="{_f(x(ci[1]))}" '
                           f'y2="{_f(cy)}" stroke="{color}" stroke-width="2"/>')
        if v is not None:
            c.parts.append(f'<circle class="mark point" cx="{_f(x(v))}" cy="{_f(cy)}" r="4" fill="{color}"{attrs}>'
                           f'<title>{escape(label)}</title></circle>')
    return c.svg()


@dataclass
class Cdf:
    label: str
    xs: list[float]          # sample values, ascending
    ps: list[float]          # cumulative fraction at each value, in [0, 1)
    color: str | None = None
    markers: list[tuple[float, str, str]] = field(default_factory=list)  # (x, label html, extra attrs)


def cdf_chart(title: str, cdfs: list[Cdf], *, x_label: str = "ms", plot_id: str = "",
              width: int = WIDTH, height: int = HEIGHT) -> str:
    """Empirical CDFs, x on a log axis, percentile on the nines axis; one or several (overlay for compare)."""
    xs = [x for c in cdfs for x in c.xs]
    top = max((p for c in cdfs for p in c.ps), default=0.99)
    nines = max(2, math.ceil(_t("nines", top) - 1e-9))
    c = frame(title, "log", extent("log", xs), "nines", (0.0, 1 - 10.0 ** -nines), x_label=x_label,
              y_label="percentile", plot_id=plot_id, width=width, height=height)
    for i, cdf in enumerate(cdfs):
        color = cdf.color or PALETTE[i % len(PALETTE)]
        c.line(Series(cdf.label, cdf.xs, cdf.ps), color)
        for x, label, attrs in cdf.markers:
            c.marker(x, label, color, attrs)
    return c.svg()


@dataclass
class Bar:
    label: str
    parts: list[tuple[str, float | None, str]]   # (component, value, extra attrs e.g. data-k) stacked in order
    note: str = ""                                # html after the label (e.g. "n 12")


def stacked_bars(title: str, bars: list[Bar], *, colors: dict[str, str] = COMPONENT_COLORS, unit: str = "ms",
                 plot_id: str = "", width: int = WIDTH, label_width: int = 150) -> str:
    """Horizontal stacked bars, one per row, on a common linear axis from 0 (negative parts drawn as 0)."""
    row_h, top, bottom = 26, 34, 46
    n_legend = len({comp for b in bars for comp, _, _ in b.parts})
    height = max(top + bottom + row_h * len(bars), top + 16 * n_legend + 12)
    totals = [sum(max(0.0, v or 0.0) for _, v, _ in b.parts) for b in bars]
    hi = extent("lin", [*totals, 0.0], zero=True)[1]
    x = Scale("lin", 0.0, hi, label_width, width - MARGIN[1])
    y = Scale("lin", 0.0, float(len(bars)), top, top + row_h * len(bars))
    c = Canvas(title, x, y, width=width, height=height, x_label=unit, plot_id=plot_id)
    c.axes(ticks("lin", 0.0, hi), [])
    for i, b in enumerate(bars):
        y0 = y(i) + 4
        c.parts.append(f'<text x="{label_width - 6}" y="{_f(y0 + 13)}" text-anchor="end">{escape(b.label)}'
                       f'{b.note}</text>')
        acc = 0.0
        for comp, v, attrs in b.parts:
            w = max(0.0, v or 0.0)
            if w > 0:
                c.parts.append(f'<rect class="mark bar" x="{_f(x(acc))}" y="{_f(y0)}" '
                               f'width="{_f(x(acc + w) - x(acc))}" '
                               f'height="{row_h - 8}" fill="{colors.get(comp, "#999")}"{attrs}>'
                               f'<title>{escape(b.label)}: {escape(comp)} {fmt(v)} {unit}</title></rect>')
            acc += w
    seen = []
    for b in bars:
        for comp, _, _ in b.parts:
            if comp not in seen:
                seen.append(comp)
    c.legend = [(comp, colors.get(comp, "#999"), False) for comp in seen]
    return c.svg()
