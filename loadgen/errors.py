"""loadgen's exception tree. Exceptions are for input, configuration and programming errors; what happens
to a request (refused, reset, timed out, malformed) is data, recorded in its row (recorder.Outcome).

    LoadgenError                 anything the CLI reports as `error: ...` with exit 2
    ├── InputError               bad input; .problems lists every problem found, each naming its source
    │   ├── ConfigError          workload file and flags (config.py)
    │   ├── TraceError           trace files, with file:line (traces.py)
    │   └── DatasetError         ShareGPT-style datasets (datasets.py)
    ├── TokenizerError           a tokenizer that was asked for cannot be used (prompts.py)
    ├── ResultsError             a results folder that cannot be read (results.py)
    ├── SimStartError            the built-in simulator did not start (sim/process.py)
    └── TransportError           one request's connection failed: caught by the runner, becomes the
                                 row's error_kind (`kind`) and error_detail, never reaches the user
"""
from __future__ import annotations


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


class SimStartError(LoadgenError):
    pass


class TransportError(LoadgenError):
    def __init__(self, kind: str, detail: str):
        super().__init__(f"{kind}: {detail}")
        self.kind, self.detail = kind, detail
