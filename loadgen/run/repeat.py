"""`--repeat N`: the same workload run N times, one after another, into DIR/repeat-1 .. DIR/repeat-N (each
a complete results folder, its summary.json written as `loadgen report` writes it) and DIR/repeats.json,
the across-run spread of each figure (analysis/repeats.py; docs/results.md has the schema).

The repeats share the config, so the seed: the same arrival times and lengths every time, so that what
differs between them is the server and the host, not the plan. The prompt text differs only when each
repeat records its own prompt salt (config.prompt_salt); without one it is the same too (a server with
prefix caching serves repeats 2..N warm), and repeats.json's `note` says which (note()).

The outcome's status is the worst of the runs' (interrupted > invalid > complete), so the exit code is
the worst; an interrupt stops the series, and repeats.json covers the runs that finished.
"""
from __future__ import annotations

import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from loadgen.analysis import repeats as stats
from loadgen.analysis.explain import ExplainOptions
from loadgen.analysis.report_summary import build
from loadgen.config.client import ClientOptions
from loadgen.config.workload import RunConfig, with_overrides
from loadgen.errors import ResultsError
from loadgen.results.folder import write_json
from loadgen.run.launch import run_workload
from loadgen.run.outcome import RunOutcome, say
from loadgen.run.prepare import default_out

SEVERITY = {"complete": 0, "invalid": 1}   # any other status (interrupted) is worse than both
NOTE = ("the repeats share the seed (the same arrival times and lengths) and the same prompt text (no "
        "per-run prompt salt): a server that caches prefixes serves repeats 2..N from its cache")
FRESH = ("the repeats share the seed (the same arrival times and lengths); each has its own prompt text "
         "(prompt salts {}, config.prompt_salt in each manifest)")


def note(summaries: list[dict]) -> str:
    """What the repeats share, from their recorded configs: fresh prompt text only when every repeat
    recorded a prompt salt and no two are equal (a build with a per-run salt), else NOTE."""
    salts = [(s.get("config") or {}).get("prompt_salt") for s in summaries]
    if salts and None not in salts and len(set(salts)) == len(salts):
        return FRESH.format(", ".join(str(x) for x in salts))
    return NOTE


def repeat_dir(k: int) -> str:
    return f"repeat-{k}"


def _prepare(out: Path, overwrite: bool) -> None:
    """A new or empty folder, or (with --overwrite) an earlier repeats folder, whose repeat-k folders
    are each replaced as its run starts (RunWriter.prepare)."""
    if out.exists() and not out.is_dir():
        raise ResultsError(f"--out {out}: exists and is not a folder")
    if out.is_dir() and any(out.iterdir()):
        if not overwrite:
            raise ResultsError(f"--out {out}: folder is not empty; choose another --out, or pass --overwrite "
                               f"to replace the repeated run in it")
        if not stats.is_repeats(out):
            raise ResultsError(f"--out {out}: folder is not empty and holds no repeated run ({stats.REPEATS_JSON}); "
                               f"--overwrite replaces only a repeats folder; choose another --out")
    out.mkdir(parents=True, exist_ok=True)


def run_repeated(config: RunConfig, progress: TextIO | None = sys.stderr, client: ClientOptions | None = None,
                 opts: ExplainOptions | None = None, slo_ms: dict[str, float] | None = None,
                 run_one: Callable[..., RunOutcome] = run_workload) -> RunOutcome:
    """config.repeat runs of config into config.out (a repeats folder) -> the worst outcome, its path the
    repeats folder, its reasons each run's prefixed with the run's folder name."""
    client = client or ClientOptions()
    out = Path(config.out or default_out(config))
    _prepare(out, client.overwrite)
    runs: list[dict] = []
    summaries: list[dict] = []
    status = "complete"
    reasons: list[str] = []
    for k in range(1, config.repeat + 1):
        say(progress, f"repeat {k} of {config.repeat} -> {out / repeat_dir(k)}")
        cfg = with_overrides(config, "--repeat", out=str(out / repeat_dir(k)))
        try:
            outcome = run_one(cfg, progress=progress, client=client)
            summary = dict(build(outcome.path, opts, slo_ms)[1])  # summary.json of the repeat
        except KeyboardInterrupt:  # between two runs' signal handling (preparing, summarizing): stop here
            status = "interrupted"
            break
        runs.append({"dir": repeat_dir(k), "status": outcome.status, "valid": outcome.status == "complete",
                     "invalid_reasons": list(outcome.invalid_reasons)})
        reasons += [f"{repeat_dir(k)}: {r}" for r in outcome.invalid_reasons]
        summaries.append(summary)
        if SEVERITY.get(outcome.status, 2) > SEVERITY.get(status, 2):
            status = outcome.status
        if outcome.status not in SEVERITY:  # interrupted: the series stops here
            break
    for extra in sorted(out.glob("repeat-*")):  # an earlier, longer series replaced with --overwrite
        if extra.name not in {r["dir"] for r in runs}:
            shutil.rmtree(extra)
    write_json(out / stats.REPEATS_JSON, stats.repeats_record(out, runs, summaries, note(summaries)))
    return RunOutcome(out, status, reasons)


def run_config(config: RunConfig, progress: TextIO | None = sys.stderr,
               client: ClientOptions | None = None, run_one=None) -> RunOutcome:
    """`loadgen run` (the CLI and loadgen.run alike): config.repeat > 1 runs into a repeats folder, else one run.
    run_one: what runs each (run_workload's signature; default run_workload, --metrics-port's exposes it)."""
    run_one = run_one or run_workload
    if config.repeat > 1:
        return run_repeated(config, progress=progress, client=client, run_one=run_one)
    return run_one(config, progress=progress, client=client)


# --- a sweep's point that is a repeats folder (sweep --repeat N; run/sweep.py) --------------------------
def mean_record(records: list[dict]) -> dict:
    """One sweep-point record from its repeats' records: every number the mean over the repeats (None when
    a repeat has none), every other value the first repeat's; sweep.py then judges the point on it."""
    def merge(values: list):
        if all(isinstance(v, dict) for v in values):
            return {k: merge([v.get(k) for v in values]) for k in values[0]}
        if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            return sum(values) / len(values)
        return values[0]

    return merge(records)


def point_repeats(folder: Path, records: list[dict]) -> dict:
    """What a repeated sweep point adds to its record: `repeats` {n, figures (repeats.json's)}, `valid`
    only when every repeat is, and each repeat's reasons prefixed with its folder name."""
    rec = stats.read(folder)
    return {"valid": all(r["valid"] for r in records),
            "invalid_reasons": [f"{r['dir'].rsplit('/', 1)[-1]}: {x}" for r in records for x in r["invalid_reasons"]],
            "repeats": {"n": rec["repeats"], "figures": rec["figures"]}}
