"""GPU telemetry beside latency (`loadgen run --scrape URL`): a loopback server serves a recorded
dcgm-exporter exposition (tests/data/dcgm/metrics.txt: two H100s, NVIDIA's names, labels and HELP/TYPE
lines) whose values change per scrape in a known way, against a run of the built-in simulator through the
CLI. Checked: the samples are in telemetry.parquet on the run's clock, exactly as served; the summary's
figures are what the exporter served (constant gauges exactly, a sequence's mean/max over the window's
samples, the energy counter's increase as the served power x the window); output tokens per joule from
the run's own output tokens; the HTML report draws and tabulates them; a failing endpoint is counted and
the run completes; credentials in a URL are sent, never written; a bad URL exits 2 naming the flag."""
from __future__ import annotations

import base64
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import orjson
import polars as pl
import pytest

from loadgen.report import _f
from loadgen.report.tables import show
from tests.integration.conftest import loadgen, report_json, workload

FIXTURE = Path(__file__).resolve().parents[1] / "data" / "dcgm" / "metrics.txt"
UUID = {"0": "GPU-2948068a-d3bd-fe5c-48c7-3b9ad325276d", "1": "GPU-ac37caa9-f740-a02b-0ac6-5958644edaa9"}
POWER_W = {"0": 412.5, "1": 398.25}        # served as DCGM_FI_DEV_POWER_USAGE, and as the energy counter's slope
ENERGY0_MJ = {"0": 7_299_606_661, "1": 7_041_180_214}
UTIL_SEQUENCE = (40, 50, 60, 70, 80)      # gpu 0's DCGM_FI_DEV_GPU_UTIL, scrape k serves [k % 5]; gpu 1's is 20
USER, PASSWORD = "scraper", "s3cret-exporter-pw"


class FakeDcgm:
    """The recorded exposition with gpu 0's utilisation stepping through UTIL_SEQUENCE per scrape and each
    GPU's energy counter rising at POWER_W from the server's start (time.monotonic_ns(), the run's clock).
    Every answer is logged: (monotonic ns when served, {(name, gpu): value}). /broken answers 503."""

    def __init__(self):
        self.lines = FIXTURE.read_text().splitlines()
        self.served: list[tuple[int, dict]] = []
        self.auth: list[str | None] = []
        self.base_ns = time.monotonic_ns()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                if self.path == "/broken":
                    self.send_response(503)
                    self.end_headers()
                    return
                fake.auth.append(self.headers.get("Authorization"))
                body = fake.exposition().encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.http.server_address[1]
        threading.Thread(target=self.http.serve_forever, daemon=True).start()

    def exposition(self) -> str:
        now = time.monotonic_ns()
        k = len(self.served)
        values = {}
        out = []
        for line in self.lines:
            m = re.match(r'(\w+)\{gpu="(\d)".*\} (\S+)$', line)
            if m is None:
                out.append(line)
                continue
            name, gpu, value = m.groups()
            if name == "DCGM_FI_DEV_GPU_UTIL":
                value = str(UTIL_SEQUENCE[k % len(UTIL_SEQUENCE)] if gpu == "0" else 20)
            elif name == "DCGM_FI_DEV_POWER_USAGE":
                value = f"{POWER_W[gpu]:f}"
            elif name == "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION":   # mJ: W x ms
                value = str(ENERGY0_MJ[gpu] + round(POWER_W[gpu] * (now - self.base_ns) / 1e6))
            values[(name, gpu)] = float(value)
            out.append(line[:line.rfind(" ")] + " " + value)
        self.served.append((now, values))
        return "\n".join(out) + "\n"

    def stop(self):
        self.http.shutdown()
        self.http.server_close()


@pytest.fixture(scope="module")
def telemetry_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("telemetry")
    fake = FakeDcgm()
    out = tmp / "run"
    good = f"http://{USER}:{PASSWORD}@127.0.0.1:{fake.port}/metrics"
    broken = f"http://127.0.0.1:{fake.port}/broken"
    try:
        p = loadgen("run", workload(tmp, rate="20/s", requests=50, max_tokens=16), "--out", str(out),
                    "--no-calibrate", "--scrape", good, "--scrape", broken, "--scrape-interval", "200ms",
                    timeout=180)
        assert p.returncode == 0, p.stderr
        html = tmp / "report.html"
        r = loadgen("report", str(out), "--format", "html", "--out", str(html))
        assert r.returncode == 0, r.stderr
        yield {"out": out, "fake": fake, "stderr": p.stderr, "summary": report_json(str(out)),
               "html": html.read_text(), "broken": broken}
    finally:
        fake.stop()


def _window_ns(out: Path) -> tuple[int, int]:
    # the summary's measured window: first measured request due .. last one done (ns from t0)
    req = pl.read_parquet(out / "requests.parquet").filter(~pl.col("warmup"))
    return int(req["intended_ns"].min()), int(req["done_ns"].max())  # type: ignore[arg-type]


def test_the_samples_are_what_was_served_on_the_runs_clock(telemetry_run):
    out, fake = telemetry_run["out"], telemetry_run["fake"]
    t0 = orjson.loads((out / "manifest.json").read_bytes())["t0"]["monotonic_ns"]
    tel = pl.read_parquet(out / "telemetry.parquet")
    assert set(tel.columns) == {"t_ns", "source", "name", "labels", "value"}
    assert tel["source"].unique().to_list() == [f"http://***@127.0.0.1:{fake.port}/metrics"]
    energy = tel.filter(pl.col("name") == "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION_total",
                        pl.col("labels").str.contains('gpu="0"')).sort("t_ns")
    served = [(t, v[("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "0")]) for t, v in fake.served]
    assert energy["value"].to_list() == [v for _, v in served]     # every scrape read, in order, as served
    # on the run's clock: each sample is stamped after the server answered it, before the next answer
    stamps = (energy["t_ns"] + t0).to_list()
    assert all(s >= t for s, (t, _) in zip(stamps, served))
    assert all(s <= t_next for s, (t_next, _) in zip(stamps, served[1:]))
    start, end = _window_ns(out)
    assert energy["t_ns"][0] < start and energy["t_ns"][-1] > end   # the scrapes bracket the window
    labels = energy["labels"][0]
    for expected in (f'UUID="{UUID["0"]}"', 'modelName="NVIDIA H100 80GB HBM3"', 'Hostname="gpu-node-7"'):
        assert expected in labels
    assert fake.auth and set(fake.auth) == {"Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()}


def test_the_summary_is_what_the_exporter_served(telemetry_run):
    out, fake, s = telemetry_run["out"], telemetry_run["fake"], telemetry_run["summary"]
    t0 = orjson.loads((out / "manifest.json").read_bytes())["t0"]["monotonic_ns"]
    tel = s["telemetry"]
    start, end = _window_ns(out)
    assert tel["window_s"] == [start / 1e9, end / 1e9]
    gpus = {g["gpu"]: g for g in tel["gpus"]}
    assert set(gpus) == {"0", "1"} and {g["uuid"] for g in gpus.values()} == set(UUID.values())
    for gpu in ("0", "1"):
        assert gpus[gpu]["power_w"]["mean"] == gpus[gpu]["power_w"]["max"] == POWER_W[gpu]
        assert gpus[gpu]["memory_used_mib"]["max"] == 75861
    assert tel["overall"]["power_w"]["mean"] == tel["overall"]["power_w"]["max"] == sum(POWER_W.values())
    assert tel["overall"]["memory_used_mib"]["mean"] == 2 * 75861
    assert gpus["0"]["sm_clock_mhz"]["mean"] == 1980 and gpus["1"]["gpu_temp_c"]["max"] == 44
    assert gpus["0"]["sm_active"]["max"] == 0.743218        # a mean of equal floats: within rounding
    assert gpus["0"]["sm_active"]["mean"] == pytest.approx(0.743218, rel=1e-12)
    # utilisation: the sequence's values served in the scrapes stamped inside the window
    util = (pl.read_parquet(out / "telemetry.parquet")
            .filter(pl.col("name") == "DCGM_FI_DEV_GPU_UTIL", pl.col("labels").str.contains('gpu="0"'),
                    pl.col("t_ns").is_between(start, end)))
    assert util.height >= 3 and set(util["value"]) <= set(UTIL_SEQUENCE)
    assert gpus["0"]["gpu_util_pct"]["max"] == util["value"].max() and gpus["0"]["gpu_util_pct"]["n"] == util.height
    assert gpus["0"]["gpu_util_pct"]["mean"] == pytest.approx(util["value"].mean(), rel=1e-12)
    assert gpus["1"]["gpu_util_pct"]["mean"] == 20
    # energy: the counter rises at POWER_W on the run's clock; a sample's stamp trails its serving by
    # lag (known per sample), so the interpolated increase is the power x the window within power x lag
    stamps = pl.read_parquet(out / "telemetry.parquet").filter(
        pl.col("name") == "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION_total", pl.col("labels").str.contains('gpu="0"')
    ).sort("t_ns")["t_ns"].to_list()
    lag_s = max(t + t0 - served for t, (served, _) in zip(stamps, fake.served)) / 1e9
    window_s = (end - start) / 1e9
    for gpu in ("0", "1"):
        assert abs(gpus[gpu]["energy_j"] - POWER_W[gpu] * window_s) <= POWER_W[gpu] * lag_s + 0.002
    total_j = gpus["0"]["energy_j"] + gpus["1"]["energy_j"]
    assert tel["overall"]["energy_j"] == pytest.approx(total_j, rel=1e-12)
    # tokens per joule from the run's own output tokens: the ok measured rows of requests.parquet
    req = pl.read_parquet(out / "requests.parquet").filter(~pl.col("warmup"), pl.col("outcome") == "ok")
    tokens = int(req["output_tokens"].sum())
    assert tokens == 50 * 16 and tel["overall"]["output_tokens"] == tokens
    assert tel["overall"]["output_tokens_per_j"] == pytest.approx(tokens / total_j, rel=1e-12)


def test_a_failing_endpoint_is_counted_and_the_run_completes(telemetry_run):
    out, fake = telemetry_run["out"], telemetry_run["fake"]
    m = orjson.loads((out / "manifest.json").read_bytes())
    assert m["status"] == "complete"
    good, broken = m["telemetry"]
    assert good["url"] == f"http://***@127.0.0.1:{fake.port}/metrics"
    assert good["errors"] == 0 and good["scrapes"] == len(fake.served)
    assert broken["url"] == telemetry_run["broken"] and broken["scrapes"] == 0 and broken["errors"] >= 2
    assert "HTTP 503" in broken["last_error"]
    assert f"scrapes of {telemetry_run['broken']} failed" in telemetry_run["stderr"]
    assert m["config"]["scrape"] == [good["url"], broken["url"]]


def test_the_password_is_written_nowhere(telemetry_run):
    out = telemetry_run["out"]
    for f in out.rglob("*"):
        if f.is_file():
            assert PASSWORD.encode() not in f.read_bytes(), f
    assert PASSWORD not in telemetry_run["stderr"] and PASSWORD not in telemetry_run["html"]


def test_the_html_report_draws_the_telemetry_beside_the_latency(telemetry_run):
    html, s = telemetry_run["html"], telemetry_run["summary"]
    at = {k: html.find(f'id="{k}"') for k in ("latency-time", "gpu-gpu_util_pct", "gpu-power_w",
                                               "gpu-memory_used_mib", "gpu-sm_clock_mhz", "gpu-gpu_temp_c")}
    assert all(v > 0 for v in at.values()), at
    assert at["latency-time"] < at["gpu-gpu_util_pct"]        # under the latency chart, on its time axis
    assert "GPU telemetry (--scrape, over the measured window)" in html
    per_j = show(s["telemetry"]["overall"]["output_tokens_per_j"])   # the report's one number format
    assert f'data-k="telemetry.overall.output_tokens_per_j">{per_j}<' in html


@pytest.mark.parametrize("url,needle", [
    ("ftp://127.0.0.1:9400/metrics", "--scrape: must start with http:// or https://, got 'ftp://127.0.0.1:9400/metrics'"),
    ("http://user:hunter22@:9400/metrics", "--scrape: no host in 'http://***@:9400/metrics'"),
    ("http://127.0.0.1:99999/metrics", "--scrape: the port must be a number from 1 to 65535"),
])
def test_a_bad_url_exits_2_naming_the_flag(tmp_path, url, needle):
    p = loadgen("run", workload(tmp_path), "--out", str(tmp_path / "run"), "--scrape", url)
    assert p.returncode == 2, p.stderr
    assert needle in p.stderr and "hunter22" not in p.stderr
    assert "Traceback" not in p.stderr


def test_with_workers_one_process_scrapes(tmp_path):
    # --workers 2: worker 0 alone samples the endpoint (workers.worker_config), into the run's folder
    fake = FakeDcgm()
    try:
        out = tmp_path / "run"
        p = loadgen("run", workload(tmp_path, rate="20/s", requests=30, max_tokens=8), "--out", str(out),
                    "--no-calibrate", "--workers", "2", "--scrape", f"http://127.0.0.1:{fake.port}/metrics",
                    "--scrape-interval", "200ms", timeout=180)
        assert p.returncode == 0, p.stderr
        m = orjson.loads((out / "manifest.json").read_bytes())
        assert [t["scrapes"] for t in m["telemetry"]] == [len(fake.served)]
        tel = pl.read_parquet(out / "telemetry.parquet")
        assert tel.filter(pl.col("name") == "DCGM_FI_DEV_GPU_UTIL")["t_ns"].n_unique() == len(fake.served)
        # the gauges are summarised as served; energy needs a sample after the window's end, which worker 0
        # takes when its own share ends (docs/results.md#telemetryparquet: null when another ends later)
        assert report_json(str(out))["telemetry"]["overall"]["power_w"]["mean"] == sum(POWER_W.values())
    finally:
        fake.stop()


def test_the_text_and_markdown_reports_show_the_gpus(telemetry_run):
    out, s = telemetry_run["out"], telemetry_run["summary"]
    text = loadgen("report", str(out))
    assert text.returncode == 0, text.stderr
    o = s["telemetry"]["overall"]
    assert f"gpus       2: util mean {_f(o['gpu_util_pct']['mean'])} %" in text.stdout
    assert f"power {_f(o['power_w']['mean'])} W" in text.stdout
    assert f"{_f(o['output_tokens_per_j'])} output tok/J" in text.stdout
    md = loadgen("report", str(out), "--format", "md")
    assert md.returncode == 0, md.stderr
    assert "GPU telemetry (--scrape, over the measured window)" in md.stdout
