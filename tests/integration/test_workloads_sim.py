"""Workload shapes against the simulator: exact prompt lengths by its /tokenize, multi-turn sessions
and shared prefixes end to end."""
import itertools
import textwrap

import numpy as np
import orjson
import polars as pl
import pytest

from loadgen.plan.prompts import PromptMaker
from loadgen.probe.server_tokenizer import ServerTokenizer
from loadgen.results.folder import read_run
from tests.integration.conftest import RELAXED_SELFCHECK, loadgen

# 1..16 exhaustively, every power of two up to 8192 and its neighbours, and 20 seeded picks.
LENGTHS = sorted(set(range(1, 17)) | {x + d for k in range(4, 14) for d in (-1, 0, 1) for x in [2 ** k]} - {8193}
                 | set(np.random.default_rng(0).integers(1, 8193, 20).tolist()))


def test_exact_prompt_lengths_by_the_sims_tokenize(fixed_sim):
    tok = ServerTokenizer(fixed_sim.url)
    maker = PromptMaker(tok)
    rng = np.random.default_rng(1)
    for n in LENGTHS:
        text = maker.text(n, rng)
        assert tok.count(text) == n, n
        assert len(set(text.split())) == n  # not one repeated token
    n = len(LENGTHS)
    assert maker.summary() == {"prompts": n, "checked": n, "exact": n, "max_abs_error": 0}
    assert max(LENGTHS) == 8192


def run_workload(tmp_path, fixed_sim, extra: str, api: str = "chat", requests: int = 6) -> pl.DataFrame:
    w = tmp_path / "w.toml"
    w.write_text(textwrap.dedent(f"""
        model = "sim"
        api = "{api}"
        seed = 7
        [arrivals]
        process = "poisson"
        rate = "10/s"
        [run]
        requests = {requests}
        drain_timeout = "20s"
        [prompt]
        tokens = {{ dist = "uniform", min = 40, max = 80 }}
        [output]
        tokens = 6
        [request]
        extra_body = {{ ignore_eos = true }}
        """) + textwrap.dedent(extra))
    out = tmp_path / "run"
    p = loadgen("run", str(w), "--url", fixed_sim.url, "--out", str(out), "--quiet", *RELAXED_SELFCHECK)
    assert p.returncode == 0, p.stderr
    run = read_run(out)
    assert run.manifest["workload"]["tokenizer"]["mode"] == "server"
    return run.requests.sort("idx")


@pytest.mark.parametrize("api", ["chat", "completions"])
def test_multi_turn_sessions_against_the_sim(tmp_path, fixed_sim, api):
    req = run_workload(tmp_path, fixed_sim, "[session]\nturns = 3\nthink_ms = 100\n", api=api, requests=3)
    assert req.height == 9 and set(req["outcome"]) == {"ok"}
    assert req["session"].to_list() == [0, 0, 0, 1, 1, 1, 2, 2, 2] and req["turn"].to_list() == [0, 1, 2] * 3
    rows = req.to_dicts()
    # a later turn is due think time after the previous reply completed, or when its body (fitted to the
    # server's count of the history, client/runner.py) was ready, if that took longer: never earlier, and
    # later only when some body took longer than the think time to prepare (the manifest's session_turns)
    prepare_max_ns = read_run(tmp_path / "run").manifest["generator"]["session_turns"]["prepare_max_ms"] * 1e6
    for prev, r in itertools.pairwise(rows):
        if r["turn"]:
            late_ns = r["intended_ns"] - (prev["done_ns"] + 100_000_000)
            assert late_ns == 0 if prepare_max_ns < 100_000_000 else late_ns >= 0, (late_ns, prepare_max_ns)
            assert r["prompt_tokens"] > prev["prompt_tokens"] + prev["output_tokens"]
    if api == "chat":  # the sim counts message contents only: the plan matches the server exactly
        assert req["prompt_tokens"].to_list() == req["planned_prompt_tokens"].to_list()


def test_shared_prefix_against_the_sim(tmp_path, fixed_sim):
    req = run_workload(tmp_path, fixed_sim, "[prefix]\ntokens = 30\ngroups = 2\nfraction = 0.7\n", requests=20)
    assert set(req["outcome"]) == {"ok"} and req["session"].null_count() == 20
    groups = req["prefix_group"].drop_nulls()
    assert 0 < len(groups) < 20 and set(groups) <= {0, 1}
    assert req["prompt_tokens"].to_list() == req["planned_prompt_tokens"].to_list()


def test_trace_replay_with_skip_count_in_the_manifest(tmp_path, fixed_sim):
    trace = tmp_path / "t.csv"
    trace.write_text("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
                     "0,m,20,4,24,C\n0.1,m,x,4,24,C\n0.2,m,30,0,30,C\n0.3,m,25,5,30,C\n")
    w = tmp_path / "w.toml"
    w.write_text('model = "sim"\napi = "completions"\n[prompt]\ntokens = 5\n[output]\ntokens = 5\n'
                 '[request]\nextra_body = { ignore_eos = true }\n')
    out = tmp_path / "run"
    p = loadgen("run", str(w), "--url", fixed_sim.url, "--out", str(out), "--quiet", "--trace", str(trace))
    assert p.returncode == 2 and f"{trace}:3: Request tokens is not an integer" in p.stderr
    p = loadgen("run", str(w), "--url", fixed_sim.url, "--out", str(out), "--quiet", "--trace", str(trace),
                "--skip-bad-rows", *RELAXED_SELFCHECK)
    assert p.returncode == 0, p.stderr
    run = read_run(out)
    assert run.manifest["workload"]["trace"]["skipped"] == {"bad_rows": 1, "failed": 1}
    assert run.requests.sort("idx")["planned_prompt_tokens"].to_list() == [20, 25]
    assert orjson.loads(orjson.dumps(run.manifest["config"]["trace"]))["skip_bad_rows"] is True
