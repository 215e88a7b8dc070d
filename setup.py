"""The package list, which pyproject.toml cannot say alone: find_packages() cannot see loadgen.workloads,
a package whose folder is the repository's top-level workloads/ (pyproject.toml's package-dir maps it), nor
the data-only folders (no __init__.py) loadgen/sim/profiles and workloads/traces: named here, each is a
package of its own whose files pyproject.toml's package-data lists (setuptools warns it would otherwise
drop them from a wheel)."""
from setuptools import find_packages, setup

setup(packages=[*find_packages(include=["loadgen*"]), "loadgen.sim.profiles", "loadgen.workloads",
                "loadgen.workloads.traces"])
