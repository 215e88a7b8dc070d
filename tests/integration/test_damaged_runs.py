"""Issue 15 defects 8 and 6: `kill -9` of `loadgen run` takes the simulator it started with it
(PR_SET_PDEATHSIG), and `loadgen report` of the folder says what was lost (planned vs found, the last
second recorded); a damaged .hlog line is a named error (exit 2), not a traceback."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson

from tests.integration.conftest import loadgen, workload


def _children(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        out += [int(x) for x in (task / "children").read_text().split()]
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/status").read_text().split("State:")[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state not in ("Z", "X")


def _wait(cond, timeout_s: float) -> bool:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.1)
    return cond()


def test_kill_9_takes_the_simulator_along_and_report_says_what_was_lost(tmp_path):
    out = tmp_path / "r"
    run = subprocess.Popen([sys.executable, "-m", "loadgen", "run", workload(tmp_path, rate="20/s", requests=400),
                            "--out", str(out), "--no-calibrate", "--quiet",
                            "--sim-args", "--mode fixed --ttft 5ms --itl 1ms"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    sims: list[int] = []
    try:
        assert _wait(lambda: len(list((out / "_parts").glob("requests-*.parquet"))) >= 2, 60)
        sims = _children(run.pid)
        assert sims
        os.kill(run.pid, signal.SIGKILL)
        run.wait(10)
        assert _wait(lambda: not any(_alive(p) for p in sims), 15), "the simulator outlived its parent"
    finally:
        for p in [run.pid, *sims]:
            if _alive(p):
                os.kill(p, signal.SIGKILL)
    rep = loadgen("report", str(out), "--format", "json")
    assert rep.returncode == 0, rep.stderr
    s = orjson.loads(rep.stdout)
    lost = s["lost"]
    assert lost["status"] == "running" and lost["planned"] == 400 and 0 < lost["found"] < 400
    assert lost["missing"] == 400 - lost["found"] and lost["last_recorded_s"] > 0 and lost["alive"] is False
    assert s["valid"] is False and any("have a row" in r for r in s["invalid_reasons"])
    text = loadgen("report", str(out)).stdout
    assert f"{lost['found']} of 400 planned requests have a row" in text

    hlog = out / "ttft.hlog"
    lines = hlog.read_text().split("\n")
    bad = next(i for i, line in enumerate(lines) if line and not line.startswith(("#", '"')))
    lines[bad] = lines[bad][:-8] + "!!garbage"
    hlog.write_text("\n".join(lines))
    rep = loadgen("report", str(out))
    assert rep.returncode == 2 and f"ttft.hlog:{bad + 1}: bad interval line" in rep.stderr, rep.stderr
    assert "Traceback" not in rep.stderr
