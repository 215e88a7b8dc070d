"""The twin's intervals (loadgen/twin/intervals.py) and `loadgen predict --level / --set`: Student's quantile
against its tables, the interval rule, a profile's [[rounds]] read back, and predict's intervals through the
engine (a round profile slower or faster than the point moves every figure the engine says it moves)."""
from __future__ import annotations

import dataclasses
import math
import statistics
from pathlib import Path

import orjson
import pytest

from loadgen.cli.main import main
from loadgen.sim.profiles import load_profile
from loadgen.twin.fit_model import EngineLimits, coefficients, to_profile, to_toml
from loadgen.analysis.repeats import t_quantile
from loadgen.twin.intervals import Spread, band, load_spread
from loadgen.twin.predict import predict
from tests.unit.test_predict import workload   # 120 requests, prompts 64-512, 32 output tokens

TINY = dataclasses.replace(load_profile("tiny"), max_num_seqs=4)
LIMITS = EngineLimits(TINY.model_name, TINY.max_num_seqs, TINY.max_num_batched_tokens, TINY.max_model_len,
                      TINY.params, TINY.weight_bytes)


@pytest.mark.parametrize("p, dof, table", [
    (0.9, 1, 3.078), (0.95, 2, 2.920), (0.9, 3, 1.638), (0.975, 3, 3.182), (0.9, 7, 1.415), (0.95, 7, 1.895),
    (0.975, 10, 2.228), (0.995, 30, 2.750)])
def test_t_quantile_matches_the_tables(p, dof, table):
    assert t_quantile(p, dof) == pytest.approx(table, rel=2e-3)


def test_band_is_the_prediction_interval_of_the_logs():
    rounds = [90.0, 100.0, 110.0, 105.0, 95.0]
    lo, hi = band(100.0, rounds, 0.8)
    half = t_quantile(0.9, 4) * statistics.stdev(math.log(x) for x in rounds) * math.sqrt(1 + 1 / 5)
    assert (lo, hi) == pytest.approx((100 * math.exp(-half), 100 * math.exp(half)))
    assert lo * hi == pytest.approx(100.0 ** 2)   # symmetric in log around the point
    assert band(100.0, rounds, 0.95)[1] > hi      # a higher level, a wider interval
    assert band(100.0, [100.0] * 4, 0.8) == [100.0, 100.0]
    # the fit's misfit adds in quadrature, in logs
    lo, hi = band(100.0, rounds, 0.8, misfit_rel=0.1)
    assert math.log(hi / 100) == pytest.approx(t_quantile(0.9, 4) * math.sqrt(
        statistics.variance(math.log(x) for x in rounds) * 1.2 + math.log(1.1) ** 2))
    assert band(100.0, [100.0] * 4, 0.8, misfit_rel=0.1)[1] == pytest.approx(100 * 1.1 ** t_quantile(0.9, 3))
    assert band(100.0, [100.0, None], 0.8) is None and band(None, rounds, 0.8) is None


def scaled(p, factor: float):
    """The profile with every step cost times `factor` (a server `factor` x slower), as a fit's round."""
    c = coefficients(p)
    return dataclasses.replace(c, **{k: v * factor for k, v in vars(c).items() if k != "request_overhead"})


def write_fitted(tmp_path, factors, memory_compute="max"):
    rounds = [{k: v * 1e6 for k, v in vars(scaled(TINY, f)).items()} for f in factors]
    path = tmp_path / "fitted.toml"
    path.write_text(to_toml(to_profile(coefficients(TINY), LIMITS, "fitted", "test", memory_compute), ["test"],
                            rounds=rounds, rms_rel=0.05))
    return path


def test_a_fitted_profiles_rounds_read_back(tmp_path):
    path = write_fitted(tmp_path, (0.9, 1.0, 1.1))
    profile = load_profile(str(path))   # the simulator ignores [[rounds]]
    spread = load_spread(str(path), profile)
    rounds = spread.rounds
    assert len(rounds) == 3 and spread.misfit_rel == 0.05
    for f, r in zip((0.9, 1.0, 1.1), rounds):
        got, want = coefficients(r), scaled(TINY, f)
        for k, v in vars(want).items():
            assert getattr(got, k) == pytest.approx(v, rel=1e-9, abs=1e-15), k
        assert (r.max_num_seqs, r.max_model_len, r.max_num_batched_tokens) == (4, TINY.max_model_len,
                                                                               TINY.max_num_batched_tokens)
    assert load_spread("tiny", TINY) == Spread([])
    # a round is fitted in the profile's form: a "sum" profile's rounds are "sum" profiles
    cpu = write_fitted(tmp_path, (0.9, 1.1), memory_compute="sum")
    assert {r.memory_compute for r in load_spread(str(cpu), load_profile(str(cpu))).rounds} == {"sum"}
    # a profile fitted before multi_token_kv existed has rounds without it: 0, as its profile's default
    path = write_fitted(tmp_path, (0.9, 1.0, 1.1))
    head, _, rest = path.read_text().partition("[[rounds]]")
    path.write_text(head + "[[rounds]]" + "\n".join(x for x in rest.splitlines() if not x.startswith("multi_token_kv")))
    assert [coefficients(r).multi_token_kv for r in load_spread(str(path), profile).rounds] == [0.0] * 3
    path.write_text(head + "[[rounds]]" + rest.replace("per_seq_us = ", "per_seq_us = -", 1))
    with pytest.raises(ValueError, match=r"fitted.toml: \[\[rounds\]\] #1: 'per_seq_us' must be a number >= 0"):
        load_spread(str(path), profile)


def test_predict_gives_each_figure_an_interval_from_the_rounds(tmp_path):
    wl = workload(tmp_path)
    rounds = [to_profile(scaled(TINY, f), LIMITS, f"r{f}", "") for f in (0.85, 0.95, 1.05, 1.15)]
    d = predict(wl, TINY, [50, 400], spread=Spread(rounds), level=0.8)
    assert d["interval"]["level"] == 0.8 and d["interval"]["rounds"] == 4
    for p in d["points"]:
        for m in ("ttft", "tpot", "e2e"):
            lo, hi = p["latency_interval_ms"][m]["p50"]
            assert lo < p["latency_ms"][m]["p50"] < hi, (m, p)
        assert 0 <= p["keeps_up_share"] <= 1
    k = d["knee"]
    lo, hi = k["capacity_interval_per_s"]
    assert lo < k["capacity_per_s"] < hi
    # the interval holds the speeds the rounds had: a server 15 % slower or faster than the point
    for f in (0.85, 1.15):
        alt = predict(wl, to_profile(scaled(TINY, f), LIMITS, "alt", ""), [50, 400])
        assert lo <= alt["knee"]["capacity_per_s"] <= hi
        a, b = d["points"][0]["latency_interval_ms"]["ttft"]["p50"]
        assert a <= alt["points"][0]["latency_ms"]["ttft"]["p50"] <= b
    # identical rounds: no spread, an interval of zero width
    same = predict(wl, TINY, [50], spread=Spread([TINY, TINY, TINY]))
    p = same["points"][0]
    assert p["latency_interval_ms"]["ttft"]["p50"] == [p["latency_ms"]["ttft"]["p50"]] * 2


def test_cli_level_set_and_bad_input(tmp_path, capsys):
    wl, path = workload(tmp_path), write_fitted(tmp_path, (0.9, 1.0, 1.1))
    assert main(["predict", wl, "--profile", str(path), "--rates", "50,400", "--format", "json"]) == 0
    d8 = orjson.loads(capsys.readouterr().out)
    assert main(["predict", wl, "--profile", str(path), "--rates", "50,400", "--format", "json",
                 "--level", "0.95"]) == 0
    d95 = orjson.loads(capsys.readouterr().out)
    w8, w95 = (d["knee"]["capacity_interval_per_s"] for d in (d8, d95))
    assert w95[0] < w8[0] < w8[1] < w95[1]
    assert main(["predict", wl, "--profile", str(path), "--rates", "50,400"]) == 0
    text = capsys.readouterr().out
    assert "80% intervals (the same plan through each of the fit's 3 round profiles, and its misfit 5.0%" in text
    # what if: one slot instead of four serves one request at a time
    assert main(["predict", wl, "--profile", str(path), "--rates", "50,400", "--format", "json",
                 "--set", "max_num_seqs=1"]) == 0
    one = orjson.loads(capsys.readouterr().out)
    assert one["set"] == {"max_num_seqs": 1}
    assert one["knee"]["capacity_per_s"] < 0.5 * d8["knee"]["capacity_per_s"]
    assert one["knee"]["capacity_interval_per_s"][1] < d8["knee"]["capacity_interval_per_s"][0]
    assert main(["predict", wl, "--profile", str(path), "--rates", "50", "--set", "max_num_seqs=1"]) == 0
    assert "max_num_seqs = 1" in capsys.readouterr().out.splitlines()[0]
    # a shipped profile has no rounds: no intervals, no error
    assert main(["predict", wl, "--profile", "tiny", "--rates", "50", "--format", "json"]) == 0
    assert "interval" not in orjson.loads(capsys.readouterr().out)
    for args, msg in ((["--set", "max_num_seqs=0"], "--set max_num_seqs: '0' must be a whole number >= 1"),
                      (["--set", "speed=2"], "--set 'speed=2': give KEY=VALUE with KEY one of max_num_seqs"),
                      (["--level", "1"], "--level: '1' must be a number between 0 and 1"),
                      (["--level", "nan"], "--level: 'nan' must be a number between 0 and 1")):
        assert main(["predict", wl, "--profile", str(path), "--rates", "50", *args]) == 2
        err = capsys.readouterr().err
        assert msg in err and "Traceback" not in err


def test_a_sweeps_html_page_draws_the_prediction_and_its_intervals(tmp_path, capsys):
    sweep = Path(__file__).parent.parent / "data" / "report_pages" / "sweep_summary.json"
    pred, page = tmp_path / "pred.json", tmp_path / "page.html"
    assert main(["predict", workload(tmp_path), "--profile", str(write_fitted(tmp_path, (0.9, 1.0, 1.1))),
                 "--rates", "8,16,64", "--format", "json", "--out", str(pred)]) == 0  # capacity ~56/s
    capsys.readouterr()
    assert main(["report", str(sweep), "--format", "html", "--prediction", str(pred), "--out", str(page)]) == 0
    html = page.read_text()
    svg = html[html.index('id="sweep-latency"'):]
    svg = svg[:svg.index("</svg>")]
    assert "predicted ttft p99" in svg and "predicted e2e p50" in svg and 'class="mark band"' in svg
    assert "predicted capacity" in svg
    assert "predicted tpot p50" in html and "<script" not in html
    for args, msg in (([str(sweep), "--format", "md", "--prediction", str(pred)], "on a sweep's HTML page only"),
                      ([str(sweep), "--format", "html", "--prediction", str(sweep)], "not the output of `loadgen "
                                                                                     "predict --format json`"),
                      ([str(sweep), "--format", "html", "--prediction", str(tmp_path / "none.json")], "none.json")):
        assert main(["report", *args]) == 2
        err = capsys.readouterr().err
        assert msg in err and "Traceback" not in err
