"""The HTML report in a real browser (headless Chromium over the DevTools protocol, tests/browser.py): no
console error, no network request, every plot drew; screenshots are kept as test artifacts (pytest's
tmp dir, and $LOADGEN_ARTIFACTS when set)."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import orjson

from loadgen.report.html import SIZE_BOUND_BYTES
from tests.browser import open_page
from tests.integration.conftest import loadgen
from tests.synthetic_run import make_run

SIM = "--profile tiny --speed 0.2 --per-request-metrics"
RUN_PLOTS = {"cdf-ttft", "cdf-itl", "cdf-e2e", "decomposition", "decomposition-by-length", "gantt", "latency-time",
             "server-queue", "server-kv", "throughput-req", "throughput-tok"}


def keep(png: Path) -> Path:
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    dest = os.environ.get("LOADGEN_ARTIFACTS")
    if dest:
        Path(dest).mkdir(parents=True, exist_ok=True)
        shutil.copy(png, Path(dest) / png.name)
    return png


def check_page(html: Path, png: Path, plots: set[str]) -> None:
    rep = open_page(html, png)
    assert rep.errors == [], rep.errors
    assert rep.requests == [html.resolve().as_uri()], rep.requests   # nothing but the file itself
    drawn = {p["id"]: p["marks"] for p in rep.plots}
    assert plots <= set(drawn), plots - set(drawn)
    assert all(n > 0 for n in drawn.values()), drawn
    keep(png)


def test_report_of_long_prompts_interfering_opens_cleanly_in_chromium(tmp_path):
    # the shipped workload, shortened: short prompts with long outputs, 8 % 8,000-token prompts among them
    run = tmp_path / "run"
    p = loadgen("run", "workloads/chunked-prefill-interference.toml", "--out", str(run), "--quiet",
                "--requests", "48", "--scrape-metrics", "--scrape-interval", "200ms", "--sim-args", SIM, timeout=240)
    assert p.returncode in (0, 3), p.stderr   # 3: the 2-core host lagged the schedule; the page shows INVALID
    html, md = tmp_path / "interference.html", tmp_path / "interference.md"
    for fmt, out in (("html", html), ("md", md)):
        r = loadgen("report", str(run), "--format", fmt, "--out", str(out))
        assert r.returncode == 0, r.stderr
    text = html.read_text()
    assert 'class="mark stall"' in text and 'href="#g-' in text      # stalls marked and linked to their cause
    check_page(html, tmp_path / "interference.png", RUN_PLOTS)
    assert "| ttft |" in md.read_text()


def test_a_100k_request_report_stays_under_the_bound_and_opens(tmp_path):
    run = make_run(tmp_path / "big", 100_000)
    html = tmp_path / "big.html"
    r = loadgen("report", str(run), "--format", "html", "--out", str(html), timeout=300)
    assert r.returncode == 0, r.stderr
    assert html.stat().st_size < SIZE_BOUND_BYTES
    check_page(html, tmp_path / "report-100k.png", RUN_PLOTS)


def test_the_charts_fill_a_wide_window(tmp_path):
    # a 1400 px window: every chart spans the page's width (it drew at its 760 px size, ~55 %, before)
    run = make_run(tmp_path / "r", 2_000)
    html = tmp_path / "wide.html"
    assert loadgen("report", str(run), "--format", "html", "--out", str(html)).returncode == 0
    rep = open_page(html, tmp_path / "wide.png", width=1400)
    assert rep.errors == [] and rep.plots
    widths = {p["id"]: p["width"] for p in rep.plots}
    assert all(w >= 0.9 * 1400 - 48 for w in widths.values()), widths


FIXTURES = Path(__file__).parent.parent / "data" / "report_pages"


def test_sweep_and_compare_pages_open_cleanly_in_chromium(tmp_path):
    sweep_html = tmp_path / "sweep.html"
    r = loadgen("report", str(FIXTURES / "sweep_summary.json"), "--format", "html", "--out", str(sweep_html))
    assert r.returncode == 0, r.stderr
    check_page(sweep_html, tmp_path / "sweep.png", {"sweep-latency", "sweep-tpot", "sweep-throughput",
                                                    "sweep-tokens", "sweep-decomposition"})
    # a comparison of two runs whose folders exist: the page overlays their CDFs
    a, b = make_run(tmp_path / "a", 2_000, rate_per_s=100.0), make_run(tmp_path / "b", 2_000, rate_per_s=150.0, seed=1)
    d = orjson.loads((FIXTURES / "compare_runs.json").read_bytes())
    d["baseline"], d["comparisons"][0]["a"], d["comparisons"][0]["b"] = str(a), str(a), str(b)
    (tmp_path / "compare.json").write_bytes(orjson.dumps(d))
    compare_html = tmp_path / "compare.html"
    r = loadgen("report", str(tmp_path / "compare.json"), "--format", "html", "--out", str(compare_html))
    assert r.returncode == 0, r.stderr
    check_page(compare_html, tmp_path / "compare.png", {"compare-0-forest", "compare-0-cdf-ttft",
                                                        "compare-0-cdf-itl", "compare-0-cdf-e2e"})
    sweeps_html = tmp_path / "compare-sweeps.html"
    r = loadgen("report", str(FIXTURES / "compare_sweeps.json"), "--format", "html", "--out", str(sweeps_html))
    assert r.returncode == 0, r.stderr
    check_page(sweeps_html, tmp_path / "compare-sweeps.png", {"compare-0-ttft-p99", "compare-0-e2e-p99"})
