"""`--metrics-port`: the generator's own metrics for Prometheus, read from the live feed (live.py).

Contract (docs/live-metrics.md):
- `GET /metrics` answers Prometheus's text format (0.0.4), rendered on each scrape in the HTTP server's
  own thread from the latest Snapshot of every run the command made (a sweep's points, --repeat's runs):
  the event loop does nothing for it, and a watcher-less run computes nothing (live.py).
- names (units in names, `_total` for counters): loadgen_requests_due_total (offered: intended send time
  passed), loadgen_requests_sent_total, loadgen_requests_finished_total{outcome}, loadgen_output_tokens_total,
  loadgen_requests_in_flight, loadgen_requests_planned, histograms loadgen_{ttft,ttft_from_send,itl,tpot,e2e,
  send_lag}_seconds (live.BUCKETS_S's bounds; _bucket{le}, _sum, _count), loadgen_loop_lateness_p99_seconds,
  loadgen_run_elapsed_seconds (the Snapshot's end, s from t0), loadgen_run_ended (1 once the run's last
  Snapshot is final).
- labels on every series: run_id, workload, target (scheme://host:port/path: no credentials, no query),
  model; in a sweep also `rate` (the point's offered rate per s, as its folder is named). A run's series
  stay, with their final figures once it ended, until the command exits: a scrape between two points
  still sees the last one's end.
- figures are the measured rows' (warm-up left out) except the counts of requests (planned, due, sent,
  finished, in flight), which count every row as the progress line does (live.py).
- after the command's last run the server lingers until one scrape begun after the end has been answered
  (it sees the final figures), at most twice the longest gap between the recent scrapes plus 1 s (LINGER_MAX_S at
  most; LINGER_ONE_SCRAPE_S after a lone scrape); not at all when nothing scraped during the command.
"""
from __future__ import annotations

import socket
import sys
import threading
import time
from collections import deque
from collections.abc import Iterator
from functools import partial
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, TextIO
from urllib.parse import urlsplit

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from loadgen.config.client import ClientOptions
from loadgen.config.workload import ConfigError, RunConfig, with_overrides
from loadgen.run.launch import run_workload
from loadgen.run.live import BUCKETS_S, Feed, Snapshot
from loadgen.run.outcome import RunOutcome, say

LABELS = ("run_id", "workload", "target", "model")
POINT_LABEL = "rate"                        # a sweep's point (SweepSpec rates, per s)
HISTOGRAMS = {m: f"loadgen_{m}_seconds" for m in BUCKETS_S}
# generate_latest writes the classic text format (0.0.4), which every Prometheus 2.x parses
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
LINGER_MAX_S = 60.0
LINGER_ONE_SCRAPE_S = 15.0                  # after a lone scrape (no gap seen): Prometheus's usual interval
_GAPS_KEPT = 5                              # the recent gaps between scrapes the linger is sized by


def target_label(url: str | None) -> str:
    """The target as a label: scheme://host[:port]/path, never its userinfo, query or fragment."""
    if not url:
        return ""
    try:
        p = urlsplit(url)
        return f"{p.scheme}://{p.netloc.rpartition('@')[2]}{p.path}"
    except ValueError:
        return ""


def families(runs: list[tuple[dict[str, str], Snapshot, bool]]) -> list[Metric]:
    """The metric families of (labels, latest Snapshot, ended) per run; labels hold LABELS (and, in a
    sweep, POINT_LABEL), the same keys for every run."""
    if not runs:
        return []
    names = list(runs[0][0])
    fam: dict[str, Metric] = {}

    def add(kind, name: str, doc: str, extra: tuple[str, ...] = ()) -> Any:  # a *MetricFamily
        if name not in fam:
            fam[name] = kind(name, doc, labels=[*names, *extra])
        return fam[name]

    for labels, s, ended in runs:
        lv = [labels.get(k, "") for k in names]
        add(CounterMetricFamily, "loadgen_requests_due_total",
            "Requests whose intended send time has passed (offered), warm-up included").add_metric(lv, s.due)
        add(CounterMetricFamily, "loadgen_requests_sent_total",
            "Requests dispatched, warm-up included").add_metric(lv, s.sent)
        finished = add(CounterMetricFamily, "loadgen_requests_finished_total",
                       "Requests finished, per outcome, warm-up included", ("outcome",))
        for outcome, n in sorted({"ok": 0, **s.outcomes}.items()):
            finished.add_metric([*lv, outcome], n)
        add(CounterMetricFamily, "loadgen_output_tokens_total",
            "Output tokens of the measured requests finished").add_metric(lv, s.output_tokens)
        add(GaugeMetricFamily, "loadgen_requests_in_flight", "Requests sent and not yet finished").add_metric(
            lv, s.in_flight)
        if s.planned is not None:
            add(GaugeMetricFamily, "loadgen_requests_planned", "Requests the run scheduled").add_metric(
                lv, s.planned)
        for m, name in HISTOGRAMS.items():
            b = s.buckets.get(m)
            if b is None:
                continue
            h = add(HistogramMetricFamily, name, f"{m} of the measured requests so far (docs/metrics.md)")
            h.add_metric(lv, [*((floatToGoString(u), c) for u, c in zip(b.upper_s, b.cumulative)),
                              ("+Inf", b.count)], b.sum_s)
        if s.loop_lateness_p99_ms is not None:
            add(GaugeMetricFamily, "loadgen_loop_lateness_p99_seconds",
                "p99 of the event loop's timer lateness over the last interval").add_metric(
                lv, s.loop_lateness_p99_ms / 1e3)
        add(GaugeMetricFamily, "loadgen_run_elapsed_seconds", "End of the latest snapshot, s from t0").add_metric(
            lv, s.t_s)
        add(GaugeMetricFamily, "loadgen_run_ended", "1 once the run ended: its figures are final").add_metric(
            lv, 1 if ended else 0)
    return list(fam.values())


class _Runs(Collector):
    """The feeds of the command's runs, each with its labels; collect() renders their latest Snapshots."""

    def __init__(self) -> None:
        self.feeds: list[tuple[dict[str, str], Feed]] = []
        self.lock = threading.Lock()

    def collect(self) -> Iterator[Metric]:
        with self.lock:
            feeds = list(self.feeds)
        runs = []
        for extra, feed in feeds:
            closed, snap = feed.closed, feed.latest   # closed first: a closed feed's latest is final
            if snap is not None:
                about = feed.about
                runs.append(({**{k: about.get(k, "") for k in LABELS}, "target": target_label(about.get("target")),
                              **extra}, snap, closed))
        yield from families(runs)


class Exporter:
    """The /metrics server of one command: bound at construction (ConfigError naming the flag when it
    cannot be), serving from its own threads until close()."""

    def __init__(self, host: str, port: int, progress: TextIO | None = sys.stderr):
        self.progress = progress
        self.runs = _Runs()
        self._cond = threading.Condition()
        self._scrape_starts: deque[float] = deque(maxlen=_GAPS_KEPT + 1)   # time.monotonic() of each
        self._served_began = float("-inf")      # the start of the latest scrape whose answer was written
        try:
            family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        except (socket.gaierror, UnicodeError) as e:
            raise ConfigError([f"--metrics-host {host!r}: not an address to listen on ({e})"]) from None
        server_cls = type("_Server", (ThreadingHTTPServer,), {"address_family": family, "daemon_threads": True})
        try:
            self.server = server_cls((host, port), partial(_Handler, self))
        except OSError as e:
            raise ConfigError([f"--metrics-port {port}: cannot listen on {host}:{port} "
                               f"(--metrics-host): {e.strerror or e}"]) from None
        self.host, self.port = host, int(self.server.server_address[1])
        self.thread = threading.Thread(target=self.server.serve_forever, name="metrics-port", daemon=True)
        self.thread.start()
        say(progress, f"metrics for Prometheus at {self.url}")

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    def render(self) -> tuple[float, bytes]:
        """(when this scrape began, time.monotonic(); the exposition)."""
        began = time.monotonic()
        with self._cond:
            self._scrape_starts.append(began)
        return began, generate_latest(self.runs)

    def served(self, began: float) -> None:
        """The scrape begun at `began` has its whole answer written: the linger may end on it."""
        with self._cond:
            self._served_began = max(self._served_began, began)
            self._cond.notify_all()

    def configure(self, config: RunConfig) -> RunConfig:
        """The config with the port actually bound (port 0: the one picked), as the manifest records it."""
        return with_overrides(config, "--metrics-port", metrics_port=self.port)

    def expose(self, feed: Feed, **extra: str) -> None:
        """Serve this feed's run too, its series labelled with feed.about and `extra` (kept until close)."""
        with self.runs.lock:
            self.runs.feeds.append((extra, feed))

    def run_workload(self, config: RunConfig, progress: TextIO | None = sys.stderr,
                     client: ClientOptions | None = None, point: bool = False, feed: Feed | None = None) -> RunOutcome:
        """run_workload with its feed (its own, or the one given: the terminal view watches it too) exposed
        with the run's labels (a sweep's point: + rate)."""
        feed = feed or Feed()
        self.expose(feed, **({POINT_LABEL: f"{config.arrivals.rate_per_s:g}"} if point else {}))
        try:
            return run_workload(self.configure(config), progress, client, feed=feed)
        finally:
            feed.close()
            if feed.latest is None:
                say(progress, "metrics: this run published no live figures (a run split across --workers or "
                              "--ray publishes none)")

    def close(self, linger: bool = True) -> bool:
        """Stop serving; with `linger`, first wait for a scrape begun after now (see the module's contract).
        True when such a scrape came (or none was awaited: nothing scraped, or no linger)."""
        came = True
        if linger:
            with self._cond:
                starts = list(self._scrape_starts)
                if starts:
                    gaps = [b - a for a, b in zip(starts, starts[1:])]
                    wait_s = min(LINGER_MAX_S, 2 * max(gaps) + 1.0) if gaps else LINGER_ONE_SCRAPE_S
                    ended = time.monotonic()
                    say(self.progress, f"metrics: waiting up to {wait_s:.1f} s for a last scrape of {self.url}")
                    # a scrape begun after the end AND answered: shutting down (and the process exiting,
                    # its daemon threads with it) as one only begins would cut its answer off
                    came = self._cond.wait_for(lambda: self._served_began > ended, timeout=wait_s)
            if not came:
                say(self.progress, f"metrics: no scrape came within {wait_s:.1f} s of the end: a scraper may "
                                   f"have missed the final figures")
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)
        return came


class _Handler(BaseHTTPRequestHandler):
    def __init__(self, exporter: Exporter, *args, **kw):
        self.exporter = exporter
        super().__init__(*args, **kw)

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        if self.path.split("?")[0] != "/metrics":
            body, ctype, code = b"loadgen: the metrics are at /metrics\n", "text/plain; charset=utf-8", 404
            began = None
        else:
            began, body = self.exporter.render()
            ctype, code = CONTENT_TYPE, 200
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        self.wfile.flush()
        if began is not None:
            self.exporter.served(began)

    def log_message(self, format: str, *args) -> None:  # a scrape is not progress: nothing on stderr
        pass
