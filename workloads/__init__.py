"""The shipped workloads: installed as the package loadgen.workloads (pyproject.toml maps it to this
folder), found by name by loadgen/config/shipped.py (`loadgen run quickstart`, `loadgen workloads`)."""
