"""Errors decide (issue 24): a run whose requests fail beyond --max-error-rate is invalid (exit 3) with the
counts and the most frequent error texts named, at the end of the run, in the summary and in every report
format; below it the run stays valid and still shows them; the diagnosis names errors and timeouts."""
import orjson

from tests.integration.conftest import loadgen, report_json, workload


def _run(tmp_path, *flags, requests=30, max_tokens=8):
    out = tmp_path / "r"
    p = loadgen("run", workload(tmp_path, requests=requests, rate="40/s", max_tokens=max_tokens),
                "--out", str(out), "--quiet", "--no-calibrate", *flags, timeout=150)
    return p, out


def test_thirty_percent_http_errors_make_the_run_invalid_and_are_named(tmp_path):
    p, out = _run(tmp_path, "--sim-args", "--faults http500=0.3 --seed 5")
    assert p.returncode == 3, p.stderr
    manifest = orjson.loads((out / "manifest.json").read_bytes())
    errors = [r for r in manifest["invalid_reasons"] if r.startswith("errors:")]
    assert errors and "http_500" in errors[0] and "of 30 requests failed" in errors[0], manifest["invalid_reasons"]
    assert "--max-error-rate" in errors[0]
    assert "failures:" in p.stderr and "http_500" in p.stderr, p.stderr
    s = report_json(str(out))
    assert s["valid"] is False
    e = s["errors"]
    assert e["failed"] == s["outcomes"]["http_error"] and 0.1 < e["error_rate"] < 0.6, e
    assert e["top"][0]["kind"] == "http_500" and e["top"][0]["count"] == e["failed"]
    assert e["top"][0]["text"]  # the server's error body, cleaned
    assert "errors" in {f["rule"] for f in s["diagnosis"]}
    text = loadgen("report", str(out)).stdout
    assert "most frequent" in text and "http_500" in text and "no rule fired" not in text
    for fmt in ("md", "html"):
        page = loadgen("report", str(out), "--format", fmt).stdout
        assert "Errors" in page and "http_500" in page, fmt


def test_a_run_whose_requests_all_time_out_is_invalid_and_diagnosed(tmp_path):
    # 4000 tokens at ~1.5 ms a step take seconds; each request is cut off after 300 ms, past its head
    # (status 200), so the target was reachable: the error rule, not the unreachable one, decides
    p, out = _run(tmp_path, "--request-timeout", "300ms", requests=6, max_tokens=4000)
    assert p.returncode == 3, p.stderr
    manifest = orjson.loads((out / "manifest.json").read_bytes())
    assert any(r.startswith("errors: 6 of 6 requests failed") and "timeout" in r
               for r in manifest["invalid_reasons"]), manifest["invalid_reasons"]
    s = report_json(str(out))
    assert s["outcomes"] == {"timeout": 6} and s["errors"]["error_rate"] == 1.0
    rules = {f["rule"] for f in s["diagnosis"]}
    assert "timeouts" in rules, s["diagnosis"]
    assert "no rule fired" not in loadgen("report", str(out)).stdout


def test_errors_below_the_threshold_leave_the_run_valid_but_shown(tmp_path):
    p, out = _run(tmp_path, "--sim-args", "--faults http500=0.3 --seed 5", "--max-error-rate", "60%")
    assert p.returncode == 0, p.stderr
    assert "failures:" in p.stderr and "http_500" in p.stderr
    s = report_json(str(out))
    assert s["valid"] is True and s["errors"]["failed"] > 0
    assert "errors" in {f["rule"] for f in s["diagnosis"]}
    assert "http_500" in loadgen("report", str(out)).stdout
