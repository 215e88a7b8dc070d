"""The workloads shipped with loadgen, found by name: `loadgen run quickstart` reads quickstart.toml from
the package loadgen.workloads, which is the repository's top-level workloads/ folder (pyproject.toml maps
it; an installed wheel carries the files, an editable install reads the checkout's folder). `loadgen
workloads` lists them, one line each: the first sentence of the file's leading comment.

A path that exists always wins over a name, so a local `quickstart.toml` is read, not the shipped one.
"""
from __future__ import annotations

import importlib.resources
import os
import re
from pathlib import Path

from loadgen.config.kinds import is_file

PACKAGE = "loadgen.workloads"


def folder() -> Path | None:
    """The shipped workloads' folder on disk, or None when this loadgen has none (a partial copy)."""
    try:
        root = importlib.resources.files(PACKAGE)
    except ModuleNotFoundError:  # run from a source tree without an install: the checkout's own folder
        checkout = Path(__file__).resolve().parents[2] / "workloads"
        return checkout if checkout.is_dir() else None
    path = Path(str(root))
    return path if path.is_dir() else None


def names() -> list[str]:
    """The shipped workloads' names (file stems), sorted."""
    root = folder()
    return sorted(p.stem for p in root.glob("*.toml")) if root else []


def resolve(arg: str | Path) -> Path:
    """The workload file `arg` names: an existing path as given; else a shipped workload's file when `arg`
    is its name (`quickstart` or `quickstart.toml`, no folder); else `arg` unchanged (the loader then says
    there is no such file, listing the shipped names)."""
    path = Path(arg)
    if os.path.lexists(path) or len(path.parts) != 1:  # lexists: False for a name the OS refuses
        return path
    root = folder()
    stem = path.name[:-5] if path.name.endswith(".toml") else path.name
    candidate = root / f"{stem}.toml" if root else None
    return candidate if candidate is not None and is_file(candidate) else path


def describe(path: Path) -> str:
    """One line about a workload file: the first sentence of its leading comment block ('' without one)."""
    lines = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        lines.append(line.lstrip("#").strip())
    text = " ".join(x for x in lines if x)
    m = re.match(r"(.+?[.!?])(?=\s+[^a-z]|$)", text)  # not at "e.g. x": a sentence ends before no lowercase
    return m.group(1) if m else text


def listing() -> list[tuple[str, str]]:
    """[(name, one line)] of every shipped workload."""
    root = folder()
    return [(name, describe(root / f"{name}.toml")) for name in names()] if root else []
