"""loadgen's exit codes (ExitCode: every module returns these, `--help` and docs/cli.md show EXIT_TABLE)
and its exception tree. Exceptions are for input, configuration and programming errors; what happens
to a request (refused, reset, timed out, malformed) is data, recorded in its row (recorder.Outcome).

    LoadgenError                 anything the CLI reports as `error: ...` with exit 2 (ExitCode.USAGE)
    ├── InputError               bad input; .problems lists every problem found, each naming its source
    │   ├── ConfigError          workload file and flags (config/)
    │   ├── TraceError           trace files, with file:line (traces.py)
    │   └── DatasetError         ShareGPT-style datasets (datasets.py)
    ├── TokenizerError           a tokenizer that was asked for cannot be used (prompts.py)
    ├── ResultsError             a results folder that cannot be read (results/folder.py)
    │   └── StorageError         a file that cannot be written (disk full, quota, read-only): exit 5
    ├── SimStartError            the built-in simulator did not start (sim/process.py)
    ├── ArgError                 a sweep's own options (run/sweep_args.py), each naming its flag
    ├── SweepError               a sweep that cannot run or resume (run/sweep.py)
    ├── CompareError             inputs or options compare cannot use (analysis/compare.py)
    ├── FailIfError              a --fail-if rule that does not parse (analysis/fail_if.py)
    └── TransportError           one request's connection failed: caught by the runner, becomes the
                                 row's error_kind (`kind`) and error_detail, never reaches the user
"""
from __future__ import annotations

import textwrap
from enum import IntEnum


class ExitCode(IntEnum):
    """What `loadgen` exits with. The meanings are EXIT_MEANINGS (the `--help` epilog, docs/cli.md)."""
    OK = 0
    ERROR = 1            # not returned on purpose: an uncaught exception (a bug) exits 1
    USAGE = 2            # bad usage or input (InputError, LoadgenError, argparse)
    INVALID = 3          # run: the run's numbers do not describe the asked workload; compare --fail-if:
                         # an input is such a run, so the rules were not evaluated
    FAIL_IF = 4          # compare: a --fail-if rule held
    STORAGE = 5          # a file could not be written (StorageError: ENOSPC, EDQUOT, EROFS, ...)
    INTERRUPTED = 130    # SIGINT/SIGTERM: 128 + SIGINT, also for SIGTERM (the run stops cleanly)


EXIT_MEANINGS = {
    ExitCode.OK: "ok (`run`: the run completed and is valid)",
    ExitCode.ERROR: "an unexpected error, a bug (Python's own exit code for an uncaught exception): please "
                    "report it with the traceback",
    ExitCode.USAGE: "bad usage or input: every problem is listed at once, naming the file and key or the flag",
    ExitCode.INVALID: "`run`: the run is invalid, its numbers do not describe the asked workload (the "
                      "client's lateness moved a reported percentile or it fell behind, more than "
                      "`--max-error-rate` of the requests failed, no request reached the server, or the prompt "
                      "lengths are not exact): the folder is complete, the reasons are in manifest.json and "
                      "the report; `compare --fail-if`: an input run is invalid or interrupted, so the rules "
                      "were not evaluated (`--allow-invalid` evaluates them)",
    ExitCode.FAIL_IF: "`compare`: a `--fail-if` rule held",
    ExitCode.STORAGE: "a file could not be written (the disk is full, a quota is reached, the file system is "
                      "read-only): one message names the file and the error; a run stops at once and its "
                      "folder keeps every part saved so far, readable by `report`, which says why the rest "
                      "is missing",
    ExitCode.INTERRUPTED: "interrupted (SIGINT/Ctrl-C or SIGTERM): the results folder is still complete and "
                          "readable; a sweep keeps its finished points",
}


def exit_table() -> str:
    """The `--help` epilog's exit codes (docs/cli.md holds the same lines as a table: a unit test checks)."""
    lines = ["exit codes:"]
    for code, meaning in EXIT_MEANINGS.items():
        text = meaning.replace("`", "")
        lines += textwrap.wrap(text, 100, initial_indent=f"  {code.value:<5}", subsequent_indent=" " * 7)
    return "\n".join(lines) + "\n"


class LoadgenError(Exception):
    pass


class InputError(LoadgenError):
    def __init__(self, problems: list[str]):
        super().__init__("\n".join(problems))
        self.problems = problems


class ConfigError(InputError):
    pass


class TraceError(InputError):
    pass


class DatasetError(InputError):
    pass


class TokenizerError(LoadgenError):
    pass


class ResultsError(LoadgenError):
    pass


class StorageError(ResultsError):
    """A file could not be written. errno: the OSError's (ENOSPC, EDQUOT, EROFS, EACCES, ...); path: the
    file; the message names both."""
    def __init__(self, path: str, err: OSError):
        name = errno_name(err.errno)
        super().__init__(f"{path}: cannot write: {err.strerror or err}" + (f" ({name})" if name else ""))
        self.path, self.errno, self.errno_name, self.strerror = path, err.errno, name, err.strerror or str(err)

    def record(self) -> dict:
        """As JSON (a worker's process record); from_record() makes it again."""
        return {"path": self.path, "errno": self.errno, "strerror": self.strerror}

    @classmethod
    def from_record(cls, record: dict) -> "StorageError":
        return cls(record["path"], OSError(record["errno"], record["strerror"]))


def errno_name(code: int | None) -> str:
    """ENOSPC for 28; '' for None or an unknown number."""
    import errno

    return errno.errorcode.get(code, "") if code is not None else ""


class SimStartError(LoadgenError):
    pass


class ArgError(LoadgenError):
    pass


class SweepError(LoadgenError):
    pass


class CompareError(LoadgenError):
    pass


class FailIfError(LoadgenError):
    pass


class TransportError(LoadgenError):
    def __init__(self, kind: str, detail: str):
        super().__init__(f"{kind}: {detail}")
        self.kind, self.detail = kind, detail
