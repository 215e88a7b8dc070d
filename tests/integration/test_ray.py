"""`loadgen run --ray auto` (loadgen/run/ray_workers.py): 2 actors on a one-node Ray cluster that sees loopback only.

Ray picks the machine's interface address even with --node-ip-address=127.0.0.1, so the cluster, the
simulator and the run all live in a network namespace of their own holding only `lo` (unshare -n, as
root), and in a PID namespace (-p -f): when its shell ends, or the test's timeout kills it, every process
started inside (the Ray head, its workers, the simulator) ends with it.
"""
import os
import shlex
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import orjson
import polars as pl
import pytest

from loadgen.results.folder import read_run
from loadgen.sim.truth import read_truth
from tests.integration.conftest import host_starved, loadgen, report_json, workload
from tests.integration.test_modes import files, keys

BIN = Path(sys.executable).parent
needs = [(os.geteuid() != 0, "needs root (unshare -n)"), (shutil.which("unshare") is None, "needs unshare"),
         (shutil.which("ip") is None, "needs ip (iproute2)"), (not (BIN / "ray").exists(), "needs the ray extra")]


# A functional test on a shared host: the self-check relaxed (the workload's own limits), and the Ray clock
# skew rule's floor at the bound this test checks itself (every arrival within 50 ms of plan at the median,
# offsets within their round trips): beside two CPU burners the skew exceeded the 2 ms default floor and
# made the run invalid (exit 3).
FLAGS = ("--quiet --no-calibrate --sim-args '--mode fixed --ttft 20ms --itl 5ms' --slo ttft=200ms "
         "--header 'X-Team: blue' --lag-floor 50ms")


@pytest.mark.skipif(any(c for c, _ in needs), reason="; ".join(r for c, r in needs if c))
def test_two_ray_actors_on_a_loopback_only_cluster(tmp_path):
    out, log = tmp_path / "run", tmp_path / "ray.log"
    w = workload(tmp_path, rate="20/s", requests=40, max_tokens=8)
    script = textwrap.dedent(f"""\
        set -u
        ip link set lo up
        export RAY_USAGE_STATS_ENABLED=0
        {BIN}/ray start --head --node-ip-address=127.0.0.1 --num-cpus=3 --include-dashboard=false \\
            --disable-usage-stats > {log} 2>&1 || exit 90
        {sys.executable} -m loadgen run {w} --ray auto --workers 2 --out {out} {FLAGS}
        rc=$?
        {BIN}/ray stop --force > /dev/null 2>&1
        exit $rc
        """)
    p = subprocess.run(["unshare", "-n", "-p", "-f", "--mount-proc", "bash", "-c", script],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, (p.returncode, p.stderr[-3000:], log.read_text()[-2000:] if log.exists() else "")
    m = orjson.loads((out / "manifest.json").read_bytes())
    assert m["status"] == "complete" and [x["status"] for x in m["workers"]] == ["complete", "complete"]
    ray = m["ray"]
    assert [x["worker"] for x in ray["nodes"]] == [0, 1] and ray["address"] == "auto"
    # one host, one wall clock: the measured offsets are within their own round trips
    assert all(abs(x["offset_ms"]) <= x["rtt_ms"] for x in ray["nodes"]), ray
    s = report_json(str(out))
    assert s["requests"] == {"scheduled": 40, "ok": 40, "failed": 0, "dropped": 0, "abandoned": 0}
    req = read_run(out).requests
    assert set(req["worker"]) == {0, 1} and req["idx"].to_list() == list(range(40))
    # the parts came back from the actors: every request reached the server once, when its actor says it
    # dispatched it, on the run's one timeline (both workers started from the one wall-clock instant)
    t0 = m["t0"]["monotonic_ns"]
    truth = pl.DataFrame(read_truth(out / "sim_truth.parquet")).select("request_id", "arrival_ns")
    j = req.join(truth, on="request_id")
    assert j.height == 40
    late_ms = (j["arrival_ns"] - t0 - j["intended_ns"]) / 1e6
    after_dispatch_ms = (j["arrival_ns"] - t0 - j["dispatched_ns"]) / 1e6
    # an actor starts from a wall-clock instant: its start is known only within its measured round trip
    rtt_ms = max(x["rtt_ms"] for x in ray["nodes"])
    assert late_ms.min() >= -rtt_ms, (late_ms.describe(), rtt_ms)
    assert after_dispatch_ms.min() >= -rtt_ms and after_dispatch_ms.median() < 50, (after_dispatch_ms.describe(),
                                                                                    rtt_ms)
    # at its planned time, where the host let the actors keep their clocks: beside two CPU burners both were
    # starved (their self-checks said so), dispatching 0.9 s late at the median and arriving 10 ms after that
    if not host_starved(m):
        assert late_ms.median() < 50, (late_ms.describe(), m["generator"])
    # the same folder as one process's run of the same workload (tests/integration/test_modes.py)
    one = tmp_path / "one"
    p = loadgen("run", w, "--out", str(one), *shlex.split(FLAGS), timeout=120)
    assert p.returncode == 0, p.stderr
    m1 = orjson.loads((one / "manifest.json").read_bytes())
    m.pop("ray"), m.pop("workers"), m["generator"].pop("workers")
    assert keys(m) == keys(m1) and m["client"] == m1["client"] and m["slo"] == m1["slo"]
    s1 = report_json(str(one))
    s["generator"].pop("workers")
    assert keys(s) == keys(s1) and "goodput" in s
    assert files(out) == files(one)
