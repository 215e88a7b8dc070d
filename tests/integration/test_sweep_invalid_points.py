"""Issue 24, item 4: an invalid sweep point is measured once more, then excluded with its reasons, never
wiping the knee; the search does not escalate past a point that stays invalid. Through run_sweep (the
library entry point of `loadgen sweep`) against the fixed-mode simulator; the invalid runs are made
invalid by the self-check's own rule (a 1 ns send-lag limit no run can meet), chosen per rate."""
import textwrap
from dataclasses import replace

import orjson

from loadgen.config.workload import load
from loadgen.run.launch import run_workload
from loadgen.run.sweep import SweepSpec, run_sweep

SIM = ("--mode", "fixed", "--ttft", "20ms", "--itl", "5ms")


def config(tmp_path):
    w = tmp_path / "w.toml"
    w.write_text(textwrap.dedent("""
        model = "sim"
        seed = 1
        [arrivals]
        process = "constant"
        rate = "1/s"
        [run]
        requests = 40   # 2-8 s a point: a busy host's stall of 100 ms does not read as falling behind
        max_send_lag_p99 = "10s"
        max_rate_deviation = 10
        max_cv_deviation = 100
        max_lag_share = 1   # only the 1 ns send-lag limit below makes a point invalid
        [prompt]
        tokens = 16
        tokenizer = "approximate"
        [output]
        tokens = 8
        """))
    return load(w, {"--no-calibrate": True}, sim_args=SIM)


def runner(invalid: dict[float, int]):
    """run_workload, but the first invalid[rate] runs at that rate are held to a 1 ns send-lag limit."""
    calls: list[float] = []

    def run_point(cfg, progress=None):
        r = cfg.arrivals.rate_per_s
        calls.append(r)
        if invalid.get(r, 0) > 0:
            invalid[r] -= 1
            cfg = replace(cfg, max_send_lag_p99_ns=1)
        return run_workload(cfg, progress=progress)
    return run_point, calls


def test_an_invalid_low_point_is_rerun_then_excluded_and_the_knee_stands(tmp_path):
    run_point, calls = runner({5.0: 2, 10.0: 1})  # 5/s invalid twice, 10/s once (its rerun is valid)
    out = tmp_path / "sw"
    o = run_sweep(config(tmp_path), SweepSpec(rates=(5.0, 10.0, 20.0)), out, progress=None, run_point=run_point)
    s = o.summary
    assert o.status == "complete" and calls == [5.0, 5.0, 10.0, 10.0, 20.0]
    by_rate = {p["rate_per_s"]: p for p in s["points"]}
    assert not by_rate[5.0]["valid"] and by_rate[10.0]["valid"] and by_rate[10.0]["rerun_of_invalid"]
    assert any("lag" in r for r in by_rate[10.0]["rerun_of_invalid"])
    # the knee is of the valid points (a fixed-latency server keeps up at both), the excluded one named
    assert s["knee"]["rate_per_s"] == 20.0 and s["knee"]["base_rate_per_s"] == 10.0, s
    assert [x["rate_per_s"] for x in s["knee"]["excluded"]] == [5.0] and s["knee"]["excluded"][0]["reasons"]
    text = (out / "sweep_summary.txt").read_text()
    assert "excluded   5/s: invalid" in text and "knee       20/s" in text
    m = orjson.loads((out / "sweep.json").read_bytes())
    assert [p["status"] for p in m["points"]] == ["invalid", "complete", "complete"]


def test_a_series_takes_a_point_invalid_twice_as_its_upper_bracket(tmp_path):
    run_point, calls = runner({20.0: 2})
    o = run_sweep(config(tmp_path), SweepSpec(start_per_s=10.0), tmp_path / "sw", progress=None,
                  run_point=run_point)
    assert calls == [10.0, 20.0, 20.0]  # 40/s is never measured: 20/s could not be
    s = o.summary
    assert (s["search"]["lo"], s["search"]["hi"]) == (10.0, 20.0)
    assert s["knee"]["rate_per_s"] == 10.0 and not s["knee"]["saturated"], s
    assert [x["rate_per_s"] for x in s["knee"]["excluded"]] == [20.0]
