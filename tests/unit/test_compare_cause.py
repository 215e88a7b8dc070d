"""`compare` names the cause of a TTFT change from the decomposition (analysis/compare.ttft_cause): the
component before the first token (queue, prefill) whose mean moved by at least half of TTFT's mean change,
in its direction; none when TTFT has no verdict, when no component explains half of it, or without a
decomposition on both sides."""
import numpy as np

from loadgen.analysis import compare

RNG = np.random.default_rng(3)


def entry(metric: str, a_mean: float, b_mean: float, n: int = 400) -> dict:
    a = RNG.normal(a_mean, 1.0, n)
    b = RNG.normal(b_mean, 1.0, n)
    idx = np.random.default_rng(0).integers(0, n, (300, n))
    da, db = a[idx].mean(axis=1), b[idx].mean(axis=1)
    return compare._entry(metric, "mean", "ms", "lower", da, db, float(a.mean()), float(b.mean()), 0.05)


def metrics(ttft: tuple[float, float], queue: tuple[float, float], prefill: tuple[float, float]) -> list[dict]:
    return [entry("ttft", *ttft), entry("decomposition.queue", *queue), entry("decomposition.prefill", *prefill),
            entry("decomposition.decode", 500.0, 520.0)]


def test_queueing_named_when_the_queue_explains_the_ttft_drop():
    c = compare.ttft_cause(metrics((400.0, 100.0), (320.0, 30.0), (75.0, 65.0)))
    assert c["verdict"] == "better" and c["cause"] == "queueing" and c["component"] == "queue"
    assert c["diff_ms"] < -290 and c["shares"]["queue"] > 0.9 and 0 < c["shares"]["prefill"] < 0.1
    assert c["why"].startswith("TTFT mean fell ") and "queueing: the decomposition's queue mean explains" in c["why"]


def test_prefill_named_when_prefill_grew_and_none_when_no_part_explains_half():
    c = compare.ttft_cause(metrics((100.0, 200.0), (20.0, 30.0), (75.0, 160.0)))
    assert c["verdict"] == "worse" and c["cause"] == "prefill" and c["shares"]["prefill"] > 0.8
    assert "TTFT mean rose" in c["why"]
    # 40 % from each: neither is the cause (the rest is outside queue and prefill)
    c = compare.ttft_cause(metrics((100.0, 200.0), (20.0, 60.0), (75.0, 115.0)))
    assert c["cause"] is None and c["component"] is None and "no component explains 50% of it" in c["why"]
    # the queue moved against TTFT: the largest share in TTFT's direction is prefill's
    c = compare.ttft_cause(metrics((100.0, 200.0), (60.0, 20.0), (30.0, 170.0)))
    assert c["cause"] == "prefill" and c["shares"]["queue"] < 0


def test_no_cause_without_a_ttft_verdict_or_a_decomposition():
    assert compare.ttft_cause(metrics((100.0, 100.5), (20.0, 30.0), (75.0, 70.0))) is None   # indistinguishable
    assert compare.ttft_cause([entry("ttft", 400.0, 100.0)]) is None
    assert compare._cause_line(None) == []
    c = compare.ttft_cause(metrics((400.0, 100.0), (320.0, 30.0), (75.0, 65.0)))
    assert compare._cause_line(c) == [f"cause of the TTFT change: {c['why']}"]


def test_the_pages_show_the_cause():
    from loadgen.report.sweep_pages import render
    from tests.unit.test_report_pages import check_html_numbers
    ms = metrics((400.0, 100.0), (320.0, 30.0), (75.0, 65.0))
    c = {"a": "A", "b": "B", "kind": "run", "invalid": [], "metrics": ms, "ttft_cause": compare.ttft_cause(ms),
         "same_work": {"same": True, "differences": []}, "fail_if": [],
         "noise_floor": {"ms": 1.0, "a_ms": 1.0, "b_ms": 0.5, "run": "A", "path": "A", "source": "A"}}
    d = {"invalid_inputs": [], "kind": "loadgen-compare", "schema_version": 1, "baseline": "A",
         "method": {"resampling": "blocks", "resamples": 300, "seed": 0, "confidence": 0.95, "min_effect": 0.05,
                    "percentiles": "nearest rank", "allow_invalid": False}, "comparisons": [c], "failed_rules": [],
         "rules_not_evaluated": False}
    html = render(d, "html")
    keyed, _ = check_html_numbers(html, d)
    assert keyed[("data-s", "comparisons.0.ttft_cause.why")] == c["ttft_cause"]["why"]
    assert f"Cause of the TTFT change: {c['ttft_cause']['why']}" in render(d, "md")
