"""Every run is cold unless it asks to share (issue 23): against one simulator with a prefix cache, a second
run of the same seed gets ~no hits by the server's own counters, a fixed --prompt-salt makes it hit, the
hits land in the rows (cached_tokens), the summary says the rate does not match the workload, and compare
refuses to call the runs the same work."""
from __future__ import annotations

import orjson
import polars as pl
import pytest

from loadgen.sim.process import SimProcess
from tests.integration.conftest import loadgen, report_json, workload


@pytest.fixture(scope="module")
def caching_sim():
    # the vLLM-like engine (its prefix cache counts tokens as vLLM's counters do), fast enough for 2 cores
    sim = SimProcess(args=["--prefix-caching", "--speed", "20"])
    sim.start()
    yield sim
    sim.stop()


def _run(sim, tmp_path, name, *flags, extra=""):
    out = tmp_path / name
    p = loadgen("run", workload(tmp_path, requests=30, max_tokens=4, rate="20/s", extra=extra), "--url", sim.url,
                "--out", str(out), "--no-calibrate", "--quiet", *flags)
    assert p.returncode == 0, p.stderr
    return out


def _manifest(out):
    return orjson.loads((out / "manifest.json").read_bytes())


def test_a_rerun_with_the_same_seed_is_cold_and_a_fixed_salt_is_warm(caching_sim, tmp_path):
    a = _run(caching_sim, tmp_path, "a")
    b = _run(caching_sim, tmp_path, "b")
    ma, mb = _manifest(a), _manifest(b)
    # a salt per run, recorded; the same seed keeps the lengths and times
    assert ma["config"]["prompt_salt"] != mb["config"]["prompt_salt"]
    ra, rb = pl.read_parquet(a / "requests.parquet"), pl.read_parquet(b / "requests.parquet")
    assert ra["planned_prompt_tokens"].to_list() == rb["planned_prompt_tokens"].to_list()
    assert ra["prompt_tokens"].to_list() == rb["prompt_tokens"].to_list()   # the server counted the same
    # the server's own counters: the second run of the same seed is as cold as the first
    for m in (ma, mb):
        cache = m["prefix_cache"]
        assert cache["queried_tokens"] == int(ra["prompt_tokens"].sum()), cache
        assert cache["hit_tokens"] == 0, cache
    assert rb["cached_tokens"].fill_null(0).sum() == 0
    assert report_json(str(b))["prefix_cache"]["hit_rate"] == 0.0

    # the same salt again: the same texts, so the server's cache hits, and says so per request too
    salt = str(ma["config"]["prompt_salt"])
    c = _run(caching_sim, tmp_path, "c", "--prompt-salt", salt)
    mc, rc = _manifest(c), pl.read_parquet(c / "requests.parquet")
    assert mc["config"]["prompt_salt"] == ma["config"]["prompt_salt"]
    hits = mc["prefix_cache"]["hit_tokens"]
    assert hits > 0.5 * mc["prefix_cache"]["queried_tokens"], mc["prefix_cache"]
    assert int(rc["cached_tokens"].fill_null(0).sum()) == hits   # rows and counters agree
    summary = report_json(str(c))["prefix_cache"]
    assert summary["source"] == "server counters" and summary["expected_hit_rate"] == 0.0
    assert "the cache was warm" in summary["mismatch"]
    text = loadgen("report", str(c)).stdout
    assert "prefix cache hit rate" in text and "WARNING: " + summary["mismatch"] in text
    assert "prefix_cache" in [d["rule"] for d in report_json(str(c))["diagnosis"]]

    # compare: not the same work
    p = loadgen("compare", str(a), str(c))
    assert p.returncode == 0, p.stderr
    assert "prefix-cache hit rate differs" in p.stdout and "TTFT differs by the cache" in p.stdout, p.stdout
    p = loadgen("compare", str(a), str(b))
    assert "prefix-cache hit rate differs" not in p.stdout, p.stdout


def test_a_shared_prefix_hits_within_the_run_as_the_workload_implies(caching_sim, tmp_path):
    out = _run(caching_sim, tmp_path, "p", "--prompt-tokens", "100",
               extra="[prefix]\ntokens = 64\ngroups = 1\nfraction = 1.0\n")
    summary = report_json(str(out))["prefix_cache"]
    assert summary["expected_hit_rate"] > 0.2 and summary["hit_rate"] > 0
    assert summary["mismatch"] is None, summary
    # cached tokens per request: the rows' usage figures, summarised and printed
    cached = pl.read_parquet(out / "requests.parquet").filter(pl.col("outcome") == "ok")["cached_tokens"]
    per = summary["per_request"]
    d = per["cached_tokens_per_request"]
    assert per["rows_reporting"] == cached.is_not_null().sum() > 0
    assert d["max"] == cached.max() and d["mean"] == pytest.approx(cached.drop_nulls().mean())
    assert d["p50"] == sorted(cached.drop_nulls().to_list())[(cached.drop_nulls().len() + 1) // 2 - 1]
    text = loadgen("report", str(out)).stdout
    assert f"cached tokens per request ({per['rows_reporting']} rows report them)" in text, text


def test_every_sweep_point_is_cold_and_shows_its_hit_rate(caching_sim, tmp_path):
    # the same seed at every point: before the salt, every point after the first hit the cache (issue 23)
    out = tmp_path / "sweep"
    p = loadgen("sweep", workload(tmp_path, requests=20, max_tokens=4), "--rates", "10,20/s", "--url",
                caching_sim.url, "--out", str(out), "--no-calibrate", "--quiet")
    assert p.returncode == 0, p.stderr
    s = orjson.loads((out / "sweep_summary.json").read_bytes())
    assert [q["prefix_cache_hit_rate"] for q in s["points"]] == [0.0, 0.0]
    assert "prefix-cache hit rate  10/s 0.0%  20/s 0.0%" in (out / "sweep_summary.txt").read_text()
    page = loadgen("report", str(out), "--format", "md").stdout
    assert "prefix-cache hits" in page


def test_a_session_s_history_hits_within_the_run(caching_sim, tmp_path):
    extra = '[session]\nturns = 3\nthink_ms = { dist = "fixed", value = 50 }\n'
    out = tmp_path / "s"
    p = loadgen("run", workload(tmp_path, requests=24, max_tokens=8, rate="8/s", api="chat", extra=extra),
                "--url", caching_sim.url, "--out", str(out), "--no-calibrate", "--quiet",
                "--prompt-tokens", "40")
    assert p.returncode == 0, p.stderr
    summary = report_json(str(out))["prefix_cache"]
    assert summary["expected_hit_rate"] > 0.3 and summary["hit_rate"] > 0.2, summary
    assert summary["mismatch"] is None, summary
