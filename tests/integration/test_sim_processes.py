"""`loadgen sim --processes N` (sim/multi.py): one port, one truth file, stop, a dying child, bad flags."""
from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import aiohttp
import pytest

from loadgen.results.folder import read_run
from loadgen.sim.process import SimProcess
from loadgen.sim.truth import read_truth
from tests.integration.conftest import loadgen, report_json, workload
from tests.integration.sim_helpers import stream_completion


def children(pid: int) -> list[int]:
    return [int(x) for x in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def test_run_of_200_against_2_processes_every_request_once_in_the_truth(tmp_path):
    # the built-in simulator (no --url) with --processes 2: its truth is sim_truth.parquet, written by
    # the parent from the shared journal once both children have stopped. 50/s x 32 tokens at 10 ms:
    # ~18 requests in flight, so many connections, which the kernel spreads over both processes.
    out = tmp_path / "run"
    p = loadgen("run", workload(tmp_path, rate="50/s", requests=200, max_tokens=32), "--out", str(out),
                "--quiet", "--no-calibrate", "--sim-args", "--mode fixed --ttft 20ms --itl 10ms --processes 2",
                timeout=180)
    assert p.returncode == 0, p.stderr
    s = report_json(str(out))
    assert s["requests"] == {"scheduled": 200, "ok": 200, "failed": 0, "dropped": 0, "abandoned": 0}
    rows = read_truth(out / "sim_truth.parquet")
    ids = Counter(r["request_id"] for r in rows)
    assert len(ids) == 200 and set(ids.values()) == {1}
    assert set(ids) == set(read_run(out).requests["request_id"].to_list())
    assert all(r["outcome"] == "ok" and r["output_tokens"] == 32 for r in rows)
    served = Counter(r["sim_process"] for r in rows)
    assert set(served) == {0, 1}, served


def test_sigterm_stops_every_process_and_leaves_a_complete_truth(tmp_path):
    truth = tmp_path / "truth.jsonl"
    sim = SimProcess(args=["--mode", "fixed", "--ttft", "5ms", "--itl", "200ms", "--truth", str(truth),
                           "--processes", "2"])
    sim.start()
    kids = children(sim.proc.pid)
    assert len(kids) == 2

    async def go_until_stopped():
        async with aiohttp.ClientSession() as s:
            await asyncio.gather(*[stream_completion(s, sim.url, {"prompt": "a", "max_tokens": 2, "stream": True},
                                                     request_id=f"done-{i}") for i in range(6)])
            pending = [asyncio.ensure_future(stream_completion(
                s, sim.url, {"prompt": "a", "max_tokens": 100, "stream": True}, request_id=f"open-{i}"))
                for i in range(6)]
            await asyncio.sleep(1.5)  # every open stream reached a simulator (20 s each)
            assert sim.stop() == 0
            await asyncio.gather(*pending, return_exceptions=True)

    asyncio.run(go_until_stopped())
    assert not any(Path(f"/proc/{pid}").exists() for pid in kids)  # stopped and reaped by the parent
    rows = read_truth(truth)
    ids = Counter(r["request_id"] for r in rows)
    assert ids == Counter({f"{k}-{i}": 1 for k in ("done", "open") for i in range(6)})
    by_id = {r["request_id"]: r for r in rows}
    assert all(by_id[f"done-{i}"]["outcome"] == "ok" for i in range(6))
    assert all(by_id[f"open-{i}"]["outcome"] in ("interrupted", "client_gone") for i in range(6))


def test_a_child_that_dies_is_reported_and_the_parent_exits_1(tmp_path):
    truth = tmp_path / "truth.parquet"
    sim = SimProcess(args=["--mode", "fixed", "--truth", str(truth), "--processes", "2"])
    sim.start()
    victim = children(sim.proc.pid)[0]
    os.kill(victim, signal.SIGKILL)
    try:
        code = sim.proc.wait(30)
    finally:
        sim.stop()
    assert code == 1
    sim._stderr_done.wait(5)
    said = "\n".join(sim.stderr_tail)
    assert f"(pid {victim}) exited with code -9" in said, said
    assert read_truth(truth) == []  # finished (parquet written, journal gone) though empty
    assert not (tmp_path / "truth.parquet.partial.jsonl").exists()


@pytest.mark.parametrize("flags, needle", [
    (["--mode", "fixed", "--processes", "0"], "--processes"),
    (["--mode", "fixed", "--processes", "two"], "--processes"),
    (["--processes", "2"], "--processes 2 needs --mode fixed"),  # engine mode (the default) is refused
])
def test_bad_processes_exit_2_with_message(flags, needle):
    p = subprocess.run([sys.executable, "-m", "loadgen", "sim", "--port", "0", *flags],
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 2
    assert needle in p.stderr and "Traceback" not in p.stderr
