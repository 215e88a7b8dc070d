"""[abandon] (issue 26, item 7): a share of requests cut off by the client after a drawn time or number of
tokens, end to end against the built-in simulator through `loadgen run` and `loadgen report`. Judged
against the simulator's truth: the requests the plan abandons, and only those, are the ones the server saw
go (`client_gone`), each row keeps what it had received, and the server freed their slots."""
import os
import textwrap

import orjson
import polars as pl
import pytest

from loadgen.results.folder import read_run
from tests.integration.conftest import RELAXED_SELFCHECK, loadgen, report_json

SIM = "--sim-args=--mode fixed --ttft 50ms --itl 10ms"   # a 60-token reply streams for ~0.65 s


def abandoning_run(tmp_path, abandon: str, *extra: str, transport: str = "raw", sim: str = ""):
    w = tmp_path / "w.toml"
    w.write_text(textwrap.dedent("""
        model = "sim"
        api = "chat"
        seed = 5
        [arrivals]
        process = "poisson"
        rate = "20/s"
        [run]
        requests = 40
        [prompt]
        tokens = 16
        tokenizer = "approximate"
        [output]
        tokens = 60
        [request]
        extra_body = { ignore_eos = true }
        [abandon]
        share = 0.4
        """) + abandon)
    out = tmp_path / "run"
    p = loadgen("run", str(w), "--out", str(out), "--quiet", "--no-calibrate", f"{SIM} {sim}".strip(),
                *RELAXED_SELFCHECK, *extra,
                env={**os.environ, "LOADGEN_TRANSPORT": transport})
    assert p.returncode == 0, p.stderr
    truth = pl.read_parquet(out / "sim_truth.parquet").select("request_id", "outcome", "output_tokens")
    return read_run(out), truth, report_json(str(out))


def test_abandoned_after_a_time_are_cut_there_and_their_slots_freed(tmp_path):
    run, truth, summary = abandoning_run(tmp_path, 'after_ms = 200\n', "--scrape-metrics", "--scrape-interval", "100ms")
    req = run.requests.join(truth, on="request_id", suffix="_truth")
    planned = req.filter(pl.col("abandon_after_ns").is_not_null())
    assert 5 < planned.height < 30 and set(planned["abandon_after_ns"].to_list()) == {200_000_000}
    # the planned ones, and only they, were cut: the server saw the client go
    assert set(planned["outcome"]) == {"abandoned"} and set(planned["outcome_truth"]) == {"client_gone"}
    rest = req.filter(pl.col("abandon_after_ns").is_null())
    assert set(rest["outcome"]) == {"ok"} and set(rest["outcome_truth"]) == {"ok"}
    # cut at their point (after dispatch), with the tokens that had arrived by then: some, not all
    lived_ms = (planned["done_ns"] - planned["dispatched_ns"]) / 1e6
    assert (lived_ms >= 200).all() and planned["first_token_ns"].is_not_null().all()
    assert (planned["output_tokens"] < 60).all() and (planned["output_tokens"] >= 1).all()
    assert (planned["output_tokens"] <= planned["output_tokens_truth"]).all()   # never more than was sent
    a = summary["abandoned"]
    assert a["planned"] == a["abandoned"] == planned.filter(~pl.col("warmup")).height and a["by"] == "time"
    assert summary["requests"]["failed"] == 0 and summary["errors"]["error_rate"] == 0
    # the simulator frees a closed request's slot at once: it never holds more requests than the client
    slots = a["server_slots"]
    assert slots["scrapes"] >= 3 and slots["freed"] is True, slots
    text = loadgen("report", str(run.path)).stdout
    assert f"abandoned  {a['abandoned']} of {a['planned']} planned (by time" in text
    assert "the server freed their slots" in text


def test_a_server_that_generates_on_for_a_closed_connection_is_said_not_to_free_slots(tmp_path):
    # the same run against a simulator that keeps generating abandoned requests to their end
    run, truth, summary = abandoning_run(tmp_path, 'after_ms = 200\n', "--scrape-metrics", "--scrape-interval",
                                         "100ms", sim="--ignore-disconnect")
    slots = summary["abandoned"]["server_slots"]
    assert summary["abandoned"]["abandoned"] > 5 and slots["freed"] is False, slots
    assert slots["excess_max"] >= 2
    assert "did NOT free their slots" in loadgen("report", str(run.path)).stdout


@pytest.mark.parametrize("transport", ["raw", "aiohttp"])
def test_abandoned_after_tokens_are_cut_at_the_first_read_reaching_their_count(tmp_path, transport):
    run, truth, summary = abandoning_run(tmp_path, 'after_tokens = { dist = "uniform", min = 3, max = 12 }\n',
                                         transport=transport)
    req = run.requests.join(truth, on="request_id", suffix="_truth")
    planned = req.filter(pl.col("abandon_after_tokens").is_not_null())
    assert planned.height > 5 and set(planned["outcome"]) == {"abandoned"}
    assert set(planned["outcome_truth"]) == {"client_gone"}
    last_read = (run.tokens.sort("request_id", "idx").group_by("request_id").agg(pl.col("n_tokens").last()))
    p = planned.join(last_read, on="request_id")
    # the count was reached by the last read and not before it (the chat stream's role-only first event
    # is not counted)
    assert ((p["output_tokens"] >= p["abandon_after_tokens"])
            & (p["output_tokens"] - p["n_tokens"] < p["abandon_after_tokens"])).all(), p.select(
        "abandon_after_tokens", "output_tokens", "n_tokens")
    assert summary["abandoned"]["by"] == "tokens" and summary["abandoned"]["server_slots"] is None
    manifest = orjson.loads((run.path / "manifest.json").read_bytes())
    assert manifest["config"]["abandon"]["share"] == 0.4
