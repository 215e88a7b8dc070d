"""An installed loadgen runs without a checkout: the wheel carries the shipped workloads (found by name)
and a run needs no file when the flags describe the workload. The wheel is built from a copy of the
sources (the checkout is left untouched), installed into a fresh venv outside the checkout, and run from an
empty folder against the built-in simulator. Offline: no build isolation, no index (unless this
interpreter has no setuptools to build with); the new venv reads
the dependencies from this interpreter's site-packages through a .pth line (a plain path, so the editable
install's finder in there is not activated: the wheel's loadgen is the one imported)."""
import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import orjson
import pytest

from tests.integration.conftest import RELAXED_SELFCHECK

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ("loadgen", "workloads", "pyproject.toml", "setup.py", "README.md")


def _sh(*cmd, cwd: Path, env: dict | None = None, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The bin/ folder of a fresh venv holding loadgen installed from its wheel."""
    base = tmp_path_factory.mktemp("install")
    src = base / "src"
    for name in SOURCES:
        (shutil.copytree if (ROOT / name).is_dir() else shutil.copy2)(
            ROOT / name, src / name, **({"ignore": shutil.ignore_patterns("__pycache__")}
                                      if (ROOT / name).is_dir() else {}))
    # offline with this interpreter's setuptools; where it has none (a Python >= 3.12 venv), pip fetches one
    offline = ("--no-build-isolation", "--no-index") if importlib.util.find_spec("setuptools") else ()
    p = _sh(sys.executable, "-m", "pip", "wheel", "--no-deps", *offline, "-q", "-w", base / "dist", src, cwd=base)
    assert p.returncode == 0, p.stderr
    (wheel,) = (base / "dist").glob("loadgen-*.whl")
    venv = base / "venv"
    p = _sh(sys.executable, "-m", "venv", "--without-pip", venv, cwd=base)
    assert p.returncode == 0, p.stderr
    py = venv / "bin" / "python"
    site = Path(_sh(py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])", cwd=base).stdout.strip())
    (site / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    p = _sh(py, "-m", "pip", "install", "--no-deps", "--no-index", "--ignore-installed", "-q", wheel, cwd=base)
    assert p.returncode == 0, p.stderr
    where = _sh(py, "-c", "import loadgen; print(loadgen.__file__)", cwd=base).stdout.strip()
    assert Path(where).is_relative_to(site), f"the wheel's loadgen is not the one imported: {where}"
    return venv / "bin"


def _env(bin_dir: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return env | {"PATH": f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"}


def test_the_wheel_lists_and_runs_a_shipped_workload_by_name(installed, tmp_path):
    p = _sh(installed / "loadgen", "workloads", cwd=tmp_path, env=_env(installed))
    assert p.returncode == 0, p.stderr
    lines = dict(line.split(None, 1) for line in p.stdout.splitlines())
    assert set(lines) == {f.stem for f in (ROOT / "workloads").glob("*.toml")}
    assert lines["quickstart"].startswith("A first look")
    assert str(installed.parent) in p.stderr  # the files are the wheel's, not the checkout's
    p = _sh(installed / "loadgen", "run", "quickstart", "--requests", "12", "--rate", "12/s", "--out", "qs", "--quiet",
            *RELAXED_SELFCHECK, cwd=tmp_path, env=_env(installed))
    assert p.returncode == 0, p.stderr
    manifest = orjson.loads((tmp_path / "qs" / "manifest.json").read_bytes())
    assert manifest["status"] == "complete" and manifest["config"]["name"] == "quickstart"
    assert manifest["config"]["source"].startswith(str(installed.parent))
    # a replay workload finds its trace beside it, inside the package
    p = _sh(installed / "loadgen", "schedule", "azure-replay", cwd=tmp_path, env=_env(installed))
    assert p.returncode == 0, p.stderr
    assert len(p.stdout.splitlines()) == 300


def test_the_wheel_runs_without_a_workload_file(installed, tmp_path):
    p = _sh(installed / "loadgen", "run", "--rate", "10/s", "--prompt-tokens", "48", "--max-tokens", "6",
            "--requests", "15", "--out", "flags", "--quiet", *RELAXED_SELFCHECK, cwd=tmp_path, env=_env(installed))
    assert p.returncode == 0, p.stderr
    manifest = orjson.loads((tmp_path / "flags" / "manifest.json").read_bytes())
    assert manifest["status"] == "complete" and manifest["config"]["name"] == "random"
    assert manifest["schedule"]["requests"] == 15 and manifest["schedule"]["process"] == "poisson"
    assert manifest["workload"]["prompt_lengths"]["exact"] is True
