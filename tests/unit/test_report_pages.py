"""`loadgen report --format html|md` on a synthetic results folder: every number shown equals the JSON
report's (both parsed), the page is self-contained, and what is drawn is bounded."""
from __future__ import annotations

import math
import re
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import orjson
import pytest

from loadgen.results import hdr
from loadgen.cli.main import main
from loadgen.report import figures
from loadgen.report.html import SIZE_BOUND_BYTES
from loadgen.report.svg import Series, line_chart
from loadgen.report.tables import lookup
from tests.synthetic_run import make_run

NUMBER = re.compile(r"(?<![\w.-])-?\d+(?:\.\d+)?(?:e[-+]?\d+)?(?![\w.])")


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    run = make_run(tmp_path_factory.mktemp("run") / "r", 600, rate_per_s=50.0)
    out = {}
    for fmt in ("json", "html", "md"):
        f = run / f"report.{fmt}"
        assert main(["report", str(run), "--format", fmt, "--out", str(f)]) == 0
        out[fmt] = f.read_text()
    out["summary"] = orjson.loads(out["json"])
    return out


def agrees(shown: str, value, scale: float = 1.0) -> bool:
    """The shown text is the JSON value (x scale: 100 for a percentage), rounded to the decimals shown
    (independent of the formatter). A list (a confidence interval) is shown as its items joined by " – "."""
    if isinstance(value, list):
        parts = shown.split(" – ")
        return len(parts) == len(value) and all(agrees(t, v, scale) for t, v in zip(parts, value))
    if scale == 100.0 and isinstance(value, (int, float)):  # a percentage
        return shown.endswith("%") and agrees(shown[:-1].lstrip("+"), value * scale)
    if scale != 1.0 and isinstance(value, (int, float)):    # a unit change (ns shown in s)
        return agrees(shown, float(value) * scale)
    if value is None:
        return shown == "-"
    if isinstance(value, bool):
        return shown == ("yes" if value else "no")
    if isinstance(value, str):
        return shown == value
    if isinstance(value, int):
        return shown == str(value)
    decimals = len(shown.split(".")[1]) if "." in shown else 0
    return abs(float(shown) - value) <= 0.5 * 10 ** -decimals + 1e-9 * abs(value)


class Page(HTMLParser):
    """Collects text of [data-k]/[data-s]/[data-json] elements and every text outside them and outside SVG."""

    def __init__(self):
        super().__init__()
        self.stack: list[tuple[str, dict]] = []
        self.keyed: list[tuple[str, str, str]] = []   # (attr, path, text)
        self.loose: list[str] = []
        self.tags: list[str] = []
        self.scale: dict[tuple[str, str], float] = {}
        self._open: list[list] = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.tags.append(tag)
        self.stack.append((tag, a))
        for attr in ("data-k", "data-s", "data-json"):
            if attr in a:
                self._open.append([attr, a[attr], "", len(self.stack), float(a.get("data-scale", 1))])

    def handle_endtag(self, tag):
        while self._open and self._open[-1][3] == len(self.stack):
            attr, path, text, _, scale = self._open.pop()
            self.keyed.append((attr, path, text))
            self.scale[(attr, path)] = scale
        if self.stack:
            self.stack.pop()

    def handle_data(self, data):
        if self._open:
            for o in self._open:
                o[2] += data
        elif not any(t in ("svg", "style", "title") for t, _ in self.stack):
            self.loose.append(data)


def check_html_numbers(html: str, s: dict) -> tuple[dict, list[str]]:
    """Every keyed element shows its JSON value; returns them and the numbers printed outside them."""
    page = Page()
    page.feed(html)
    keyed = {(a, p): t for a, p, t in page.keyed}
    for (attr, path), text in keyed.items():
        if attr == "data-k":
            v = lookup(s, path)
            assert agrees(text, v, page.scale[(attr, path)]), (path, text, v)
        elif attr == "data-s":
            assert text == str(lookup(s, path)), (path, text)
        else:
            assert orjson.loads(text) == lookup(s, path)
    return keyed, [n for text in page.loose for n in NUMBER.findall(text)]


def test_every_number_in_the_html_is_the_json_value(reports):
    s = reports["summary"]
    keyed, stray = check_html_numbers(reports["html"], s)
    assert len(keyed) > 80
    for m in ("ttft", "itl", "e2e", "send_lag"):          # the summary table and the CDF markers
        for st in ("p50", "p99", "mean"):
            assert ("data-k", f"latency_ms.{m}.{st}") in keyed
    for comp in ("queue", "prefill", "decode_stalls"):    # the decomposition table and bars
        assert ("data-k", f"decomposition_ms.p99_e2e.{comp}") in keyed
    assert ("data-s", "diagnosis.0.finding") in keyed
    assert stray == [], stray    # no number printed outside the keyed elements (plots' axes aside)


def test_the_html_loads_nothing_and_runs_no_script(reports):
    h = reports["html"]
    page = Page()
    page.feed(h)
    assert "script" not in page.tags and "link" not in page.tags and "img" not in page.tags
    assert not re.search(r"\b(src|href)=\"(?!#)", h)      # only in-page links
    assert "url(" not in h and "@import" not in h
    assert len(h.encode()) < SIZE_BOUND_BYTES


def markdown_tables(md: str) -> dict[str, list[dict[str, str]]]:
    tables, title, rows = {}, None, None
    for line in md.splitlines():
        if line.startswith("**") and not line.startswith("**Diagnosis"):
            title = line.split("**")[1]
        elif line.startswith("|") and title:
            cells = [c.strip() for c in line.strip("|").split(" | ")]
            if rows is None:
                rows, header = [], cells
            elif not set(line) <= set("|:- "):
                rows.append(dict(zip(header, cells)))
        elif rows is not None:
            tables[title], rows = rows, None
    if rows is not None:
        tables[title] = rows
    return tables


def test_every_number_in_the_markdown_is_the_json_value(reports):
    s, md = reports["summary"], reports["md"]
    t = markdown_tables(md)
    for row in t["Latency (ms)"]:
        for st in ("p50", "p90", "p99", "p999", "max", "mean"):
            assert agrees(row[st], s["latency_ms"][row["metric"]][st]), (row, st)
    cols = {"mean": "mean", "at p99 e2e": "p99_e2e", "at p99 TTFT": "p99_ttft"}
    for row in t["Where the time went (ms)"]:
        comp = row["component"]
        if comp in ("requests", "threshold"):
            continue
        for label, key in cols.items():
            assert agrees(row[label], s["decomposition_ms"][key][comp]), (comp, label)
    for i, row in enumerate(t["By prompt length"]):
        assert agrees(row["TTFT p50"], s["by_prompt_tokens"][i]["ttft_p50"])
        assert agrees(row["n"], s["by_prompt_tokens"][i]["n"])
    overview = {r[""]: r["value"] for r in t["Requests, rate, throughput"]}
    assert agrees(overview["ok"], s["requests"]["ok"])
    assert agrees(overview["throughput (output tok/s)"], s["throughput"]["output_tokens_per_s"])
    # every other number is some JSON number rounded as shown, or inside a JSON string quoted verbatim
    for f in s["diagnosis"]:
        assert f["finding"] in md
        md = md.replace(f["finding"], "").replace(f["remedy"], "")
    md = md.replace(s["run"]["path"], "").replace(str(s["run"]["target"]), "")
    check_md_numbers(md, s)


def check_md_numbers(md: str, s: dict) -> None:
    leaves = list(_numbers(s))
    for n in re.findall(r"[-+]?\d+(?:\.\d+)?%?", re.sub(r"\b[a-z_]+\d+\b|\d+%\s+CI", "", md)):
        if n.endswith("%"):
            assert any(agrees(n, v, 100.0) for v in leaves), n
        else:
            assert any(agrees(n.lstrip("+"), v) for v in leaves), n


def _numbers(v):
    if isinstance(v, dict):
        for x in v.values():
            yield from _numbers(x)
    elif isinstance(v, list):
        for x in v:
            yield from _numbers(x)
    elif isinstance(v, (int, float)) and not isinstance(v, bool):
        yield v


def test_cdf_points_are_samples_at_their_rank_and_bounded():
    v = np.random.default_rng(3).lognormal(3, 1, 1_000_000)
    xs, ps = figures.cdf_points(v)
    assert len(xs) <= figures.CDF_POINTS
    srt = np.sort(v)
    for x, p in zip(xs[:-1], ps[:-1]):
        assert x == srt[math.ceil(p * v.size - 1e-9) - 1]
    assert xs[-1] == srt[-1] and ps[-1] < 1
    assert ps[-2] >= 0.9999          # the tail keeps points: the p99.99 region is drawn


def test_interval_logs_are_merged_exactly_into_at_most_time_points(tmp_path):
    t = np.arange(0, 3_000 * 10**9, 10**8)                      # 3,000 one-second intervals
    vals = (1 + (t // 10**9) % 7) * 10**6
    hdr.write_interval_log(tmp_path / "ttft.hlog", t, vals, start_wall_s=1.7e9)
    ts = figures.interval_percentiles(tmp_path, "ttft", max_points=100)
    assert len(ts.t_s) == 100
    assert sum(c * 30 for c in ts.values["count_per_s"]) == pytest.approx(t.size)   # nothing lost
    assert max(ts.values["p99"]) == pytest.approx(7.0, rel=1e-3)


def test_log_axes_leave_out_what_they_cannot_draw():
    svg = line_chart("t", [Series("a", [1, 2, 3, 4], [0.0, 10.0, None, 1000.0])], y_kind="log")
    assert svg.count('class="mark line"') == 1
    pts = re.search(r'class="mark line" points="([^"]+)"', svg).group(1).split()
    assert len(pts) == 2


def test_bad_format_and_bad_folder_are_usage_errors(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["report", str(tmp_path), "--format", "pdf"])
    assert e.value.code == 2
    assert main(["report", str(tmp_path), "--format", "html"]) == 2
    assert "not a loadgen results folder" in capsys.readouterr().err


FIXTURES = Path(__file__).parent.parent / "data" / "report_pages"


@pytest.mark.parametrize("name", ["sweep_summary.json", "compare_runs.json", "compare_sweeps.json"])
def test_sweep_and_compare_pages_show_the_json_numbers(tmp_path, name):
    # fixtures: the JSON that `loadgen sweep` and `loadgen compare --format json` write (docs/sweep-and-compare.md)
    src = FIXTURES / name
    d = orjson.loads(src.read_bytes())
    out = {}
    for fmt in ("html", "md"):
        f = tmp_path / f"page.{fmt}"
        assert main(["report", str(src), "--format", fmt, "--out", str(f)]) == 0
        out[fmt] = f.read_text()
    keyed, stray = check_html_numbers(out["html"], d)
    assert stray == [], stray
    assert 'class="plot"' in out["html"] and "<script" not in out["html"]
    if d["kind"] == "loadgen-sweep-summary":
        assert ("data-k", "knee.rate_per_s") in keyed
        for i in range(len(d["points"])):
            assert ("data-k", f"points.{i}.latency_ms.ttft.p99") in keyed
        assert out["html"].count('class="mark point"') >= 5 * len(d["points"])
    else:
        metrics = d["comparisons"][0].get("metrics") or d["comparisons"][0]["points"][0]["metrics"]
        base = "comparisons.0" if "metrics" in d["comparisons"][0] else "comparisons.0.points.0"
        assert ("data-k", f"{base}.metrics.{len(metrics) - 1}.rel_ci") in keyed
        if "metrics" in d["comparisons"][0]:
            assert 'class="mark ci"' in out["html"]                 # the forest plot of relative changes
        else:
            assert 'class="mark band"' in out["html"]               # curves with their CI bands
    check_md_numbers(out["md"].replace(str(d.get("baseline")), ""), d)


def test_a_json_file_that_is_neither_is_a_clear_error(tmp_path, capsys):
    f = tmp_path / "x.json"
    f.write_text('{"kind": "something"}')
    assert main(["report", str(f), "--format", "html"]) == 2
    assert "not a sweep summary or a compare result" in capsys.readouterr().err


def test_goodput_and_slo_rows_appear_when_the_summary_has_them():
    from loadgen.report.markdown import table_md
    from loadgen.report.tables import overview

    s = {"requests": {"scheduled": 10, "ok": 9, "failed": 1, "dropped": 0}, "outcomes": {"ok": 9, "timeout": 1},
         "rate": {"offered_per_s": 2.0, "achieved_per_s": 2.0},
         "throughput": {"requests_per_s": 1.8, "output_tokens_per_s": 57.3}, "load": {"loop": "closed"},
         "slo": {"ttft_ms": 500.0}, "goodput": {"attainment": 0.8, "requests_per_s": 1.6}}
    rows = {r[""]: r["value"] for r in markdown_tables("\n".join(table_md(overview(s), s)))[
        "Requests, rate, throughput"]}
    assert rows["load loop"] == "closed" and agrees(rows["SLO ttft_ms"], 500.0)
    assert agrees(rows["goodput (req/s)"], 1.6) and agrees(rows["SLO attainment"], 0.8)
    assert "goodput (req/s)" not in str(overview({**s, "goodput": None}).rows)


def test_sweep_page_draws_completions_no_higher_than_offers_and_the_knee_label_inside_the_plot():
    import re

    from loadgen.report.sweep_pages import sweep_html

    d = orjson.loads((FIXTURES / "sweep_summary.json").read_bytes())
    assert d["points"][0]["completed_per_s"] > d["points"][0]["offered_per_s"]  # as an older summary has it
    d["knee"]["rate_per_s"] = d["points"][-1]["rate_per_s"]                      # a knee at the right edge
    html = sweep_html(d)
    svg = html[html.index('id="sweep-throughput"'):]
    svg = svg[:svg.index("</svg>")]
    cy = [float(c) for c in re.findall(r'class="mark point" cx="[^"]+" cy="([^"]+)"', svg)]
    n = len(d["points"])
    offered, completed = cy[:n], cy[n:2 * n]
    assert all(c >= o for c, o in zip(completed, offered))  # svg y grows downwards: never above the offered
    # the knee's label at the right edge runs leftwards, away from the legend right of the plot
    assert re.search(r'<text x="[^"]+" y="[^"]+" text-anchor="end" fill="#444" font-size="10">knee ', svg)
