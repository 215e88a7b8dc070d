"""`loadgen run` against the simulator under a pseudo-terminal: the live view (run/liveview.py) shows,
its last frame agrees with the run's rows, the lines around the run still appear once each and the plain
progress line does not; with --no-live, or on a pipe, the plain line comes back."""
import fcntl
import os
import re
import struct
import subprocess
import sys
import termios
import threading

import polars as pl
import pytest

pty = pytest.importorskip("pty")

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
VIEW = "generator (ms; limit"  # the view's health line
ARGS = ["--rate", "20/s", "--requests", "60", "--prompt-tokens", "16", "--max-tokens", "8", "--tokenizer",
        "approximate", "--no-calibrate", "--sim-args", "--mode fixed --ttft 30ms --itl 5ms"]


def loadgen(tmp_path, *extra: str, terminal: bool = True) -> tuple[subprocess.CompletedProcess, str]:
    """The run with stderr on a 120x40 pseudo-terminal (or a pipe); (the process, what stderr received)."""
    cmd = [sys.executable, "-m", "loadgen", "run", *ARGS, "--out", str(tmp_path / "run"), *extra]
    env = {**os.environ, "TERM": "xterm-256color"}
    env.pop("LOADGEN_LIVE", None)
    if not terminal:
        p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
        return p, p.stderr
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    got = bytearray()

    def drain():
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: the terminal's last writer is gone
                return
            if not data:
                return
            got.extend(data)

    reader = threading.Thread(target=drain)
    reader.start()
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=slave, text=True, env=env, timeout=120)
    finally:
        os.close(slave)
        reader.join(10)
        os.close(master)
    return p, got.decode(errors="replace")


def test_the_live_view_shows_the_run_on_a_terminal(tmp_path):
    p, raw = loadgen(tmp_path)
    assert p.returncode in (0, 3), raw[-3000:]
    rows = pl.read_parquet(tmp_path / "run" / "requests.parquet")
    plain = ANSI.sub("", raw)
    assert VIEW in plain and "offered" in plain and "achieved" in plain and "send lag p99" in plain
    # the last frame: every row counted, by the view's own figures
    completed = [int(n) for n in re.findall(r"completed (\d+)  failed 0", plain)]
    ok = rows.filter(pl.col("outcome") == "ok").height
    assert completed[-1] == ok == rows.height == 60
    assert re.findall(r"due (\d+)/(\d+)  sent (\d+)  in flight (\d+)", plain)[-1] == ("60", "60", "60", "0")
    # the lines around the run, once each; the final status line (the plain line's figures) once, and the
    # plain progress line (\r-rewritten on a terminal) never during the run
    assert plain.count("started the built-in simulator") == 1
    assert len(re.findall(r"\] sent 60/60 .*\[(complete|invalid)\]", plain)) == 1
    assert len(re.findall(r"\[\s+\d+\.\ds\] sent", plain)) == 1
    assert "\x1b[" in raw


def test_no_live_and_a_pipe_get_the_plain_line(tmp_path):
    p, raw = loadgen(tmp_path, "--no-live")
    assert p.returncode in (0, 3), raw[-3000:]
    assert VIEW not in raw and "\r[" in raw  # the plain line, rewritten in place on a terminal
    p, err = loadgen(tmp_path, "--overwrite", terminal=False)
    assert p.returncode in (0, 3), err[-3000:]
    assert "\x1b" not in err and "\r" not in err and VIEW not in err
    assert re.search(r"\] sent 60/60 .*\[(complete|invalid)\]", err)
