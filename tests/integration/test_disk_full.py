"""Issue 25 item 1: a full disk, one process and --workers 2. The results folder on a real 2 MB tmpfs,
nearly full: `loadgen run` stops at the first failed write with exit 5 (ExitCode.STORAGE) and one
message naming the file and ENOSPC, no traceback; the parts flushed before stay, `report` reads them
and says the rest is missing because the disk was full (not "killed"). Needs root (mount); skipped
only where mount is refused."""
import os
import subprocess

import orjson
import polars as pl
import pytest

from loadgen.errors import ExitCode
from tests.integration.conftest import loadgen, workload

TMPFS_BYTES = 2 * 1024 * 1024
FREE_BYTES = 200 * 1024  # the reserve (64 KiB) and about two parts: the run's rows need more


@pytest.fixture
def nearly_full_disk(tmp_path):
    disk = tmp_path / "disk"
    disk.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    m = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={TMPFS_BYTES}", "tmpfs", str(disk)],
                       capture_output=True, text=True)
    if m.returncode != 0:
        pytest.skip(f"mount refused: {m.stderr.strip()}")
    try:
        free = os.statvfs(disk).f_bavail * os.statvfs(disk).f_frsize
        (disk / "filler").write_bytes(bytes(free - FREE_BYTES))
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_full_disk_stops_the_run_keeps_what_was_flushed_and_report_says_why(tmp_path, fixed_sim,
                                                                             nearly_full_disk, workers):
    out = nearly_full_disk / "run"
    planned = 300
    run = loadgen("run", workload(tmp_path, rate="50/s", requests=planned, max_tokens=100), "--url", fixed_sim.url,
                  "--out", str(out), "--no-calibrate", "--quiet", "--workers", workers, timeout=180)
    assert run.returncode == ExitCode.STORAGE, run.stderr
    assert "Traceback" not in run.stderr
    errors = [line for line in run.stderr.splitlines() if "No space left on device (ENOSPC)" in line]
    assert errors and all(str(out) in line for line in errors), run.stderr
    assert not list(out.rglob(".*.tmp")), "a failed write left its temporary file"

    manifest = orjson.loads((out / "manifest.json").read_bytes())
    assert manifest["status"] == "write_failed"
    assert manifest["write_error"]["error"] == "ENOSPC"
    assert not (out / "requests.parquet").exists()  # the merge did not fit: the parts are the record
    in_parts = sum(pl.read_parquet(f).height for f in (out / "_parts").glob("requests-*.parquet"))
    assert 0 < in_parts < planned  # what was flushed stays
    assert manifest["write_error"]["rows_saved"] == in_parts

    rep = loadgen("report", str(out), "--format", "json")
    assert rep.returncode == 0, rep.stderr
    s = orjson.loads(rep.stdout)
    assert s["lost"]["planned"] == planned and s["lost"]["found"] == in_parts
    assert s["lost"]["write_error"]["error"] == "ENOSPC"
    assert not s["valid"]
    reasons = " ".join(s["invalid_reasons"])
    assert "could not be saved" in reasons and "ENOSPC" in reasons and "killed" not in reasons


def test_a_read_only_file_system_is_one_error_before_anything_is_sent(tmp_path, fixed_sim):
    disk = tmp_path / "ro"
    disk.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    m = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(disk)], capture_output=True,
                       text=True)
    if m.returncode != 0:
        pytest.skip(f"mount refused: {m.stderr.strip()}")
    try:
        run = loadgen("run", workload(tmp_path, requests=5), "--url", fixed_sim.url, "--out", str(disk / "run"),
                      "--no-calibrate", "--quiet")
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)
    assert run.returncode == ExitCode.STORAGE, run.stderr
    assert "Traceback" not in run.stderr
    assert f"error: {disk / 'run'}: cannot write: Read-only file system (EROFS)" in run.stderr
