"""The diagnosis rules for failures and over-saturation (analysis/diagnose.py) on hand-made facts."""
from loadgen.analysis.diagnose import Facts, diagnose


def facts(by_outcome, top, counted=30, **kw):
    errors = {"counted": counted, "failed": sum(by_outcome.values()), "by_outcome": by_outcome, "top": top,
              "error_rate": sum(by_outcome.values()) / counted}
    return Facts(mean={}, ttft_mean_ms=None, by_prompt=[], errors=errors, **kw)


def rules(f):
    return {d["rule"]: d for d in diagnose(f)}


def test_all_failed_with_a_404_says_why_and_what_to_check():
    # issue 24: a quickstart against vLLM failed every request with 404 and the diagnosis said "no rule fired"
    f = facts({"http_error": 30}, [{"outcome": "http_error", "kind": "http_404", "count": 30,
                                    "text": '{"message": "The model `sim` does not exist."}'}])
    found = rules(f)
    assert list(found) == ["errors"]
    finding = found["errors"]["finding"]
    assert "30 of 30 requests failed (100.0%)" in finding and "does not exist" in finding
    assert "/v1/models" in found["errors"]["remedy"]


def test_each_failure_kind_has_its_rule_and_remedy():
    f = facts({"http_error": 2, "timeout": 3, "dropped": 4},
              [{"outcome": "dropped", "kind": "dropped", "count": 4, "text": "held back"},
               {"outcome": "timeout", "kind": "request_timeout", "count": 3, "text": ""},
               {"outcome": "http_error", "kind": "http_429", "count": 2, "text": "rate limited"}],
              request_timeout_ms=300.0)
    found = rules(f)
    assert set(found) == {"errors", "timeouts", "drops"}
    assert "lower the rate" in found["errors"]["remedy"]                       # 429: the server sheds load
    assert "3 of 30 requests timed out (--request-timeout 0.3 s)" in found["timeouts"]["finding"]
    assert "--max-concurrency" in found["drops"]["remedy"]
    assert rules(facts({}, [])) == {}                                          # nothing failed: nothing fires


def test_over_saturation_needs_both_falling_behind_and_a_growing_ttft():
    base = dict(offered_per_s=20.0, ttft_first_ms=50.0)
    assert "over_saturation" in rules(facts({}, [], completed_per_s=12.0, ttft_last_ms=400.0, **base))
    assert "over_saturation" not in rules(facts({}, [], completed_per_s=19.5, ttft_last_ms=400.0, **base))
    assert "over_saturation" not in rules(facts({}, [], completed_per_s=12.0, ttft_last_ms=60.0, **base))
