"""The Python API, for notebooks and scripts (docs/python-api.md): `import loadgen`, then

    r = loadgen.run("quickstart", rate="4/s", duration="5s")   # the built-in simulator: no url given
    r.summary["latency_ms"]["ttft"]["p50"]; r.latencies["ttft_ms"]; r.decomposition
    loadgen.read("results/quickstart"); loadgen.compare(a, b); loadgen.sweep("quickstart", rates="2,4,8/s")

The same library calls as the commands, nothing of its own: a workload and its overrides become one
checked config as `loadgen run`'s flags do (plan/checked.py; the keywords: config/keywords.py), the run is
run/repeat.run_config's (run/launch.run_workload, or N of them with repeat=N), the figures are `loadgen report`'s
(analysis/report_summary.build), the comparison `loadgen compare`'s (analysis/compare.compare), the sweep
`loadgen sweep`'s (run/sweep.run_sweep). Bad input raises the CLI's exit-2 errors (loadgen/errors.py:
ConfigError with every problem at once, each naming the keyword; ResultsError, ArgError, SweepError,
CompareError); a run that is invalid or interrupted is data: its status and reasons are on the result.
`loadgen/__init__.py` exports run, read, compare and sweep lazily: `import loadgen` stays cheap.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

import polars as pl

from loadgen import metrics
from loadgen.analysis import repeats as repeat_stats
from loadgen.analysis.compare import compare as compare_folders, exit_code as compare_exit_code, to_text
from loadgen.analysis.report_summary import build
from loadgen.analysis.summary import measured
from loadgen.config.keywords import as_keywords, keyword, options_of, to_flags
from loadgen.config.slo import parse_slo
from loadgen.errors import ArgError, CompareError, ConfigError, ExitCode, ResultsError
from loadgen.plan.checked import load_checked
from loadgen.results.folder import Json, Run, Summary, read_run
from loadgen.run.outcome import exit_code_of
from loadgen.run.repeat import run_config
from loadgen.run.sweep import MANIFEST as SWEEP_MANIFEST, SUMMARY_JSON as SWEEP_SUMMARY, default_sweep_out, run_sweep
from loadgen.run.sweep_args import SPEC_OPTIONS, spec_defaults, spec_from_args

__all__ = ["run", "read", "compare", "sweep", "Result", "Repeats", "Comparison", "Sweep"]


class Result:
    """One run's results folder (docs/results.md), read once (results/folder.read_run). The frames are as
    the files hold them; the derived figures are `loadgen report`'s, computed on first use and kept
    (nothing is written into the folder: `loadgen report` writes summary.json and decomposition.parquet)."""

    def __init__(self, run: Run):
        self._run = run
        self._built: tuple[Summary, pl.DataFrame] | None = None

    def __repr__(self) -> str:
        return f"<loadgen.Result {self.path} status={self.status}>"

    @property
    def path(self) -> Path:
        return self._run.path

    @property
    def manifest(self) -> dict[str, Any]:
        """manifest.json: the resolved config, t0, the target, the status and its reasons."""
        return dict(self._run.manifest)

    @property
    def status(self) -> str:
        """complete | invalid | interrupted | write_failed (| running: a run still going, or killed)."""
        return self._run.manifest["status"]

    @property
    def valid(self) -> bool:
        """The run measured the asked workload against the server (`loadgen run` exit 0)."""
        return self.status == "complete"

    @property
    def invalid_reasons(self) -> list[str]:
        return list(self._run.manifest.get("invalid_reasons") or [])

    @property
    def exit_code(self) -> ExitCode:
        """What `loadgen run` exits with for this run (0 complete, 3 invalid, 5 write failed, 130 interrupted)."""
        return exit_code_of(self.status)

    @property
    def requests(self) -> pl.DataFrame:
        """requests.parquet: one row per scheduled request, whatever happened to it; times int64 ns from t0."""
        return self._run.requests

    @property
    def tokens(self) -> pl.DataFrame:
        """tokens.parquet: one row per streamed chunk (request_id, idx, t_ns from t0, n_tokens)."""
        return self._run.tokens

    @property
    def latencies(self) -> pl.DataFrame:
        """The measured ok requests (warm-up left out, metrics.OK_ROWS), each with one `<metric>_ms` column
        per latency of docs/metrics.md (ttft_ms, ttfa_ms, ttft_from_send_ms, e2e_ms, tpot_ms, decode_ms,
        send_lag_ms, slot_wait_ms, connect_ms): the rows behind summary's ttft, e2e and tpot figures."""
        return metrics.latency_columns(measured(self._run).filter(metrics.OK_ROWS), suffix="_ms")

    @property
    def summary(self) -> dict[str, Any]:
        """summary.json's content as `loadgen report` derives it (docs/results.md lists every key), with the
        SLO the run recorded (run slo=...)."""
        return dict(self._derived()[0])

    @property
    def decomposition(self) -> pl.DataFrame:
        """decomposition.parquet's rows: where each measured ok request's time went, in ms (queue_ms,
        prefill_ms, decode_ms, decode_stalls_ms, send_lag_ms, other_ms, ...; analysis/decompose.py). Their
        means are summary["decomposition_ms"]["mean"]."""
        return self._derived()[1]

    @property
    def sim_truth(self) -> pl.DataFrame | None:
        """sim_truth.parquet, the built-in simulator's ground truth per request (docs/results.md), or None
        when the run targeted another server."""
        p = self.path / "sim_truth.parquet"
        return pl.read_parquet(p) if p.is_file() else None

    def _derived(self) -> tuple[Summary, pl.DataFrame]:
        if self._built is None:
            _, summary, decomposition = build(self.path, write=False)
            self._built = (summary, decomposition)
        return self._built


class Repeats:
    """A `repeat=N` folder (run/repeat.py): N runs of one workload and their across-run statistics."""

    def __init__(self, path: Path):
        self.path = path
        self.record: dict[str, Any] = repeat_stats.read(path)   # repeats.json (docs/results.md)
        self.runs = [Result(read_run(path / r["dir"])) for r in self.record["runs"]]

    def __repr__(self) -> str:
        return f"<loadgen.Repeats {self.path} runs={len(self.runs)}>"


def read(path: str | os.PathLike[str] | Result) -> Result | Repeats:
    """A results folder (or a repeat=N folder) as `loadgen report` reads it; ResultsError when it is none."""
    if isinstance(path, Result):
        return path
    p = Path(path)
    if repeat_stats.is_repeats(p):
        return Repeats(p)
    if not p.is_dir():
        raise ResultsError(f"{p}: no such results folder")
    return Result(read_run(p))


def _checked(command: str, workload: str | os.PathLike[str] | None, overrides: dict[str, Any]):
    """(RunConfig, ClientOptions) as the command's flags give them: every problem at once, named by keyword."""
    spelled = {o.flag for o in options_of(command).values() if o.flag}
    flags, problems = to_flags(command, overrides)
    try:
        checked = load_checked(None if workload is None else os.fspath(workload), flags)
    except ConfigError as e:
        problems += as_keywords(e.problems, spelled)
    if problems:
        raise ConfigError(problems)
    return checked


def _progress(quiet: bool):
    return None if quiet else sys.stderr


def run(workload: str | os.PathLike[str] | None = None, out: str | os.PathLike[str] | None = None, *,
        quiet: bool = False, **overrides: Any) -> Result | Repeats:
    """Run a workload (a TOML file, a shipped workload's name, or None: the overrides describe it) as
    `loadgen run` does, and read its folder. overrides: the run's flags as keywords (`rate="4/s"`,
    `duration="5s"`, `max_tokens=64`, `url="http://..."`; without url the built-in simulator is started).
    out: the results folder, by default `results/NAME-TIMESTAMP` under the working directory (as the
    command's). Progress lines go to stderr unless quiet. repeat=N returns the Repeats."""
    cfg, client = _checked("run", workload, {**overrides, "out": out})
    outcome = run_config(cfg, progress=_progress(quiet), client=client)   # as `loadgen run`
    return Repeats(outcome.path) if cfg.repeat > 1 else Result(read_run(outcome.path))


class Comparison:
    """`loadgen compare`'s result: .result is its JSON (docs/sweep-and-compare.md), str() its text."""

    def __init__(self, result: dict[str, Any]):
        self.result = result

    @property
    def exit_code(self) -> ExitCode:
        """What `loadgen compare` exits with: 0, 4 (a fail_if rule held), 3 (rules not evaluated: invalid input)."""
        return compare_exit_code(self.result)

    def __str__(self) -> str:
        return to_text(self.result)

    def __repr__(self) -> str:
        return f"<loadgen.Comparison of {len(self.result['comparisons']) + 1} inputs: {self.result['baseline']}>"


def _folder(x: str | os.PathLike[str] | Result | Repeats | Sweep) -> str:
    return str(x.path) if isinstance(x, (Result, Repeats, Sweep)) else os.fspath(x)


def compare(a: str | os.PathLike[str] | Result | Repeats | Sweep, b: str | os.PathLike[str] | Result | Repeats | Sweep,
            *more: str | os.PathLike[str] | Result | Repeats | Sweep, slo: str | None = None,
            fail_if: str | list[str] | tuple[str, ...] = (), allow_invalid: bool = False,
            **method: Any) -> Comparison:
    """Compare runs or sweeps with the baseline `a`, as `loadgen compare a b ...` (folders or results).
    slo: "ttft=500ms,tpot=50ms"; fail_if: rules such as "p99 ttft > +10%"; method: resamples, seed,
    min_effect (analysis/compare.compare's)."""
    unknown = sorted(set(method) - {"resamples", "seed", "min_effect"})
    if unknown:
        raise ConfigError([f"{k}: not an option of compare (slo, fail_if, allow_invalid, resamples, seed, "
                           f"min_effect)" for k in unknown])
    try:
        slo_ms = parse_slo(slo) if slo else None
    except ValueError as e:
        raise ConfigError([f"slo: {e}"]) from None
    rules = [fail_if] if isinstance(fail_if, str) else list(fail_if)
    inputs = [_folder(x) for x in (a, b, *more)]
    try:
        return Comparison(compare_folders(inputs, slo_ms, rules, allow_invalid=allow_invalid, **method))
    except CompareError as e:  # its options' problems name the flags: here the keywords
        raise CompareError(as_keywords([str(e)], {"--resamples", "--seed", "--min-effect"})[0]) from None


class Sweep:
    """A sweep's folder (docs/sweep-and-compare.md): sweep.json, sweep_summary.json, one run per point."""

    def __init__(self, path: Path):
        self.path = path
        self.manifest: dict[str, Any] = _json(path / SWEEP_MANIFEST)
        self.summary: dict[str, Any] = _json(path / SWEEP_SUMMARY)

    @property
    def status(self) -> str:
        return self.manifest["status"]

    @property
    def points(self) -> dict[float, Result | Repeats]:
        """{rate per s: the point's run} of every point measured, lowest rate first."""
        pts = sorted(self.manifest["points"], key=lambda p: p["rate_per_s"])
        return {p["rate_per_s"]: read(self.path / p["dir"]) for p in pts if (self.path / p["dir"]).is_dir()}

    def __repr__(self) -> str:
        return f"<loadgen.Sweep {self.path} status={self.status} points={len(self.manifest['points'])}>"


def _json(path: Path) -> Json:
    import orjson

    try:
        data: Json = orjson.loads(path.read_bytes())
    except FileNotFoundError:
        raise ResultsError(f"{path.parent}: not a sweep folder (no {path.name})") from None
    except orjson.JSONDecodeError as e:
        raise ResultsError(f"{path}: not valid JSON: {e}") from None
    return data


def sweep(workload: str | os.PathLike[str], rates: str | list[float | str] | None = None,
          out: str | os.PathLike[str] | None = None, *, resume: bool = False, quiet: bool = False,
          **options: Any) -> Sweep:
    """The workload at a series of rates, as `loadgen sweep` (docs/sweep-and-compare.md). rates: "2,4,8/s"
    or [2, 4, 8] (per s; "600/m" items too), or start="1/s" (a geometric series, with factor, max_rate,
    max_points, refine); max_goodput=True with slo=...; the rest are the run's overrides, as run()'s.
    out: by default `results/NAME-sweep-TIMESTAMP`."""
    own = {keyword(flag) for flag, _, _ in SPEC_OPTIONS}
    spec_args = {k: v for k, v in options.items() if k in own}
    overrides = {k: v for k, v in options.items() if k not in own}
    if rates is not None:
        spec_args["rates"] = rates if isinstance(rates, str) else ",".join(
            x if isinstance(x, str) else f"{x!r}/s" for x in rates)
    flags = {f"--{k.replace('_', '-')}" for k in own}
    try:
        cfg, client = _checked("sweep", workload, overrides)
        given = argparse.Namespace(**(spec_defaults() | _texts(spec_args)), rate=overrides.get("rate"))
        spec = spec_from_args(given, dict(cfg.slo) if cfg.slo else None)
    except ArgError as e:
        raise ArgError(as_keywords([str(e)], flags | {"--rate", "--slo"})[0]) from None
    outcome = run_sweep(cfg, spec, Path(out) if out is not None else default_sweep_out(cfg), resume=resume,
                        progress=_progress(quiet), client=client)
    return Sweep(outcome.path)


def _texts(values: dict[str, Any]) -> dict[str, Any]:
    """A sweep option's value as the flag's text (sweep_args parses text); max_goodput stays a bool."""
    out: dict[str, Any] = {}
    for k, v in values.items():
        if k == "max_goodput":
            if not isinstance(v, bool):
                raise ArgError(f"max_goodput: must be True or False, got {v!r}")
            out[k] = v
        elif isinstance(v, bool) or not isinstance(v, (str, int, float)):
            raise ArgError(f"{k}: must be a number or its text, got {v!r}")
        else:
            out[k] = str(v)
    return out

