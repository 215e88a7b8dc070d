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
