"""The report's configuration table shows a duration in seconds (not "duration (ns)"), keyed to the JSON value
with its scale, in HTML and Markdown alike."""
import re

from loadgen.report.html import table_html
from loadgen.report.markdown import table_md
from loadgen.report.tables import config_rows


def _summary(duration_ns):
    return {"config": {"name": "w", "requests": None, "duration_ns": duration_ns, "seed": 0}, "run": {"target": "t"}}


def test_the_config_table_shows_a_duration_in_seconds():
    s = _summary(90_000_000_000)
    html = table_html(config_rows(s), s)
    assert "(ns)" not in html
    assert re.search(r'<td>duration \(s\)</td><td data-k="config.duration_ns" data-scale="1e-09">90.0</td>', html)
    md = "\n".join(table_md(config_rows(s), s))
    assert "| duration (s) | 90.0 |" in md and "90000000000" not in md
    s = _summary(1_500_000_000)
    assert '>1.500</td>' in table_html(config_rows(s), s)
    s = _summary(None)  # a run bounded by requests
    assert '<td>duration (s)</td><td data-k="config.duration_ns" data-scale="1e-09">-</td>' in table_html(
        config_rows(s), s)


def test_the_charts_scale_to_the_page_width():
    # the stylesheet lets every chart fill the body (its viewBox keeps the aspect) and the body is not
    # narrower than a 1400 px window; the browser test measures it (tests/integration/test_report_browser.py)
    from loadgen.report.html import CSS

    rules = dict(re.findall(r"([\w.]+)\{([^}]*)\}", CSS))
    plot = dict(d.split(":", 1) for d in rules["svg.plot"].split(";"))
    assert plot["width"] == "100%" and plot["height"] == "auto"
    body = dict(d.split(":", 1) for d in rules["body"].split(";"))
    assert int(body["max-width"].removesuffix("px")) >= 1400


def test_the_warm_up_is_shaded_and_labelled_on_the_charts_over_time(tmp_path):
    import polars as pl

    from loadgen.cli.main import main
    from loadgen.report.svg import MARGIN, WIDTH, Series, line_chart
    from tests.synthetic_run import make_run

    run = make_run(tmp_path / "r", 400, rate_per_s=100.0)
    req = pl.read_parquet(run / "requests.parquet")
    req = req.with_columns(warmup=pl.col("idx") < 30)
    req.write_parquet(run / "requests.parquet")
    first_measured_s = req.filter(~pl.col("warmup"))["intended_ns"].min() / 1e9
    out = tmp_path / "r.html"
    assert main(["report", str(run), "--format", "html", "--out", str(out)]) == 0
    html = out.read_text()
    charts = re.findall(r'<svg class="plot" id="([\w-]+)".*?</svg>', html, re.S)
    over_time = [c for c in charts if c in ("latency-time", "throughput-req", "throughput-tok")]
    assert len(over_time) == 3
    for plot in over_time:
        svg = re.search(rf'<svg class="plot" id="{plot}".*?</svg>', html, re.S).group(0)
        assert svg.count('class="shade"') == 1 and "warm-up: 30 requests, not measured" in svg, plot
    # the band spans t0 to the first measured request's due time, on the chart's own x scale
    svg = line_chart("t", [Series("a", [0.0, 4.0], [1.0, 2.0])], x_range=(0.0, 4.0),
                     shade=(0.0, first_measured_s, "warm-up"))
    x, w = map(float, re.search(r'class="shade" x="([\d.]+)" y="[\d.]+" width="([\d.]+)"', svg).groups())
    plain = line_chart("t", [Series("a", [0.0, 4.0], [1.0, 2.0])], x_range=(0.0, 4.0))
    assert 'class="shade"' not in plain
    left, right = MARGIN[0], WIDTH - MARGIN[1]
    assert abs(x - left) < 0.1 and abs(w - (right - left) * first_measured_s / 4.0) < 0.1
