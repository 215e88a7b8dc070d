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
