"""Reasoning and tool-call streams end to end: `loadgen run` against the simulator streaming them
(--reasoning-tokens, --tool-calls), every stamp checked against the simulator's truth (sim_truth.parquet,
the same monotonic clock), as test_run.py checks plain streams: a client stamp is never before the server
wrote the token, and the median delivery delay stays within 2 ms of the host's own loop lateness p99."""
import statistics

import orjson
import polars as pl

from loadgen.results.folder import read_run
from tests.integration.conftest import RELAXED_SELFCHECK, loadgen, report_json, workload

MS = 1_000_000
TTFT_MS, ITL_MS, THINK, OUT = 20, 5, 6, 16   # the answer starts THINK tokens in: 30 ms after the first token


def run(tmp_path, sim_flags: str, *flags: str):
    out = tmp_path / "run"
    p = loadgen("run", workload(tmp_path, api="chat", rate="10/s", requests=20, max_tokens=OUT), "--out",
                str(out), "--quiet", "--no-calibrate", *RELAXED_SELFCHECK,
                "--sim-args", f"--mode fixed --ttft {TTFT_MS}ms --itl {ITL_MS}ms {sim_flags}", *flags)
    assert p.returncode == 0, p.stderr
    r = read_run(out)
    truth = pl.read_parquet(out / "sim_truth.parquet")
    t0 = r.manifest["t0"]["monotonic_ns"]
    rows = r.requests.join(truth.select("request_id", pl.col("first_answer_ns").alias("truth_answer_ns"),
                                        pl.col("reasoning_tokens").alias("truth_reasoning"), "token_ns"),
                           on="request_id")
    assert rows.height == 20 and (rows["outcome"] == "ok").all()
    return out, r, rows.with_columns((pl.col("first_answer_ns") + t0 - pl.col("truth_answer_ns")).alias("delay_ns"))


def delivered_in_time(r, delays_ns: list[int]) -> None:
    host_ms = r.manifest["generator"]["loop_lateness_ms"]["p99"]
    assert min(delays_ns) >= 0, "a first answer stamped before the server wrote it"
    assert statistics.median(delays_ns) / MS < 2 + host_ms, (statistics.median(delays_ns), host_ms)


def test_reasoning_stream_ttfa_against_the_truth(tmp_path):
    out, r, rows = run(tmp_path, f"--reasoning-tokens {THINK} --reasoning-field reasoning", "--slo", "ttfa=45ms")
    # the truth's first answer is token THINK; the client's first answer stamp follows it
    delivered_in_time(r, rows["delay_ns"].to_list())
    assert (rows["reasoning_tokens"] == rows["truth_reasoning"]).all() and (rows["truth_reasoning"] == THINK).all()
    assert (rows["output_tokens"] == OUT).all() and (rows["n_chunks"] == OUT).all()
    assert (rows["first_token_ns"] <= rows["first_answer_ns"]).all()
    s = report_json(str(out))
    lat = s["latency_ms"]
    assert lat["ttft"]["p50"] < lat["ttfa"]["p50"], lat
    # every answer was written >= TTFT + THINK * ITL = 50 ms after arrival (>= intended): a 45 ms bound is
    # missed by all, whatever the host did; a 10 s bound (reported again) is met by all
    assert s["slo"] == {"ttfa_ms": 45.0} and s["goodput"]["attainment_by_slo"]["ttfa"] == 0
    p = loadgen("report", str(out), "--format", "json", "--slo", "ttfa=10s")
    assert p.returncode == 0, p.stderr
    assert orjson.loads(p.stdout)["goodput"]["attainment_by_slo"] == {"ttfa": 1.0}
    text = loadgen("report", str(out))
    assert text.returncode == 0 and "ttfa" in text.stdout


def test_tool_call_stream_is_timed_against_the_truth(tmp_path):
    out, r, rows = run(tmp_path, "--tool-calls")
    assert (rows["first_answer_ns"] == rows["first_token_ns"]).all() and (rows["reasoning_tokens"] == 0).all()
    assert (rows["truth_answer_ns"] == rows["token_ns"].list.first()).all()
    delivered_in_time(r, rows["delay_ns"].to_list())
    assert (rows["output_tokens"] == OUT).all() and (rows["n_chunks"] == OUT).all()
    # every chunk stamped after the server wrote its token
    t0 = r.manifest["t0"]["monotonic_ns"]
    truth = dict(zip(rows["request_id"], rows["token_ns"].to_list()))
    delays = []
    for (rid,), toks in r.tokens.sort("request_id", "idx").group_by("request_id", maintain_order=True):
        client = (toks["t_ns"] + t0).to_list()
        assert len(client) == len(truth[rid]) == OUT
        assert all(c >= w for c, w in zip(client, truth[rid])), rid
        delays += [c - w for c, w in zip(client, truth[rid])]
    delivered_in_time(r, delays)
    lat = report_json(str(out))["latency_ms"]
    for m in ("ttft", "ttfa", "itl", "tpot", "e2e"):
        assert lat[m]["p50"] is not None, m
    assert lat["ttft"] == lat["ttfa"]
