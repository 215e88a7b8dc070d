"""A `--workers` run's processes live and die with their driver (loadgen/run/workers.py): a signal to the
driver's PID alone (SIGINT, SIGTERM, kill -9) leaves no worker loading the server, and the folder is read
by `report` (complete and interrupted after SIGINT/SIGTERM, partial after kill -9)."""
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request

import orjson
import pytest

from loadgen.results.folder import read_run
from loadgen.sim.process import SimProcess
from tests.integration.conftest import loadgen, report_json, workload

PLANNED = 200   # 10 s at 20/s: the signal comes ~3 s in


@pytest.fixture()
def sim():
    s = SimProcess(args=["--mode", "fixed", "--ttft", "20ms", "--itl", "5ms"])
    s.start()
    yield s
    s.stop()


def served(sim) -> int:
    """Requests the simulator has finished (its /metrics counter)."""
    text = urllib.request.urlopen(sim.url + "/metrics", timeout=10).read().decode()
    line = next(x for x in text.splitlines() if x.startswith("vllm:request_success_total"))
    return int(float(line.rsplit(" ", 1)[1]))


def alive(pid: int) -> bool:
    # a zombie (exited, not reaped yet) counts as gone: it sends nothing
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def wait_until(predicate, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return predicate()


def start_run(tmp_path, sim):
    out = tmp_path / "run"
    w = workload(tmp_path, rate="20/s", requests=PLANNED, max_tokens=4)
    proc = subprocess.Popen([sys.executable, "-m", "loadgen", "run", w, "--workers", "2", "--url", sim.url,
                             "--out", str(out), "--quiet", "--no-calibrate"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    manifest = out / "manifest.json"
    assert wait_until(manifest.is_file, 90), "the run did not start"  # written at t0, with the workers' pids
    running = orjson.loads(manifest.read_bytes())
    assert running["status"] == "running"
    pids = [e["pid"] for e in running["workers"]]
    assert len(pids) == 2 and all(alive(p) for p in pids)
    # ~3 s into the run: requests are being served (the premise of "no more after")
    assert wait_until(lambda: served(sim) >= 20, 60), "the workers sent nothing"
    return proc, out, pids


def stop_and_check(proc, sig, pids, sim) -> tuple[int, str]:
    os.kill(proc.pid, sig)
    try:
        _, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert wait_until(lambda: not any(alive(p) for p in pids), 30), f"orphan workers: {pids}"
    after = served(sim)
    time.sleep(1.5)  # the plan had ~7 s to go: a worker still sending would be seen here
    assert served(sim) == after < PLANNED
    return proc.returncode, err


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_to_the_driver_stops_every_worker_and_leaves_a_complete_folder(tmp_path, sim, sig):
    proc, out, pids = start_run(tmp_path, sim)
    code, err = stop_and_check(proc, sig, pids, sim)
    assert code == 130, err
    run = read_run(out)
    assert run.manifest["status"] == "interrupted"
    assert run.requests.height == PLANNED and run.requests["idx"].n_unique() == PLANNED
    assert not (out / "_parts").exists()  # merged: the folder of a finished run
    assert {"ok", "cancelled"} <= set(run.requests["outcome"])
    assert "worker_died" not in set(run.requests["error_kind"].drop_nulls())
    s = report_json(str(out))
    assert s["lost"] is None and s["valid"] is False


def test_kill_9_of_the_driver_leaves_no_worker_and_a_partial_folder(tmp_path, sim):
    proc, out, pids = start_run(tmp_path, sim)
    code, _ = stop_and_check(proc, signal.SIGKILL, pids, sim)
    assert code == -signal.SIGKILL
    # the workers stopped as for SIGTERM: each wrote its share and its record under _parts/
    assert all((out / "_parts" / f"manifest-{w}.json").is_file() for w in range(2))
    s = report_json(str(out))
    assert s["valid"] is False and s["lost"]["status"] == "running" and s["lost"]["alive"] is False
    assert s["lost"]["planned"] == PLANNED
    assert any("did not finish" in r and "driver" in r for r in s["invalid_reasons"]), s["invalid_reasons"]
    # a driver killed before any part reached its folder (a Ray driver: the parts are on the actors'
    # nodes) leaves its manifest alone: still read, as partial, in every format
    bare = tmp_path / "bare"
    bare.mkdir()
    shutil.copy(out / "manifest.json", bare / "manifest.json")
    s = report_json(str(bare))
    assert s["lost"]["found"] == 0 and s["lost"]["missing"] == PLANNED and s["valid"] is False
    for fmt in ("text", "html", "md"):
        r = loadgen("report", str(bare), "--format", fmt)
        assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert f"0 of {PLANNED} planned requests have a row" in loadgen("report", str(bare)).stdout


@pytest.mark.parametrize("how", ["SIGTERM to the driver", "SIGINT to the process group"])
def test_a_signal_during_the_workers_set_up_stops_them_quietly_and_leaves_no_folder(tmp_path, sim, how):
    out = tmp_path / "run"
    w = workload(tmp_path, rate="20/s", requests=PLANNED, max_tokens=4)
    proc = subprocess.Popen([sys.executable, "-m", "loadgen", "run", w, "--workers", "2", "--url", sim.url,
                             "--out", str(out)],  # calibration on: the set-up takes a while
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        said = ""
        while "workers started" not in said:
            line = proc.stderr.readline()
            assert line, said  # the driver ended before it started its workers
            said += line
        pids = [int(x) for x in said.rsplit("(pids ", 1)[1].split(")")[0].split(", ")]
        assert not (out / "manifest.json").exists()  # the premise: still setting up, before t0
        if how.startswith("SIGTERM"):
            os.kill(proc.pid, signal.SIGTERM)
        else:
            os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130 and "Traceback" not in err, err
    assert wait_until(lambda: not any(alive(p) for p in pids), 30), f"orphan workers: {pids}"
    assert not out.exists()  # stopped before t0: the folder is as it was (none)
    after = served(sim)  # worker 0's calibration probes may have been answered; nothing comes after
    time.sleep(1.5)
    assert served(sim) == after
