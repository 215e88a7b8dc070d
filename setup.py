"""The package list, which pyproject.toml cannot say alone: find_packages() cannot see loadgen.workloads,
a package whose folder is the repository's top-level workloads/ (pyproject.toml's package-dir maps it)."""
from setuptools import find_packages, setup

setup(packages=[*find_packages(include=["loadgen*"]), "loadgen.workloads"])
