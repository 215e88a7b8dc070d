"""loadgen predict: the simulator's engine in virtual time, checked on shapes whose answer is known in
closed form (profile step times computed by Profile.step_ns), and the CLI's output and bad input."""
from __future__ import annotations

import dataclasses
from importlib import resources

import numpy as np
import orjson
import pytest

from loadgen.cli.main import main
from loadgen.twin.predict import simulate
from loadgen.sim.profiles import load_profile

TINY = load_profile("tiny")


def ms(ns):
    return ns / 1e6


def test_one_request_at_idle_is_request_overhead_plus_prefill_then_decode_steps():
    p = dataclasses.replace(TINY, request_overhead_us=3000.0)
    df = simulate(p, np.array([5_000_000]), np.array([300]), np.array([4]))
    r = df.row(0, named=True)
    prefill = p.step_ns(300, 1, 300, 300 * 301 // 2, True)
    decode = [p.step_ns(1, 1, 300 + k + 1, 300 + k + 1, False) for k in range(3)]
    assert r["first_token_ns"] == 5_000_000 + 3_000_000 + prefill
    assert r["last_token_ns"] == r["first_token_ns"] + sum(decode)
    assert r["output_tokens"] == 4 and r["outcome"] == "ok"


def test_one_slot_queues_the_second_request_behind_the_first():
    p = dataclasses.replace(TINY, max_num_seqs=1)
    df = simulate(p, np.array([0, 0]), np.array([100, 100]), np.array([2, 2]))
    a, b = df.row(0, named=True), df.row(1, named=True)
    assert b["first_token_ns"] == a["last_token_ns"] + p.step_ns(100, 1, 100, 5050, True)


def test_too_long_a_prompt_is_an_error_row_not_an_exception():
    df = simulate(TINY, np.array([0, 0]), np.array([100, 9000]), np.array([2, 2]))
    assert df["outcome"].to_list() == ["ok", "error"]


def test_multi_token_steps_pay_their_extra():
    p = dataclasses.replace(TINY, multi_token_us=4000.0)
    assert p.step_ns(2, 2, 40, 40, False) - dataclasses.replace(p, multi_token_us=0).step_ns(2, 2, 40, 40, False) \
        == 4_000_000
    assert p.step_ns(1, 1, 40, 40, False) == TINY.step_ns(1, 1, 40, 40, False)


def workload(tmp_path):
    w = tmp_path / "w.toml"
    w.write_text('model = "m"\napi = "completions"\nseed = 1\n[arrivals]\nprocess = "poisson"\nrate = "1/s"\n'
                 '[run]\nrequests = 120\n[prompt]\ntokens = { dist = "uniform", min = 64, max = 512 }\n'
                 '[output]\ntokens = 32\n')
    return str(w)


def test_cli_json_points_and_knee(tmp_path, capsys):
    p = tmp_path / "one-slot.toml"
    src = (resources.files("loadgen.sim") / "profiles" / "tiny.toml").read_text()
    p.write_text(src.replace("max_num_seqs = 64", "max_num_seqs = 1"))
    assert main(["predict", workload(tmp_path), "--profile", str(p), "--rates", "5,10,200/s", "--format", "json",
                 "--out", str(tmp_path / "pred.json")]) == 0
    d = orjson.loads(capsys.readouterr().out)
    assert d == orjson.loads((tmp_path / "pred.json").read_bytes())
    pts = d["points"]
    assert [x["rate_per_s"] for x in pts] == [5, 10, 200]
    assert [x["keeps_up"] for x in pts] == [True, True, False]
    ttft = [x["latency_ms"]["ttft"]["p50"] for x in pts]
    assert ttft[0] < ttft[1] < ttft[2]
    k = d["knee"]
    assert 10 <= k["rate_per_s"] < k["first_saturated_per_s"] <= 200
    # one slot serves one request at a time: capacity = 1 / the mean service time (prefill + 31 decode steps)
    service_s = np.mean([(TINY.step_ns(n, 1, n, n * (n + 1) // 2, True)
                          + sum(TINY.step_ns(1, 1, n + j + 1, n + j + 1, False) for j in range(31))) / 1e9
                         for n in range(64, 513)])
    assert k["capacity_per_s"] == pytest.approx(1 / service_s, rel=0.05)
    assert pts[2]["completed_per_s"] == pytest.approx(1 / service_s, rel=0.1)


def test_cli_bad_input(tmp_path, capsys):
    wl = workload(tmp_path)
    assert main(["predict", wl, "--profile", "tiny", "--rates", "1,x"]) == 2
    assert "--rates: 'x' is not a rate" in capsys.readouterr().err
    assert main(["predict", wl, "--profile", str(tmp_path / "none.toml"), "--rates", "1"]) == 2
    assert "none.toml: no such file" in capsys.readouterr().err
    assert main(["predict", str(tmp_path / "missing.toml"), "--profile", "tiny", "--rates", "1"]) == 2
    assert "no such workload file" in capsys.readouterr().err


def one_slot():
    return dataclasses.replace(TINY, name="tiny-1-slot", max_num_seqs=1)


@pytest.mark.parametrize("profile", [TINY, load_profile("h100-sxm"), load_profile("a10g"), one_slot()],
                         ids=lambda p: p.name)
def test_the_capacity_is_the_largest_sustainable_rate_and_no_knee_is_above_it(tmp_path, profile):
    # Issue 24: predict printed a knee (195/s) above its own capacity (174/s). The capacity is the
    # saturated engine's steady rate; ground truth from the same engine: a long Poisson run at 0.9 x it
    # keeps its queue, one at 1.1 x grows it; and every knee, and every point that keeps up, is at most it.
    from loadgen.twin.predict import Plan, predict
    wl = workload(tmp_path)
    cap = Plan(wl, {}).capacity_per_s(profile)
    assert cap is not None and cap > 0
    # the plan's own (prompt, output) pairs, repeated, at Poisson arrivals of the given rate
    s = Plan(wl, {})._build(None)
    n = 3000
    prompt, out = np.resize(s.prompt_tokens, n), np.resize(s.max_tokens, n)
    gaps = np.random.default_rng(7).exponential(1.0, n)

    def growth_ms(rate):  # median TTFT of the last tenth of the run minus that of its second tenth
        rows = simulate(profile, (np.cumsum(gaps) * 1e9 / rate).astype(np.int64), prompt, out)
        ttft = (rows["first_token_ns"] - rows["intended_ns"]).to_numpy() / 1e6
        tenth = n // 10
        return float(np.median(ttft[-tenth:]) - np.median(ttft[tenth:2 * tenth]))
    # past the capacity the backlog grows by (1 - 1/1.1) n requests over the run: at 1.1x the last tenth
    # waits for at least a third of it; at 0.9x the queue does not grow by a tenth of that
    backlog_ms = (1 - 1 / 1.1) * n / cap * 1e3
    assert growth_ms(1.1 * cap) > backlog_ms / 3, backlog_ms
    assert growth_ms(0.9 * cap) < backlog_ms / 10, backlog_ms
    d = predict(wl, profile, [cap * f for f in (0.25, 0.6, 0.97, 1.05, 1.5, 3)])
    k = d["knee"]
    assert k["capacity_per_s"] == cap
    # the knees are at most the capacity (the finite runs' own rule may see saturation below it)
    assert k["bisected_rate_per_s"] < k["bisected_first_saturated_per_s"] <= cap * (1 + k["bisected_resolution_rel"])
    assert k["rate_per_s"] is not None and k["rate_per_s"] <= cap
    assert k["saturated"] and k["first_saturated_per_s"] <= cap * 1.05
    for p in d["points"]:
        assert p["above_capacity"] == (p["rate_per_s"] > cap or p["offered_per_s"] > cap)
        if p["keeps_up"]:
            assert p["rate_per_s"] <= cap and p["offered_per_s"] <= cap
    assert not any(p["keeps_up"] for p in d["points"][3:])
