"""A workload and its overrides -> the checked RunConfig and client options, for every command that plans
a run (`loadgen run`, `schedule`, `sweep`) and the Python API (loadgen/api.py): one ConfigError holds every
problem of the file, the overrides ({flag: value}, options.py), the client options and, with a trace,
its bad rows; the plan's size is checked before anything is built (limits.py)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from loadgen.config import workload as config
from loadgen.config.client import ClientOptions
from loadgen.config.runconfig import RunConfig
from loadgen.errors import ConfigError
from loadgen.plan import traces
from loadgen.plan.limits import check_config


def load_checked(workload: str | Path | None, flags: dict[str, Any]) -> tuple[RunConfig, ClientOptions]:
    """workload: a file, a shipped workload's name (config/shipped.py), or None (the flags describe it)."""
    try:
        cfg, client = config.load_run(workload, flags)
    except ConfigError as e:
        path = flags.get("--trace")
        more: list[str] = []
        if path:
            try:
                traces.read(path, flags.get("--trace-format") or "", skip_bad_rows=bool(flags.get("--skip-bad-rows")))
            except traces.TraceError as t:
                more = t.problems
        raise ConfigError(e.problems + more) from None
    check_config(cfg)
    return cfg, client
