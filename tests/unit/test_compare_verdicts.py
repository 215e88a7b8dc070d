"""`loadgen compare` says what happened and why, on synthetic results folders (tests/synthetic_run.py):
an invalid or interrupted input is named first in every format and stops --fail-if (exit 3) unless
--allow-invalid; every "indistinguishable" carries its reasons; a metric whose both sides lie within the
noise floor gets no relative change."""
from pathlib import Path

import numpy as np
import orjson
import polars as pl
import pytest

from loadgen.analysis import compare
from loadgen.cli.main import main
from tests.synthetic_run import MS, make_run
from tests.unit.test_report_pages import check_html_numbers

N = 200


def edit_manifest(run: Path, **changes) -> None:
    m = orjson.loads((run / "manifest.json").read_bytes())
    for k, v in changes.items():
        m[k] = v
    (run / "manifest.json").write_bytes(orjson.dumps(m))


def delay_first_token(run: Path, delay_ms: float) -> None:
    """Every request's tokens come delay_ms later (TTFT and e2e grow by exactly that, ITL does not)."""
    d = int(delay_ms * MS)
    req = pl.read_parquet(run / "requests.parquet")
    req = req.with_columns(*(pl.col(c) + d for c in ("response_ns", "first_token_ns", "last_token_ns", "done_ns")))
    req.write_parquet(run / "requests.parquet")
    tok = pl.read_parquet(run / "tokens.parquet")
    tok.with_columns(pl.col("t_ns") + d).write_parquet(run / "tokens.parquet")


@pytest.fixture
def pair(tmp_path):
    return make_run(tmp_path / "a", N, seed=1), make_run(tmp_path / "b", N, seed=1)


def run_compare(capsys, *args) -> tuple[int, str, str]:
    rc = main(["compare", *map(str, args), "--resamples", "200"])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_an_invalid_side_is_named_first_in_text_json_and_pages(pair, tmp_path, capsys):
    a, b = pair
    edit_manifest(b, status="invalid", invalid_reasons=["send_lag p99 is 9.00 ms (> 5 ms)"])
    rc, text, err = run_compare(capsys, a, b)
    assert rc == 0     # no --fail-if: nothing to gate, the warning is the finding
    assert text.splitlines()[0] == f"INVALID INPUT: B {b} is invalid: send_lag p99 is 9.00 ms (> 5 ms)", text
    assert "send_lag p99 is 9.00 ms" in err
    js = tmp_path / "c.json"
    assert main(["compare", str(a), str(b), "--resamples", "200", "--format", "json", "--out", str(js),
                 "--fail-if", "p99 ttft > +10%"]) == 3
    raw = js.read_text()
    assert raw.splitlines()[1].lstrip().startswith('"invalid_inputs"')    # the first key
    assert orjson.loads(raw)["invalid_inputs"] == [{"side": "B", "run": str(b), "status": "invalid",
                                                    "invalid_reasons": ["send_lag p99 is 9.00 ms (> 5 ms)"]}]
    for fmt in ("html", "md"):
        page = tmp_path / f"c.{fmt}"
        assert main(["report", str(js), "--format", fmt, "--out", str(page)]) == 0
        body = page.read_text()
        if fmt == "html":
            keyed, stray = check_html_numbers(body, orjson.loads(raw))
            assert stray == [] and ("data-s", "invalid_inputs.0.invalid_reasons.0") in keyed, stray
            assert ("data-k", "comparisons.0.noise_floor.ms") in keyed and "were not evaluated" in body
            body = body[body.index("<body"):]
            assert body.index("INVALID INPUT") < body.index("<h1>"), body[:500]
        else:
            assert body.splitlines()[0].startswith(f"**INVALID INPUT**: B `{b}` is invalid: send_lag p99"), body
    # a valid pair says nothing of the kind
    rc, text, _ = run_compare(capsys, a, a)
    assert "INVALID" not in text


def test_fail_if_is_not_evaluated_against_an_invalid_or_interrupted_side(pair, capsys):
    a, b = pair
    delay_first_token(b, 50.0)     # TTFT p50 ~5 ms -> ~55 ms: the rule would hold
    rc, text, _ = run_compare(capsys, a, b, "--fail-if", "p50 ttft > +10%")
    assert rc == 4, text           # the premise: on valid runs the rule holds
    edit_manifest(a, status="interrupted", invalid_reasons=[])
    rc, text, err = run_compare(capsys, a, b, "--fail-if", "p50 ttft > +10%")
    assert rc == 3 and "--allow-invalid" in err, err
    assert text.splitlines()[0] == f"INVALID INPUT: A {a} is interrupted: run status is 'interrupted'", text
    assert "not evaluated" in text and "FAILED" not in text
    # told to, compare evaluates the rule and still names the interrupted side first
    rc, text, _ = run_compare(capsys, a, b, "--fail-if", "p50 ttft > +10%", "--allow-invalid")
    assert rc == 4 and text.startswith("INVALID INPUT: A") and "FAILED" in text, text


def test_indistinguishable_says_why_and_names_the_noise_floor(pair, tmp_path, capsys):
    a, b = pair
    delay_first_token(b, 60.0)
    edit_manifest(b, generator={**orjson.loads((b / "manifest.json").read_bytes())["generator"],
                                "loop_lateness_ms": {"p99": 116.6}})
    js = tmp_path / "c.json"
    assert main(["compare", str(a), str(b), "--resamples", "200", "--format", "json", "--out", str(js)]) == 0
    c = orjson.loads(js.read_bytes())["comparisons"][0]
    assert c["noise_floor"] == {"ms": 116.6, "a_ms": 0.0, "b_ms": 116.6, "run": "B", "path": str(b),
                                "source": f"client loop-lateness p99 of B ({b})"}
    m = {(e["metric"], e["stat"]): e for e in c["metrics"]}
    # e2e p90 (~245 ms) moved by exactly 60 ms: resolved, far above 5 %, yet below B's 116.6 ms lateness
    e2e = m["e2e", "p90"]
    assert e2e["resolved"] and e2e["rel"] > 0.05 and max(e2e["a"], e2e["b"]) > 116.6, e2e
    assert e2e["diff"] == pytest.approx(60.0, abs=1e-6)
    assert e2e["verdict"] == "indistinguishable" and e2e["reasons"] == ["below_noise_floor"], e2e
    assert "116.6 ms" in e2e["why"] and f"loop-lateness p99 of B ({b})" in e2e["why"]
    # every indistinguishable metric carries at least one reason; a verdict carries none
    for e in c["metrics"]:
        assert bool(e["reasons"]) == (e["verdict"] == "indistinguishable") and bool(e["why"]) == bool(e["reasons"])
    rc, text, _ = run_compare(capsys, a, b)
    assert f"noise floor 116.6 ms: client loop-lateness p99 of B ({b})" in text, text
    row = next(line for line in text.splitlines() if line.startswith("e2e") and " p90 " in line)
    assert row.endswith("indistinguishable (< noise floor)"), row


def test_no_relative_change_when_both_sides_are_within_the_noise_floor(pair, tmp_path, capsys):
    a, b = pair
    delay_first_token(b, 20.0)     # TTFT p50 ~5 ms -> ~25 ms: "+400 %", all of it inside a 116.6 ms floor
    edit_manifest(a, generator={**orjson.loads((a / "manifest.json").read_bytes())["generator"],
                                "loop_lateness_ms": {"p99": 116.6}})
    js = tmp_path / "c.json"
    assert main(["compare", str(a), str(b), "--resamples", "200", "--format", "json", "--out", str(js)]) == 0
    c = orjson.loads(js.read_bytes())["comparisons"][0]
    ttft = next(e for e in c["metrics"] if (e["metric"], e["stat"]) == ("ttft", "p50"))
    assert ttft["b"] - ttft["a"] == pytest.approx(20.0, abs=1e-6) and ttft["b"] < 116.6   # the premise
    assert ttft["within_noise"] and ttft["rel"] is None and ttft["rel_ci"] == [None, None], ttft
    assert ttft["reasons"] == ["within_noise"] and ttft["verdict"] == "indistinguishable"
    rc, text, _ = run_compare(capsys, a, b)
    row = next(line for line in text.splitlines() if line.startswith("ttft ") and " p50 " in line)
    assert "%" not in row and row.endswith("indistinguishable (both within noise)"), row
    assert f"{ttft['a']:.3f}" in row and f"{ttft['b']:.1f}" in row      # the absolute values stay


@pytest.mark.parametrize("a_val, b_val, lo_hi, floor_ms, reasons", [
    # resolved, large, above the floor: a verdict, no reason
    (200.0, 280.0, (0.99, 1.01), 3.9, []),
    # the CI of the change spans 0
    (200.0, 230.0, (0.5, 1.5), 0.0, ["ci_includes_zero"]),
    # resolved but small
    (200.0, 204.0, (0.999, 1.001), 0.0, ["below_min_effect"]),
    # resolved, 25 %, but the 2 ms move is under a 3.9 ms floor while A is above it
    (8.0, 10.0, (0.99, 1.01), 3.9, ["below_noise_floor"]),
    # both inside the floor: within noise (a 0.2 ms component against -0.65 ms would be "-425 %")
    (0.2, -0.65, (0.99, 1.01), 3.9, ["within_noise"]),
    # both inside the floor, but the move across zero is larger than it: judged as any change (worse: up)
    (-3.0, 3.0, (0.99, 1.01), 3.9, []),
    # both zero
    (0.0, 0.0, (1.0, 1.0), 0.0, ["within_noise"]),
])
def test_each_reason_for_indistinguishable(a_val, b_val, lo_hi, floor_ms, reasons):
    a_draws = a_val * np.linspace(*lo_hi, 100)
    b_draws = np.full(100, b_val)
    e = compare._entry("m", "mean", "ms", "lower", a_draws, b_draws, a_val, b_val, 0.05, floor_ms, "test floor")
    assert e["reasons"] == reasons, e
    assert e["verdict"] == ("indistinguishable" if reasons else "worse")   # every B here is above A
    assert e["within_noise"] == (reasons == ["within_noise"])
    if e["within_noise"]:
        assert e["rel"] is None and e["diff"] == pytest.approx(b_val - a_val)
