"""The live terminal view of `loadgen run` and `loadgen sweep` (rich's Live), drawn from the run's Feed.

Contract:
- shown only when the progress stream is a terminal, not `--quiet`, not `--no-live`, not LOADGEN_LIVE=0,
  and the run is one process without --repeat (`wanted`): --workers / --ray runs publish no Snapshots,
  and they (and pipes, CI) keep the plain progress line unchanged;
- it runs in its own thread, reading the Feed (live.py) that the flush thread fills once a second: it
  draws only from the Snapshots (the interval histograms the run keeps anyway), never touches the event
  loop, and redraws at most once per new Snapshot plus a clock tick (`REFRESH_S`);
- while it shows, the run's progress stream is `stream` (outcome.ViewStream): every line said before,
  during and after the run (plan, warnings, the final status line, INVALID RUN reasons) is printed above
  the view through its console, and the plain progress line is not written (no double output). The last
  frame stays on the terminal; a view that never got a Snapshot is cleared;
- a sweep (`point`) shows a table of its finished points above the current point's panel.
Units: `_s` seconds, `_ms` milliseconds.
"""
from __future__ import annotations

import io
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TextIO, cast

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.segment import Segments
from rich.table import Table
from rich.text import Text

from loadgen.config.workload import RunConfig
from loadgen.run.live import Feed, Snapshot, Window
from loadgen.run.outcome import ViewStream

REFRESH_S = 1.0            # the clock tick: a redraw at least this often, and at most once more per Snapshot
LATENCIES = (("TTFT", "ttft"), ("ITL", "itl"), ("e2e", "e2e"))


def wanted(progress: TextIO | None, config: RunConfig, no_live: bool = False) -> bool:
    """Whether the live view replaces the plain progress line (the module docstring's first rule)."""
    return (progress is not None and not no_live and os.environ.get("LOADGEN_LIVE", "1") != "0"
            and progress.isatty() and os.environ.get("TERM", "") != "dumb"
            and config.workers == 1 and config.ray is None and config.repeat == 1)


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}" if v >= 10 else f"{v:.2f}"


def _p(w: Window | None, q: int) -> float | None:
    return None if w is None else w.p50_ms if q == 50 else w.p99_ms


def _rate(n: float, s: float) -> str:
    return f"{n / s:.1f}" if s > 0 else "-"


def _grid(rows: list[tuple[str, ...]]) -> Text:
    """Right-aligned columns as one Text: a frame is drawn every second while the run goes, and a rich
    Table costs ~10x the CPU of this (measured: 4.2 vs 0.4 ms for the latency rows), in the process
    whose CPU drives the load (tests/bench/bench_live.py)."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return Text("\n".join("  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in rows))


def _marked(v: float | None, limit_ms: float) -> Text:
    """A generator-health figure, red and marked when beyond the run's self-check limit."""
    if v is not None and v > limit_ms:
        return Text(f"{_ms(v)} (> {limit_ms:g} ms!)", style="bold red")
    return Text(_ms(v))


def panel(snap: Snapshot | None, prev: Snapshot | None, title: str, lag_limit_ms: float) -> RenderableType:
    """The current run's figures: rates (the last interval and the run), counts, latencies, the
    generator's health, the server's gauges. prev: the Snapshot shown before (the interval's rates)."""
    if snap is None:
        return Text(f"{title}: waiting for t0 (set-up, calibration)", style="dim")
    span_s = snap.t_s - prev.t_s if prev is not None else snap.t_s
    d_due = snap.due - (prev.due if prev else 0)
    d_sent = snap.sent - (prev.sent if prev else 0)
    d_done = snap.finished - (prev.finished if prev else 0)
    head = Text(f"{title}", style="bold")
    head.append(f"   t {snap.t_s:.1f} s   planned {'?' if snap.planned is None else snap.planned}", style="")
    rates = _grid([("req/s", "last", "run"),
                   ("offered", _rate(d_due, span_s), _rate(snap.due, snap.t_s)),
                   ("sent", _rate(d_sent, span_s), _rate(snap.sent, snap.t_s)),
                   ("achieved", _rate(d_done, span_s), _rate(snap.finished, snap.t_s))])
    planned = "?" if snap.planned is None else str(snap.planned)
    other = {o: n for o, n in snap.outcomes.items() if o != "ok"}
    counts = Text(f"due {snap.due}/{planned}  sent {snap.sent}  in flight {snap.in_flight}  "
                  f"completed {snap.outcomes.get('ok', 0)}  ")
    counts.append(f"failed {snap.failed}", style="bold red" if snap.failed else "")
    if other:
        counts.append("  (" + ", ".join(f"{o} {n}" for o, n in sorted(other.items())) + ")")
    lat_rows: list[tuple[str, ...]] = [("ms", "last p50", "last p99", "run p50", "run p99", "n")]
    for label, m in LATENCIES:
        a, b = snap.last.get(m), snap.run.get(m)
        lat_rows.append((label, _ms(_p(a, 50)), _ms(_p(a, 99)), _ms(_p(b, 50)), _ms(_p(b, 99)),
                         str(b.count if b else 0)))
    lat = _grid(lat_rows)
    lag_last, lag_run = snap.last.get("send_lag"), snap.run.get("send_lag")
    health = Text(f"generator (ms; limit {lag_limit_ms:g}): send lag p99 last ")
    health.append_text(_marked(_p(lag_last, 99), lag_limit_ms))
    health.append("  run ")
    health.append_text(_marked(_p(lag_run, 99), lag_limit_ms))
    health.append("  loop lateness p99 ")
    health.append_text(_marked(snap.loop_lateness_p99_ms, lag_limit_ms))
    parts: list[RenderableType] = [head, rates, counts, lat, health]
    if snap.server:
        g = snap.server
        kv = g.get("kv_usage")
        parts.append(Text(f"server: running {g.get('running', 0):g}  waiting {g.get('waiting', 0):g}  "
                          f"KV {'-' if kv is None else f'{100 * kv:.1f}%'}"))
    return Group(*parts)


def sweep_table(points: list[tuple[dict, list[str] | None]]) -> Table:
    """The sweep's finished points (sweep.point_record), each with its saturation rules so far (None:
    invalid), as they finish."""
    t = Table(title="sweep: finished points", title_justify="left", box=None, pad_edge=False)
    for col in ("rate/s", "offer/s", "done/s", "ttft50", "ttft99", "itl50", "itl99", "valid", "keeps up"):
        t.add_column(col, justify="right")
    for p, why in points:
        lat = p["latency_ms"]
        keeps = Text("-") if why is None else Text("yes") if not why else Text("NO (" + ", ".join(why) + ")",
                                                                               style="bold red")
        t.add_row(f"{p['rate_per_s']:g}", _ms(p.get("offered_per_s")), _ms(p.get("completed_per_s")),
                  _ms(lat["ttft"]["p50"]), _ms(lat["ttft"]["p99"]), _ms(lat["itl"]["p50"]), _ms(lat["itl"]["p99"]),
                  Text("yes") if p["valid"] else Text("INVALID", style="bold red"), keeps)
    return t


def warm(width: int) -> None:
    """Render a made-up frame to a throw-away console before the run: the first render imports and builds
    rich's state (tables, cell widths), work that must fall in set-up, not in the view thread a second
    after t0 where it would hold the GIL against the event loop (as the flush thread's first tick once
    did, inprocess.warm_flush_path)."""
    w = Window(1, 1.0, 1.0, 1.0)
    snap = Snapshot(t_s=1.0, interval_s=1.0, planned=1, due=1, sent=1, in_flight=0, outcomes={"ok": 1, "error": 1},
                    output_tokens=1, last={m: w for _, m in LATENCIES}, run={m: w for _, m in LATENCIES},
                    buckets={}, loop_lateness_p99_ms=99.0, server={"running": 1, "waiting": 0, "kv_usage": 0.5})
    point = {"rate_per_s": 1.0, "offered_per_s": 1.0, "completed_per_s": 1.0, "valid": True,
             "latency_ms": {m: {"p50": 1.0, "p99": 1.0} for _, m in LATENCIES}}
    Console(file=io.StringIO(), force_terminal=True, width=width).print(
        Group(sweep_table([(point, ["x"])]), panel(snap, snap, "warm", 1.0)))


class LiveView:
    """The view over one run or a sweep's points (a context manager); `stream` is the progress stream to
    give the run while it shows, `watching(title)` the Feed of the next run."""

    def __init__(self, out: TextIO, lag_limit_ms: float, console: Console | None = None,
                 refresh_s: float = REFRESH_S):
        self.console = console or Console(file=out, highlight=False, soft_wrap=False)
        self.lag_limit_ms, self.refresh_s = lag_limit_ms, refresh_s
        self.stream = cast(TextIO, ViewStream(lambda line: self.console.print(Text(line))))
        self._live = Live(console=self.console, auto_refresh=False, redirect_stdout=False, redirect_stderr=True,
                          transient=False)
        self._feed: Feed | None = None
        self._title = ""
        self._points: list[tuple[dict, list[str] | None]] = []
        self._table: tuple[int, Segments] | None = None  # the sweep table, rendered, for so many points
        self._snap: Snapshot | None = None
        self._prev: Snapshot | None = None
        self._shown = False
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._watch, name="loadgen-liveview", daemon=True)

    def __enter__(self) -> LiveView:
        warm(self.console.width)
        self._live.start()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)
        self._draw()
        self._live.transient = not self._shown  # a view that never got a Snapshot leaves nothing behind
        self._live.stop()

    @contextmanager
    def watching(self, title: str) -> Iterator[Feed]:
        """A new Feed for the next run (run_workload(feed=...)), shown under `title`; closed at the end."""
        feed = Feed()
        with self._lock:
            self._feed, self._title, self._snap, self._prev = feed, title, None, None
        try:
            yield feed
        finally:
            feed.close()
            self._take(feed)  # the run's last Snapshot (its end), whether or not the thread saw it
            self._draw()

    def point(self, record: dict, saturated_by: list[str] | None) -> None:
        """A sweep point finished (its sweep.point_record; its saturation rules, None when invalid)."""
        with self._lock:
            self._points.append((record, saturated_by))
        self._draw()

    def renderable(self) -> RenderableType:
        with self._lock:
            now = panel(self._snap, self._prev, self._title, self.lag_limit_ms) if self._feed else Text("")
            if not self._points:
                return now
            if self._table is None or self._table[0] != len(self._points):
                # laid out once per finished point, not once per frame (a Table's layout is the costly part)
                lines = self.console.render_lines(sweep_table(self._points), pad=False, new_lines=True)
                self._table = (len(self._points), Segments([seg for line in lines for seg in line]))
            return Group(self._table[1], now)

    def _draw(self) -> None:
        self._live.update(self.renderable(), refresh=True)

    def _take(self, feed: Feed) -> None:
        with self._lock:
            snap, seen = feed.latest, self._snap
            if self._feed is feed and snap is not None and (seen is None or snap.t_s > seen.t_s):
                self._prev, self._snap, self._shown = seen, snap, True

    def _watch(self) -> None:
        """The view's thread: a redraw per new Snapshot, and one per clock tick."""
        while not self._stop.is_set():
            feed = self._feed
            if feed is None or feed.closed:
                self._stop.wait(self.refresh_s)
            else:
                seen = self._snap
                feed.wait(seen.t_s if seen else None, timeout_s=self.refresh_s)
                self._take(feed)
            self._draw()
