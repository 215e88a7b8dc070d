"""The compare pages of a repeated comparison: the variance it used is said, and a metric within the noise
(no relative change: rel_ci [None, None]) renders as "-" in both formats."""
from loadgen.report.sweep_pages import render

VARIANCE = "across-run: Welch's t on the run means (A 3 runs, B 3 runs), not the within-run bootstrap"


def _result() -> dict:
    within = {"metric": "tpot", "stat": "p50", "unit": "ms", "better": "lower", "a": 5.0, "a_ci": [4.9, 5.1],
              "b": 5.01, "b_ci": [4.95, 5.07], "rel": None, "rel_ci": [None, None], "verdict": "indistinguishable",
              "reasons": ["within_noise"], "within_noise": True}
    worse = {**within, "metric": "ttft", "a": 20.0, "b": 80.0, "rel": 3.0, "rel_ci": [2.8, 3.2], "verdict": "worse",
             "reasons": [], "within_noise": False}
    return {"invalid_inputs": [], "kind": "loadgen-compare", "baseline": "/nowhere/a", "method": {},
            "comparisons": [{"a": "/nowhere/a", "b": "/nowhere/b", "kind": "run", "variance": VARIANCE,
                             "metrics": [worse, within], "same_work": {"same": True, "differences": []},
                             "fail_if": []}],
            "failed_rules": [], "rules_not_evaluated": False}


def test_markdown_says_the_variance_and_shows_no_change_within_noise():
    md = render(_result(), "md")
    assert f"variance: {VARIANCE}" in md
    row = next(x for x in md.splitlines() if x.startswith("| p50 tpot"))
    assert "| - | - – - | indistinguishable | both within noise |" in row
    assert "+300.0%" in md


def test_html_says_the_variance():
    html = render(_result(), "html")
    assert 'data-s="comparisons.0.variance"' in html and "Welch&#x27;s t on the run means" in html
