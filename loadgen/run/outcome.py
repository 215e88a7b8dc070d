"""What a run returns, and how it speaks: the outcome (folder, status, reasons, exit code) and the
progress lines (to the `progress` stream, stderr from the CLI; None = quiet).

Exit codes (errors.ExitCode): OK complete, INVALID (the run did not measure the server: its reasons say
why), INTERRUPTED (SIGINT/SIGTERM); USAGE is a ConfigError raised before a run starts.
"""
from __future__ import annotations

import io
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from loadgen.config.credentials import scrub
from loadgen.errors import ExitCode


@dataclass
class RunOutcome:
    path: Path
    status: str                      # complete | interrupted | invalid
    invalid_reasons: list[str] = field(default_factory=list)

    @property
    def exit_code(self) -> ExitCode:
        return exit_code_of(self.status)


def exit_code_of(status: str) -> ExitCode:
    """complete -> OK, invalid -> INVALID, write_failed -> STORAGE, anything else (interrupted) ->
    INTERRUPTED."""
    return {"complete": ExitCode.OK, "invalid": ExitCode.INVALID,
            "write_failed": ExitCode.STORAGE}.get(status, ExitCode.INTERRUPTED)


def say(out: TextIO | None, text: str) -> None:
    """One progress line, scrubbed of every secret the run sends (config/credentials.scrub)."""
    if out is not None:
        if out.isatty():
            out.write("\r\033[K")
        out.write(scrub(text) + "\n")
        out.flush()


def say_lengths(out: TextIO | None, lengths: dict) -> None:
    """The prompt-length verdict (prompts.verdict), when the lengths are not exact."""
    # A warning is not progress: on stderr with --quiet too (the note for an asked-for approximation is).
    if lengths["exact"]:
        return
    if lengths["asked_approximate"]:
        say(out, f"note: prompt lengths are NOT exact: {lengths['reason']}")
    else:
        say(out or sys.stderr, f"WARNING: prompt lengths are NOT exact: {lengths['reason']} (the run is "
                               f"invalid, exit code {ExitCode.INVALID:d}, unless asked for: --tokenizer approximate)")


class ViewStream(io.TextIOBase):
    """The progress stream while the live view shows (run/liveview.py): each complete line is handed to
    `emit` (printed above the view), so the lines said before, during and after the run still appear;
    not a terminal (`say` writes no \\r), and the run's progress loop writes no line to it (the view
    replaces the plain progress line)."""

    def __init__(self, emit: Callable[[str], None]):
        super().__init__()
        self._emit, self._buffer = emit, ""

    def write(self, text: str) -> int:
        self._buffer += text
        *lines, self._buffer = self._buffer.split("\n")
        for line in lines:
            self._emit(line)
        return len(text)

    def flush(self) -> None:
        pass  # a line is emitted when complete

    def isatty(self) -> bool:
        return False
