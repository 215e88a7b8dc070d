"""loadgen: an open-loop load generator and benchmark harness for LLM inference servers.

The Python API (loadgen/api.py, docs/python-api.md): loadgen.run, loadgen.read, loadgen.compare and
loadgen.sweep, loaded on first use, so that `import loadgen` (every module imports it, the CLI starts with
it) stays cheap. The import is by name (importlib): every layer imports this package for __version__, and
the API sits on top of them all (pyproject.toml's layers); __init__.pyi gives the type checker the names.
"""
from __future__ import annotations

import importlib
import sys
import types
from typing import Any

__version__ = "0.1.0"
__all__ = ["run", "read", "compare", "sweep"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        return getattr(importlib.import_module("loadgen.api"), name)
    raise AttributeError(f"module 'loadgen' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])


class _Package(types.ModuleType):
    """This package, with `run` always the API's run(): loadgen/run/ is also a subpackage, and importing it
    binds it here as the attribute `run` (Python's import system does, after the first import of any
    loadgen.run.* module), which would hide the function. The subpackage stays importable by name (`from
    loadgen.run.launch import run_workload`; it is sys.modules["loadgen.run"]); only the attribute path
    `loadgen.run.launch` (`import loadgen.run.launch as x`, mock.patch("loadgen.run....")) does not reach it."""

    @property
    def run(self) -> Any:
        return importlib.import_module("loadgen.api").run

    @run.setter
    def run(self, subpackage: types.ModuleType) -> None:
        pass  # the import system's binding of the subpackage: it is in sys.modules already


sys.modules[__name__].__class__ = _Package
