"""Workload classes with their own model and priority, end to end against the simulator run as vLLM is with
`--scheduling-policy priority` and LoRA adapters: each request carries its class's model and priority
(the simulator's truth says what it received), the high-priority class queues less (the truth's queue
times), and the report's per-class figures are the truth's."""
import textwrap

import numpy as np
import orjson
import polars as pl

from loadgen.metrics import quantiles
from loadgen.results.folder import read_run
from loadgen.sim.process import SimProcess
from tests.integration.conftest import RELAXED_SELFCHECK, host_lateness_ms, loadgen, report_json, skip_if_host_stalled

WORKLOAD = """
    model = "base"
    api = "chat"
    seed = 11
    [arrivals]
    process = "poisson"
    rate = "{rate}"
    [run]
    requests = {requests}
    drain_timeout = "60s"
    [[mix]]
    name = "interactive"
    weight = 0.5
    priority = 0
    prompt = 96
    output = 24
    [[mix]]
    name = "batch"
    weight = 0.5
    priority = 10
    model = "adapter-b"
    prompt = 96
    output = 24
    [request]
    extra_body = {{ ignore_eos = true }}
"""
SIM_ARGS = ["--profile", "tiny", "--model", "base", "--lora-modules", "adapter-b=/adapters/b",
            "--scheduling-policy", "priority", "--max-num-seqs", "2"]


def _run(tmp_path, rate="120/s", requests=160, slo=()):
    w = tmp_path / "w.toml"
    w.write_text(textwrap.dedent(WORKLOAD.format(rate=rate, requests=requests)))
    truth = tmp_path / "truth.jsonl"
    out = tmp_path / "run"
    with SimProcess(args=[*SIM_ARGS, "--truth", str(truth)]) as sim:
        p = loadgen("run", str(w), "--url", sim.url, "--out", str(out), "--quiet", "--no-calibrate",
                    *RELAXED_SELFCHECK, *slo, timeout=300)
    assert p.returncode == 0, p.stderr
    return out, pl.read_ndjson(truth)


def test_two_priority_classes_against_the_priority_scheduling_sim(tmp_path):
    out, truth = _run(tmp_path, slo=("--slo", "ttft=1s,ttft=50ms@interactive"))
    run = read_run(out)
    req = run.requests
    assert set(req["outcome"]) == {"ok"}
    # every row records its class, the model its body named and the priority it sent; the simulator got them
    classes = {"interactive": ("base", 0), "batch": ("adapter-b", 10)}
    got = req.join(truth, on="request_id", suffix="_sim")
    assert got.height == req.height
    for r in got.iter_rows(named=True):
        assert (r["model"], r["priority"]) == classes[r["class"]]
        assert (r["model_sim"], r["priority_sim"]) == classes[r["class"]]
    assert set(req["class"]) == set(classes)
    # the premise: the engine queued requests (2 sequences at a time under an offered load above that)
    q_ms = {c: got.filter(pl.col("class") == c)["queue_ns"].to_numpy() / 1e6 for c in classes}
    assert np.median(q_ms["batch"]) > 20, f"no queueing to order (batch queue p50 {np.median(q_ms['batch'])} ms)"
    # priority 0 is served before priority 10: its queueing (the simulator's own times) is lower
    assert np.median(q_ms["interactive"]) < np.median(q_ms["batch"]) / 2
    assert quantiles(q_ms["interactive"], [0.99])[0] < quantiles(q_ms["batch"], [0.99])[0]

    # the report's per-class p99s are the truth's: TTFT and e2e measured from each row's intended time to the
    # simulator's own send times, within what the host's lateness lets the client's stamps be late
    skip_if_host_stalled(out)
    slack_ms = max(host_lateness_ms(out).values()) + 2.0
    summary = report_json(str(out))
    by_class = summary["breakdown"]["by_class"]
    assert set(by_class) == set(classes)
    t0 = orjson.loads((out / "manifest.json").read_bytes())["t0"]["monotonic_ns"]
    for c in classes:
        g = got.filter((pl.col("class") == c) & ~pl.col("warmup"))
        intended = g["intended_ns"].to_numpy() + t0
        truth_ttft = (g["first_token_ns_sim"].to_numpy() - intended) / 1e6
        truth_e2e = (g["finish_ns"].to_numpy() - intended) / 1e6
        lat = by_class[c]["latency_ms"]
        assert abs(lat["ttft"]["p99"] - quantiles(truth_ttft, [0.99])[0]) <= slack_ms, (c, lat["ttft"])
        assert abs(lat["e2e"]["p99"] - quantiles(truth_e2e, [0.99])[0]) <= slack_ms, (c, lat["e2e"])
        assert by_class[c]["requests"] == g.height and by_class[c]["priority"] == [classes[c][1]]
        assert by_class[c]["model"] == [classes[c][0]]
    # per-model figures are the same groups here (one model per class)
    assert set(summary["breakdown"]["by_model"]) == {"base", "adapter-b"}
    # the per-class SLO: interactive is held to 50 ms, batch to the plain 1 s
    assert summary["slo"] == {"ttft_ms": 1000.0, "ttft_ms@interactive": 50.0}
    for c, bound_ms in (("interactive", 50.0), ("batch", 1000.0)):
        lat_ms = (got.filter(pl.col("class") == c)["first_token_ns"].to_numpy()) / 1e6
        met = int((lat_ms - got.filter(pl.col("class") == c)["intended_ns"].to_numpy() / 1e6 <= bound_ms).sum())
        assert by_class[c]["goodput"]["met"] == met


def test_a_model_the_server_does_not_list_is_named_before_the_run(tmp_path):
    w = tmp_path / "w.toml"
    w.write_text(textwrap.dedent(WORKLOAD.format(rate="5/s", requests=4)).replace('"adapter-b"', '"adapter-x"'))
    with SimProcess(args=SIM_ARGS) as sim:
        p = loadgen("run", str(w), "--url", sim.url, "--out", str(tmp_path / "run"), "--quiet", "--no-calibrate")
    assert p.returncode == 2, p.stderr
    assert "mix[1].model: 'adapter-x' is not served by the target" in p.stderr and "adapter-b" in p.stderr
    assert "Traceback" not in p.stderr


def test_compare_and_report_break_two_runs_down_per_class(tmp_path):
    # fixed mode (no queue): the classes still carry their models; compare and report work per class and model
    w = tmp_path / "w.toml"
    w.write_text(textwrap.dedent(WORKLOAD.format(rate="40/s", requests=60)))
    outs = []
    with SimProcess(args=["--mode", "fixed", "--ttft", "20ms", "--itl", "2ms", "--model", "base",
                          "--lora-modules", "adapter-b"]) as sim:
        for name in ("a", "b"):
            out = tmp_path / name
            p = loadgen("run", str(w), "--url", sim.url, "--out", str(out), "--quiet", "--no-calibrate",
                        *RELAXED_SELFCHECK)
            assert p.returncode == 0, p.stderr
            outs.append(str(out))
    p = loadgen("compare", *outs, "--format", "json", "--resamples", "200")
    assert p.returncode == 0, p.stderr
    c = orjson.loads(p.stdout)["comparisons"][0]
    assert set(c["by_class"]) == {"interactive", "batch"} and set(c["by_model"]) == {"base", "adapter-b"}
    for ms in c["by_class"].values():
        ttft_p99 = next(m for m in ms if (m["metric"], m["stat"]) == ("ttft", "p99"))
        assert ttft_p99["a"] >= 20 and ttft_p99["b"] >= 20   # the simulator's fixed 20 ms at least
    # each class's figures are its own rows': counted from requests.parquet
    n_interactive = read_run(outs[1]).requests.filter(pl.col("class") == "interactive").height
    assert 0 < n_interactive < 60
    text = loadgen("compare", *outs, "--resamples", "200").stdout
    assert "class interactive" in text and "model adapter-b" in text
    # a bound for a class the run lacks is named (exit 2), not silently left unapplied
    p = loadgen("report", outs[0], "--slo", "ttft=1s@nope")
    assert p.returncode == 2 and "--slo: no class 'nope' in the run (its classes: batch, interactive)" in p.stderr
    summary = report_json(outs[0])
    assert summary["breakdown"]["by_class"]["interactive"]["requests"] == \
        read_run(outs[0]).requests.filter(pl.col("class") == "interactive").height


def test_the_simulator_speaks_vllms_priority_and_adapter_names(tmp_path):
    import urllib.error
    import urllib.request

    def post(url, body):
        req = urllib.request.Request(url + "/v1/completions", data=orjson.dumps(body),
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return r.status, orjson.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, orjson.loads(e.read())

    truth = tmp_path / "truth.jsonl"
    with SimProcess(args=["--mode", "fixed", "--model", "base", "--lora-modules", "lora-a=/x", "lora-b",
                          "--truth", str(truth)]) as sim:
        with urllib.request.urlopen(sim.url + "/v1/models", timeout=10) as r:
            listed = orjson.loads(r.read())["data"]
        assert [(m["id"], m["parent"]) for m in listed] == [("base", None), ("lora-a", "base"), ("lora-b", "base")]
        assert post(sim.url, {"model": "lora-b", "prompt": "a b", "max_tokens": 2, "priority": -4})[0] == 200
        status, err = post(sim.url, {"model": "nope", "prompt": "a b", "max_tokens": 2})
        assert status == 404 and err["type"] == "NotFoundError"
        assert err["message"] == "The model `nope` does not exist. Valid aliases: base, lora-a, lora-b."
        status, err = post(sim.url, {"model": "base", "prompt": "a b", "max_tokens": 2, "priority": "high"})
        assert status == 400 and "'priority' must be an integer" in err["message"]
    rows = pl.read_ndjson(truth).sort("arrival_ns")
    assert rows.select("model", "priority", "http_status").rows() == [("lora-b", -4, 200), ("nope", 0, 404),
                                                                     ("", 0, 400)]
    # priority ordering needs a queue: fixed mode has none
    p = loadgen("sim", "--mode", "fixed", "--scheduling-policy", "priority", "--port", "0")
    assert p.returncode == 2 and "--scheduling-policy priority needs --mode engine" in p.stderr
