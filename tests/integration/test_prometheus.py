"""--metrics-port scraped by a real Prometheus (Debian's `prometheus` package; `make test` installs it): a
simulator run through the CLI, Prometheus on loopback scraping loadgen and the simulator every 250 ms (its
storage in a temp dir, stopped by PID), then Prometheus's query API must hold the run's own figures: the
counts of its rows exactly, the TTFT histogram's buckets equal to the rows' counts, the median within the
bucket that holds the rows' median; and every query of the Grafana dashboard (docs/grafana/) evaluates
without error to data. The premise is checked, not assumed: Prometheus scraped loadgen (`up`) and saw the
run's final figures (`loadgen_run_ended` = 1; the exporter lingers for that scrape)."""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.parse
import urllib.request

import numpy as np
import orjson
import polars as pl
import pytest

from loadgen.sim.process import SimProcess
from tests.grafana import queries
from tests.integration.conftest import loadgen, workload

PROMETHEUS = shutil.which("prometheus")
if PROMETHEUS is None and os.environ.get("CI"):
    raise RuntimeError("CI: Debian's prometheus package is missing (the Makefile's `prometheus` target installs it)")
pytestmark = pytest.mark.skipif(PROMETHEUS is None, reason="no prometheus binary (apt-get install prometheus; "
                                                           "`make test` installs it)")
SCRAPE = "250ms"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def query(base: str, expr: str, at: float | None = None) -> list[dict]:
    args = {"query": expr, **({"time": f"{at:.3f}"} if at is not None else {})}
    with urllib.request.urlopen(f"{base}/api/v1/query?{urllib.parse.urlencode(args)}", timeout=10) as r:
        body = orjson.loads(r.read())
    assert body["status"] == "success", (expr, body)
    return body["data"]["result"]


def value(base: str, expr: str) -> float:
    result = query(base, expr)
    assert len(result) == 1, (expr, result)
    return float(result[0]["value"][1])


def targets(base: str) -> list[tuple[str, str, str]]:
    """Each target's (job, health, last error): what Prometheus says of its scrapes, for a failure's message."""
    with urllib.request.urlopen(f"{base}/api/v1/targets", timeout=10) as r:
        active = orjson.loads(r.read())["data"]["activeTargets"]
    return [(t["labels"]["job"], t["health"], t["lastError"]) for t in active]


@pytest.fixture
def prometheus(tmp_path):
    """(Prometheus's base URL, the port loadgen's metrics must use, the simulator's URL)."""
    sim = SimProcess(args=["--mode", "fixed", "--ttft", "30ms", "--itl", "5ms"])
    sim_url = sim.start()
    port, web = free_port(), free_port()
    cfg = tmp_path / "prometheus.yml"
    cfg.write_text(f"""
global:
  scrape_interval: {SCRAPE}
  scrape_timeout: {SCRAPE}
scrape_configs:
  - job_name: loadgen
    static_configs: [{{targets: ["127.0.0.1:{port}"]}}]
  - job_name: sim
    static_configs: [{{targets: ["{urllib.parse.urlsplit(sim_url).netloc}"]}}]
""")
    log = open(tmp_path / "prometheus.log", "w")
    proc = subprocess.Popen([PROMETHEUS, f"--config.file={cfg}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                             f"--web.listen-address=127.0.0.1:{web}", "--storage.tsdb.retention.time=1h"],
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{web}"
    try:
        for _ in range(600):   # ready: its TSDB opened, its web API up (at most 60 s)
            assert proc.poll() is None, (tmp_path / "prometheus.log").read_text()
            try:
                with urllib.request.urlopen(f"{base}/-/ready", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.1)
        else:
            pytest.fail("prometheus not ready in 60 s:\n" + (tmp_path / "prometheus.log").read_text())
        # Ready is not scraping: Prometheus hands discovered targets to its scrape loops at most every 5 s, so
        # a run begun at once can end before the first scrape (CI: `up` never 1). The premise of the test is a
        # Prometheus already scraping: wait until the simulator's target has been scraped up (at most 60 s).
        for _ in range(600):
            if any(r["value"][1] == "1" for r in query(base, 'up{job="sim"}')):
                break
            time.sleep(0.1)
        else:
            pytest.fail(f"prometheus did not scrape the simulator in 60 s: {targets(base)}\n"
                        + (tmp_path / "prometheus.log").read_text())
        yield base, port, sim_url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)   # its own process group: this PID only
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        log.close()
        sim.stop()


def test_prometheus_holds_the_runs_own_figures(tmp_path, prometheus):
    base, port, sim_url = prometheus
    out = tmp_path / "run"
    p = loadgen("run", workload(tmp_path, rate="20/s", requests=80, max_tokens=8), "--url", sim_url,
                "--no-calibrate", "--warmup-requests", "3", "--metrics-port", str(port), "--out", str(out),
                timeout=180)
    assert p.returncode == 0, p.stderr
    assert f"metrics for Prometheus at http://127.0.0.1:{port}/metrics" in p.stderr
    manifest = orjson.loads((out / "manifest.json").read_bytes())
    assert manifest["config"]["metrics_port"] == port
    run = f'run_id="{manifest["run_id"]}"'
    # the premise: Prometheus scraped loadgen during the run, and once more after its final Snapshot
    assert value(base, 'max_over_time(up{job="loadgen"}[10m])') == 1, targets(base)
    assert value(base, f"last_over_time(loadgen_run_ended{{{run}}}[10m])") == 1, p.stderr

    def last(name: str, sel: str = "") -> float:
        return value(base, f"last_over_time({name}{{{run}{sel}}}[10m])")

    req = pl.read_parquet(out / "requests.parquet")
    measured = req.filter(~pl.col("warmup"))
    assert last("loadgen_requests_sent_total") == req.height == last("loadgen_requests_planned")
    assert last("loadgen_requests_due_total") == req.height
    finished = {r["metric"]["outcome"]: float(r["value"][1])
                for r in query(base, f"last_over_time(loadgen_requests_finished_total{{{run}}}[10m])")}
    assert finished == {o: n for o, n in req.group_by("outcome").len().iter_rows()}
    assert last("loadgen_requests_in_flight") == 0
    assert last("loadgen_output_tokens_total") == measured["output_tokens"].sum()
    # TTFT (from the intended send time, docs/metrics.md): the buckets are the rows' counts
    ttft_s = np.sort(((measured["first_token_ns"] - measured["intended_ns"]) / 1e9).to_numpy())
    assert last("loadgen_ttft_seconds_count") == len(ttft_s)
    assert abs(last("loadgen_ttft_seconds_sum") - ttft_s.sum()) < 1e-6 * len(ttft_s)
    buckets = {float(r["metric"]["le"]): float(r["value"][1])
               for r in query(base, f"last_over_time(loadgen_ttft_seconds_bucket{{{run}}}[10m])")}
    assert buckets == {le: float((ttft_s <= le).sum()) for le in buckets} and buckets[float("inf")] == len(ttft_s)
    # the median Prometheus estimates lies in the bucket that holds the rows' median
    est = value(base, f"histogram_quantile(0.5, last_over_time(loadgen_ttft_seconds_bucket{{{run}}}[10m]))")
    bounds = sorted(buckets)
    true = float(np.quantile(ttft_s, 0.5, method="inverted_cdf"))
    hi = next(b for b in bounds if b >= true)
    lo = max([0.0, *(b for b in bounds if b < hi)])
    assert lo <= est <= hi, (est, true, lo, hi)
    # the Grafana dashboard's queries, at the moment of the last scrape that saw the run
    ended = query(base, f"loadgen_run_ended{{{run}}}[10m]")
    at = float(ended[0]["values"][-1][0])
    failed = sum(n for o, n in finished.items() if o not in ("ok", "cancelled"))
    for title, expr in queries():
        result = query(base, expr, at)
        if 'outcome!~"ok|cancelled"' in expr and failed == 0:
            assert result == [], (title, expr)   # no failure: no series of one
        else:
            assert result, f"{title}: no data for {expr}"


def test_a_sweep_exposes_each_point_with_its_rate(tmp_path, prometheus):
    base, port, sim_url = prometheus
    out = tmp_path / "sweep"
    p = loadgen("sweep", workload(tmp_path, requests=30, max_tokens=4), "--rates", "10,20/s", "--url", sim_url,
                "--no-calibrate", "--metrics-port", str(port), "--out", str(out), timeout=240)
    assert p.returncode == 0, p.stderr
    for rate in ("10", "20"):
        folder = out / f"rate-{rate}"
        run_id = orjson.loads((folder / "manifest.json").read_bytes())["run_id"]
        rows = pl.read_parquet(folder / "requests.parquet").height
        sel = f'{{rate="{rate}",run_id="{run_id}"}}'
        assert value(base, f"last_over_time(loadgen_run_ended{sel}[10m])") == 1, p.stderr
        assert value(base, f"last_over_time(loadgen_requests_sent_total{sel}[10m])") == rows
        assert value(base, f'last_over_time(loadgen_requests_finished_total{sel[:-1]},outcome="ok"}}[10m])') == rows
