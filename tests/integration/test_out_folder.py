"""Issue 15 defect 2: `--out` never deletes an earlier run before the new one has started, and refuses a
non-empty folder unless --overwrite. Also defect 9: a simulator that exits at once is reported with its
own stderr (not as a start timeout), and --sim-args is split like a shell would."""
from pathlib import Path

from tests.integration.conftest import loadgen, workload


def _earlier_run(path: Path) -> dict[str, bytes]:
    path.mkdir()
    (path / "manifest.json").write_bytes(b'{"status": "complete", "run_id": "earlier"}')
    (path / "requests.parquet").write_bytes(b"PAR1 earlier rows")
    return {p.name: p.read_bytes() for p in path.iterdir()}


def _contents(path: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in path.iterdir()}


def test_non_empty_out_is_refused_without_overwrite(tmp_path):
    out = tmp_path / "run"
    before = _earlier_run(out)
    p = loadgen("run", workload(tmp_path, requests=3), "--out", str(out), "--quiet", "--no-calibrate")
    assert p.returncode == 2, p.stderr
    assert "--overwrite" in p.stderr and "Traceback" not in p.stderr
    assert _contents(out) == before


def test_overwrite_keeps_the_earlier_run_when_the_new_one_fails_to_start(tmp_path):
    out = tmp_path / "run"
    before = _earlier_run(out)
    p = loadgen("run", workload(tmp_path, requests=3), "--out", str(out), "--overwrite", "--quiet",
                "--sim-args", "--faults bogus=1")
    assert p.returncode == 2, p.stderr
    assert "exited at once" in p.stderr and "bogus" in p.stderr  # the simulator's own message
    assert "Traceback" not in p.stderr
    assert _contents(out) == before
    assert [x.name for x in tmp_path.iterdir() if x.name.startswith(".run")] == []  # nothing left aside


def test_overwrite_replaces_the_earlier_run_once_the_new_one_ran(tmp_path):
    out = tmp_path / "run"
    _earlier_run(out)
    p = loadgen("run", workload(tmp_path, requests=3), "--out", str(out), "--overwrite", "--quiet",
                "--no-calibrate", "--sim-args", "--mode fixed --ttft '5ms' --itl 1ms")
    assert p.returncode == 0, p.stderr
    assert b"earlier" not in (out / "manifest.json").read_bytes()
    assert (out / "requests.parquet").read_bytes().startswith(b"PAR1")
    assert (out / "sim_truth.parquet").is_file()


def test_sim_args_value_that_starts_with_a_dash(tmp_path):
    p = loadgen("run", workload(tmp_path, requests=2), "--out", str(tmp_path / "r"), "--quiet",
                "--no-calibrate", "--sim-args", "--prefix-caching")
    assert p.returncode == 0, p.stderr
