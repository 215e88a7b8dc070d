"""Issue 25 item 4: no command destroys a run. `report`, `export`, `schedule` and `compare` refuse to
write their --out over a results folder's own files (--overwrite included), over any existing file
without --overwrite, or into a folder: exit 2 naming the file and the flag, before anything is
computed, the run's files untouched. `run --out .` from inside a run folder is exit 2, not a ValueError."""
import os

import pytest

from loadgen.cli.main import main
from tests.integration.conftest import loadgen, workload


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, fixed_sim):
    tmp = tmp_path_factory.mktemp("out-files")
    out = tmp / "run"
    p = loadgen("run", workload(tmp, requests=5, rate="50/s", max_tokens=4), "--url", fixed_sim.url,
                "--out", str(out), "--quiet")
    assert p.returncode == 0, p.stderr
    p = loadgen("report", str(out))  # summary.json, decomposition.parquet: the run's too
    assert p.returncode == 0, p.stderr
    os.symlink(out / "manifest.json", tmp / "link-to-manifest.json")
    (out / "_parts").mkdir()  # as a killed run leaves it
    return out


def _files(path):
    return {p: p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


OWN = ["manifest.json", "requests.parquet", "tokens.parquet", "summary.json", "decomposition.parquet",
       "ttft.hlog", "calibration.json", "_parts/requests-00001.parquet"]


def _commands(run, target):
    w = str(run.parent / "w.toml")
    return {"report": ["report", str(run), "--out", target],
            "report-html": ["report", str(run), "--format", "html", "--out", target],
            "export": ["export", str(run), "--out", target],
            "schedule": ["schedule", w, "--out", target],
            "compare": ["compare", str(run), str(run), "--out", target]}


# schedule writes only .jsonl/.parquet (another suffix is refused first): the run's parquet files are its targets
CASES = [(c, own) for c in ("report", "report-html", "export", "schedule", "compare") for own in OWN
         if c != "schedule" or own.endswith(".parquet")]


@pytest.mark.parametrize("overwrite", [False, True], ids=["plain", "--overwrite"])
@pytest.mark.parametrize(("command", "own"), CASES)
def test_no_command_writes_over_a_runs_own_files(run_dir, capsys, command, own, overwrite):
    before = _files(run_dir)
    argv = _commands(run_dir, str(run_dir / own))[command] + (["--overwrite"] if overwrite else [])
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"--out {run_dir / own}: is a file of the results folder {run_dir}" in err
    assert _files(run_dir) == before


@pytest.mark.parametrize("command", ["report", "report-html", "export", "schedule", "compare"])
def test_a_link_to_a_runs_file_is_that_file(run_dir, capsys, command):
    link = run_dir.parent / "link-to-manifest.json"
    target = str(link) if command != "schedule" else str(run_dir / "requests.parquet")
    before = _files(run_dir)
    assert main(_commands(run_dir, target)[command] + ["--overwrite"]) == 2
    assert "is a file of the results folder" in capsys.readouterr().err
    assert _files(run_dir) == before


@pytest.mark.parametrize("command", ["report", "report-html", "export", "schedule", "compare"])
def test_an_existing_file_needs_overwrite_and_a_folder_is_refused(run_dir, tmp_path, capsys, command):
    out = tmp_path / ("plan.jsonl" if command == "schedule" else "out.txt")
    out.write_bytes(b"keep me")
    assert main(_commands(run_dir, str(out))[command]) == 2
    err = capsys.readouterr().err
    assert f"--out {out}: exists; pass --overwrite" in err and out.read_bytes() == b"keep me"

    assert main(_commands(run_dir, str(out))[command] + ["--overwrite"]) == 0
    capsys.readouterr()
    assert out.read_bytes() != b"keep me" and out.stat().st_size > 0
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []

    folder = tmp_path / ("d.jsonl" if command == "schedule" else "d")
    folder.mkdir()
    assert main(_commands(run_dir, str(folder))[command] + ["--overwrite"]) == 2
    assert f"--out {folder}: is a folder" in capsys.readouterr().err


def test_run_out_dot_from_inside_a_run_folder_is_refused(run_dir, fixed_sim):
    before = _files(run_dir)
    p = loadgen("run", str(run_dir.parent / "w.toml"), "--url", fixed_sim.url, "--out", ".", "--overwrite",
                "--quiet", cwd=run_dir)
    assert p.returncode == 2, p.stderr
    assert "Traceback" not in p.stderr and "--out .: is the folder this command runs in" in p.stderr
    assert _files(run_dir) == before
