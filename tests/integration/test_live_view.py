"""`loadgen run` against the simulator under a pseudo-terminal: the live view (run/liveview.py) shows,
its last frame agrees with the run's rows, the lines around the run still appear once each and the plain
progress line does not; with --no-live, or on a pipe, the plain line comes back."""
import fcntl
import json
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


def loadgen(tmp_path, *extra: str, terminal: bool = True, command: tuple[str, ...] = ("run", *ARGS)
            ) -> tuple[subprocess.CompletedProcess, str]:
    """The run with stderr on a 120x40 pseudo-terminal (or a pipe); (the process, what stderr received)."""
    cmd = [sys.executable, "-m", "loadgen", *command, "--out", str(tmp_path / "run"), *extra]
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


def test_a_sweep_shows_its_finished_points_as_they_end(tmp_path):
    w = tmp_path / "w.toml"
    w.write_text('model = "sim"\n[arrivals]\nrate = "10/s"\n[run]\nrequests = 30\n'
                 '[prompt]\ntokens = 16\ntokenizer = "approximate"\n[output]\ntokens = 8\n')
    p, raw = loadgen(tmp_path, command=("sweep", str(w), "--rates", "10,20/s", "--no-calibrate", "--sim-args",
                                        "--mode fixed --ttft 30ms --itl 5ms"))
    assert p.returncode == 0, raw[-3000:]
    plain = ANSI.sub("", raw)
    summary = json.loads((tmp_path / "run" / "sweep_summary.json").read_text())
    # the table's rows, as the points ended: the first frame after point 1 has one row, the last two
    frames = plain.split("sweep: finished points")[1:]
    assert frames and "loadgen sweep: point 2 at 20/s" in plain
    last_rows = re.findall(r"^\s*(10|20)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)", frames[-1], re.M)
    assert [r[0] for r in last_rows[:2]] == ["10", "20"]
    for row, point in zip(last_rows, summary["points"]):
        assert float(row[3]) == pytest.approx(point["latency_ms"]["ttft"]["p50"], abs=0.06)
        assert float(row[4]) == pytest.approx(point["latency_ms"]["ttft"]["p99"], abs=0.06)
    assert any(re.search(r"^\s*10\s", f, re.M) and not re.search(r"^\s*20\s+\d", f, re.M) for f in frames)
