"""The bench's C server (tests/bench/fastmock.c, BENCH_SERVER=fastmock) answers loadgen as the simulator's fixed
mode does, and its truth is true: one truth row per request, every token stamped by the server before the
client read it (one CLOCK_MONOTONIC on both sides), each token sent at its due time or later. The C reference
client (tests/bench/cclient.c) and the bare client writing from its timer's callback (bare_cb.py) read what
fastmock sends."""
from __future__ import annotations

import shutil
import subprocess
import sys

import orjson
import polars as pl
import pytest

from tests.bench.fastmock import FastMock, build
from tests.integration.conftest import loadgen, workload

TTFT_MS, ITL_MS, TOKENS = 20, 5, 8


@pytest.mark.skipif(shutil.which("gcc") is None, reason="no gcc to build tests/bench/fastmock.c")
def test_fastmock_streams_and_its_truth_holds(tmp_path):
    mock = FastMock(tmp_path / "truth.jsonl", ttft_us=TTFT_MS * 1000, itl_us=ITL_MS * 1000)
    mock.start()
    try:
        w = workload(tmp_path, rate="40/s", requests=40, max_tokens=TOKENS, tokenizer="approximate")
        p = loadgen("run", w, "--url", mock.url, "--out", str(tmp_path / "run"), "--no-calibrate",
                    "--model", "m")
    finally:
        mock.stop()
    assert p.returncode == 0, p.stderr
    req = pl.read_parquet(tmp_path / "run" / "requests.parquet")
    assert req["outcome"].to_list() == ["ok"] * 40
    assert req["output_tokens"].to_list() == [TOKENS] * 40
    truth = pl.read_ndjson(tmp_path / "truth.jsonl")
    assert sorted(truth["request_id"]) == sorted(req["request_id"])
    due = (truth.explode("token_ns", "lateness_ns")
           .with_columns(idx=pl.int_range(pl.len()).over("request_id")))
    # token i was due at arrival + TTFT + i x ITL and sent then or later: lateness = sent - due >= 0
    assert (due["token_ns"] - due["lateness_ns"] - due["arrival_ns"]
            == TTFT_MS * 1_000_000 + due["idx"] * ITL_MS * 1_000_000).all()
    assert (due["lateness_ns"] >= 0).all()
    t0 = int(orjson.loads((tmp_path / "run" / "manifest.json").read_bytes())["t0"]["monotonic_ns"])
    tok = pl.read_parquet(tmp_path / "run" / "tokens.parquet").with_columns(t_ns=pl.col("t_ns") + t0)
    j = tok.join(due.select("request_id", "idx", "token_ns"), on=["request_id", "idx"], how="inner")
    assert j.height == 40 * TOKENS
    assert (j["t_ns"] >= j["token_ns"]).all()   # the client read each token after the server sent it


@pytest.mark.skipif(shutil.which("gcc") is None, reason="no gcc to build tests/bench/cclient.c")
@pytest.mark.parametrize("client", ["c", "bare-cb"])
def test_the_reference_clients_read_every_token_after_it_was_sent(tmp_path, client):
    # tests/bench/cclient.c (bench_fast's client `c`) and bare_cb.py (`bare-cb`, writing from its timer's
    # callback): every request sent once, on its Poisson schedule or after, and each token counted in a read
    # stamped after fastmock sent it
    mock = FastMock(tmp_path / "truth.jsonl", ttft_us=TTFT_MS * 1000, itl_us=ITL_MS * 1000)
    url = mock.start()
    try:
        args = ([str(build("cclient")), "127.0.0.1", url.rsplit(":", 1)[1]] if client == "c"
                else [sys.executable, "-m", "tests.bench.bare_cb", url])
        p = subprocess.run([*args, "40", "1", str(TOKENS), str(tmp_path / "c.json")], capture_output=True,
                           text=True, timeout=60)
    finally:
        mock.stop()
    assert p.returncode == 0, p.stderr
    reqs = orjson.loads((tmp_path / "c.json").read_bytes())["requests"]
    truth = {r["request_id"]: r for r in map(orjson.loads, (tmp_path / "truth.jsonl").read_bytes().splitlines())}
    assert len(reqs) == 40 and sorted(truth) == sorted(r["request_id"] for r in reqs)
    for r in reqs:
        assert r["sent_ns"] >= r["intended_ns"]
        stamps = [t for t, k in zip(r["read_ns"], r["chunks"]) for _ in range(k)]   # one per token
        sent = truth[r["request_id"]]["token_ns"]
        assert len(stamps) == len(sent) == TOKENS
        assert all(read >= s for read, s in zip(stamps, sent))
