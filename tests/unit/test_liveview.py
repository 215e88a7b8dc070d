"""The live terminal view (loadgen/run/liveview.py) rendered from synthetic Snapshots to a recording
console: the figures it shows are the Snapshot's, a failed count and an over-limit send lag are marked,
lines said while it shows go above it, and a stream that is not a terminal never gets it."""
import io
import re

from rich.console import Console

from loadgen.config.workload import load
from loadgen.run import liveview
from loadgen.run.live import Snapshot, Window
from loadgen.run.outcome import ViewStream, say

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def snap(t_s=10.0, due=100, sent=98, outcomes=None, lag_p99_ms=1.5, server=None) -> Snapshot:
    w = Window(20, 31.5, 44.25, 50.0)
    last = {"ttft": w, "itl": Window(300, 5.01, 9.87, 12.0), "e2e": Window(20, 120.5, 180.75, 190.0),
            "send_lag": Window(20, 0.1, lag_p99_ms, lag_p99_ms)}
    run = {"ttft": Window(90, 30.25, 61.5, 70.0), "itl": Window(1200, 5.0, 9.5, 15.0),
           "e2e": Window(90, 118.0, 250.5, 260.0), "send_lag": Window(90, 0.1, lag_p99_ms, lag_p99_ms)}
    return Snapshot(t_s=t_s, interval_s=1.0, planned=200, due=due, sent=sent, in_flight=5,
                    outcomes=outcomes or {"ok": 90}, output_tokens=1000, last=last, run=run, buckets={},
                    loop_lateness_p99_ms=0.42, server=server or {})


def text_of(renderable) -> tuple[str, str]:
    c = Console(file=io.StringIO(), force_terminal=True, width=120, record=True)
    c.print(renderable)
    return c.export_text(), c.file.getvalue()


def test_the_panel_shows_the_snapshots_figures():
    prev, now = snap(t_s=9.0, due=90, sent=88, outcomes={"ok": 80}), snap()
    text, _ = text_of(liveview.panel(now, prev, "loadgen run w", lag_limit_ms=50))
    assert "loadgen run w" in text and "t 10.0 s" in text and "planned 200" in text
    # offered = due per s, sent, achieved = finished per s: over the last interval (1 s) and the run (10 s)
    assert re.search(r"offered\s+10\.0\s+10\.0", text)
    assert re.search(r"sent\s+10\.0\s+9\.8", text)
    assert re.search(r"achieved\s+10\.0\s+9\.0", text)
    assert "due 100/200  sent 98  in flight 5  completed 90  failed 0" in text
    assert re.search(r"TTFT\s+31\.5\s+44\.2\s+30\.2\s+61\.5\s+90", text)
    assert re.search(r"ITL\s+5\.01\s+9\.87\s+5\.00\s+9\.50\s+1200", text)
    assert re.search(r"e2e\s+120\.5\s+180\.8\s+118\.0\s+250\.5\s+90", text)
    assert "send lag p99 last 1.50  run 1.50  loop lateness p99 0.42" in text and "!" not in text
    assert "server:" not in text


def test_failures_and_an_over_limit_send_lag_are_marked():
    s = snap(outcomes={"ok": 80, "http_error": 7, "timeout": 3, "cancelled": 1}, lag_p99_ms=72.0,
             server={"running": 12, "waiting": 3, "kv_usage": 0.375})
    text, raw = text_of(liveview.panel(s, None, "t", lag_limit_ms=50))
    assert "completed 80  failed 10  (cancelled 1, http_error 7, timeout 3)" in text
    assert "send lag p99 last 72.0 (> 50 ms!)  run 72.0 (> 50 ms!)" in text
    assert "server: running 12  waiting 3  KV 37.5%" in text
    assert "\x1b[1;31mfailed 10" in raw  # bold red on the terminal


def test_the_sweep_table_lists_finished_points_above_the_current_one():
    lat = {m: {"p50": 30.0, "p99": 60.0} for m in ("ttft", "itl")}
    pts = [({"rate_per_s": 2.0, "offered_per_s": 2.0, "completed_per_s": 1.98, "latency_ms": lat, "valid": True}, []),
           ({"rate_per_s": 4.0, "offered_per_s": 4.0, "completed_per_s": 2.5, "latency_ms": lat, "valid": True},
            ["completion"]),
           ({"rate_per_s": 8.0, "offered_per_s": None, "completed_per_s": None, "latency_ms": lat, "valid": False},
            None)]
    text, _ = text_of(liveview.sweep_table(pts))
    lines = [ln for ln in text.splitlines() if ln.strip()]
    assert re.search(r"^\s*2\s+2\.00\s+1\.98\s+30\.0\s+60\.0\s+30\.0\s+60\.0\s+yes\s+yes$", lines[2])
    assert re.search(r"^\s*4\s+4\.00\s+2\.50\s.*yes\s+NO \(completion\)$", lines[3])
    assert re.search(r"^\s*8\s+-\s+-\s.*INVALID\s+-$", lines[4])


def test_the_view_prints_said_lines_above_its_frame_and_keeps_the_last(tmp_path):
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=120)
    with liveview.LiveView(out, 50, console=console, refresh_s=0.05) as view:
        with view.watching("loadgen run w") as feed:
            say(view.stream, "planned 3 things")
            feed.publish(snap())
            say(view.stream, "[   10.0s] sent 98/200  [complete]")
    plain = ANSI.sub("", out.getvalue())
    assert plain.index("planned 3 things") < plain.rindex("completed 90")
    assert plain.rindex("[complete]") < plain.rindex("completed 90")  # the last frame stays below
    assert "\r" not in "".join(ln for ln in plain.splitlines() if "planned" in ln)


def test_a_stream_that_is_not_a_terminal_gets_no_view(tmp_path, monkeypatch):
    w = tmp_path / "w.toml"
    w.write_text('model = "m"\n[arrivals]\nrate = "5/s"\n[run]\nrequests = 5\n'
                 '[prompt]\ntokens = 8\n[output]\ntokens = 4\n')
    cfg = load(w, {})

    class Tty(io.StringIO):
        def isatty(self):
            return True

    assert not liveview.wanted(io.StringIO(), cfg)   # a pipe, a file, CI
    assert not liveview.wanted(None, cfg)            # --quiet
    assert not liveview.wanted(Tty(), cfg, no_live=True)
    assert liveview.wanted(Tty(), cfg)
    monkeypatch.setenv("LOADGEN_LIVE", "0")
    assert not liveview.wanted(Tty(), cfg)
    monkeypatch.delenv("LOADGEN_LIVE")
    assert not liveview.wanted(Tty(), load(w, {"--workers": "2"}))
    assert not liveview.wanted(ViewStream(print), cfg)  # the view's own stream is no terminal


def test_a_frame_after_warm_imports_nothing():
    # the view's first frame in the run must not import (the GIL held against the event loop a second
    # after t0); a fresh interpreter: what this one imported already says nothing
    code = """
import io, sys
from loadgen.run import liveview
from tests.unit.test_liveview import snap
liveview.warm(120)
before = set(sys.modules)
out = io.StringIO()
from rich.console import Console
with liveview.LiveView(out, 50, console=Console(file=out, force_terminal=True, width=120)) as view:
    with view.watching("t") as feed:
        feed.publish(snap(server={"running": 1, "waiting": 2, "kv_usage": 0.1}))
print(sorted(set(sys.modules) - before))
"""
    import subprocess
    import sys
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert p.stdout.strip() == "[]", p.stdout
