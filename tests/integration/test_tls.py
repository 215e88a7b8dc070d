"""Issue 24 scope 7: TLS and headers everywhere. Against a self-signed https server on loopback (a
TLS-terminating proxy in front of the simulator that answers 403 to any request without `X-Check: 1`),
every request loadgen makes of the target (the server-kind probe, /tokenize, calibration, the /metrics
scrape, the run; in one process and in each --workers process) takes the run's client options: with
--insecure, or --ca-bundle naming the certificate, the run is valid with the kind detected, exact prompt
lengths from /tokenize, calibration and scrapes done, and every request carried the header. Without
them, the run stops before it starts (exit 2) naming the certificate problem and both flags."""
import orjson
import polars as pl
import pytest

from loadgen.sim.process import SimProcess
from tests.integration.conftest import loadgen, workload
from tests.tlsproxy import TlsProxy, self_signed


@pytest.fixture(scope="module")
def tls_target(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tls")
    cert, key = self_signed(folder)
    sim = SimProcess(args=["--mode", "fixed", "--ttft", "20ms", "--itl", "5ms"])
    sim.start()
    proxy = TlsProxy(sim.url, cert, key, required_header=("X-Check", "1"))
    yield proxy, cert, folder
    proxy.close()
    sim.stop()


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("trust", ["insecure", "ca-bundle"])
def test_every_request_takes_the_tls_choice_and_the_headers(tmp_path, tls_target, trust, workers):
    proxy, cert, _ = tls_target
    proxy.seen.clear()
    out = tmp_path / "r"
    flags = ["--insecure"] if trust == "insecure" else ["--ca-bundle", str(cert)]
    p = loadgen("run", workload(tmp_path, requests=10, rate="10/s", max_tokens=4), "--url", proxy.url,
                *flags, "--header", "X-Check: 1", "--workers", str(workers), "--scrape-metrics",
                "--scrape-interval", "100ms", "--out", str(out), timeout=180)
    seen = list(proxy.seen)
    assert p.returncode == 0, p.stderr
    assert [s for s in seen if not s[2]] == []  # every request carried the header
    paths = {path for _, path, _ in seen}
    # the kind probe (/props is asked only by it), /tokenize, the scrape, the run (and calibration)
    assert {"/v1/models", "/props", "/tokenize", "/metrics", "/v1/completions"} <= paths, paths
    m = orjson.loads((out / "manifest.json").read_bytes())
    assert m["status"] == "complete", m["invalid_reasons"]
    assert m["target"]["server"]["kind"] == "loadgen-sim"
    assert m["workload"]["tokenizer"]["mode"] == "server" and m["workload"]["prompt_lengths"]["exact"]
    assert m["workload"]["prompt_lengths"]["usage"]["equal"] == 10
    assert m["scrape"]["scrapes"] > 0 and m["scrape"]["errors"] == 0
    calibration = orjson.loads((out / "calibration.json").read_bytes())
    assert len(calibration["probes"]) >= 5
    # the calibration's probes and the run's requests all went through the proxy: 1 warm-up + probes + run
    posts = sum(1 for method, path, _ in seen if method == "POST" and path == "/v1/completions")
    assert posts == 1 + len(calibration["probes"]) + 10
    assert m["client"]["tls"] == {"verify": trust != "insecure",
                                  "ca_bundle": str(cert) if trust == "ca-bundle" else None}
    rows = pl.read_parquet(out / "requests.parquet")
    assert rows.height == 10 and (rows["outcome"] == "ok").all()
    if workers == 2:
        assert sorted(rows["worker"].unique().to_list()) == [0, 1]
        assert len(m["workers"]) == 2


@pytest.mark.parametrize("trust", ["none", "other-ca"])
def test_an_untrusted_certificate_is_named_before_the_run(tmp_path, tls_target, trust):
    proxy, _, _ = tls_target
    flags = []
    if trust == "other-ca":
        (tmp_path / "other").mkdir()
        flags = ["--ca-bundle", str(self_signed(tmp_path / "other")[0])]
    out = tmp_path / "r"
    p = loadgen("run", workload(tmp_path, requests=4), "--url", proxy.url, "--header", "X-Check: 1",
                *flags, "--out", str(out))
    assert p.returncode == 2, p.stderr
    assert "Traceback" not in p.stderr
    assert f"--url {proxy.url}: the server's TLS certificate does not verify" in p.stderr
    assert ("the --ca-bundle given" if flags else "the system's CA certificates") in p.stderr
    assert "--ca-bundle FILE" in p.stderr and "--insecure" in p.stderr
    assert not out.exists()


def test_a_sweep_passes_the_tls_choice_and_the_headers_to_every_point(tmp_path, tls_target):
    proxy, cert, _ = tls_target
    proxy.seen.clear()
    out = tmp_path / "sweep"
    p = loadgen("sweep", workload(tmp_path, requests=6, max_tokens=4), "--rates", "5,10", "--url", proxy.url,
                "--ca-bundle", str(cert), "--header", "X-Check: 1", "--out", str(out), timeout=240)
    seen = list(proxy.seen)
    assert p.returncode == 0, p.stderr
    assert seen and [s for s in seen if not s[2]] == []
    points = sorted(d for d in out.iterdir() if d.is_dir())
    assert len(points) == 2, list(out.iterdir())
    for d in points:
        m = orjson.loads((d / "manifest.json").read_bytes())
        assert m["status"] == "complete", m["invalid_reasons"]
        assert m["target"]["server"]["kind"] == "loadgen-sim" and m["workload"]["prompt_lengths"]["exact"]
        assert m["client"]["tls"] == {"verify": True, "ca_bundle": str(cert)}


def test_fit_takes_the_tls_choice_and_the_headers(tmp_path, tls_target):
    proxy, cert, _ = tls_target
    p = loadgen("fit", "--url", proxy.url, "--out", str(tmp_path / "x.toml"), "--header", "X-Check: 1",
                "--max-num-seqs", "8", "--budget", "10s")
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert "certificate" in p.stderr and "--ca-bundle FILE" in p.stderr and "--insecure" in p.stderr, p.stderr
    proxy.seen.clear()
    p = loadgen("fit", "--url", proxy.url, "--out", str(tmp_path / "fitted.toml"), "--insecure",
                "--header", "X-Check: 1", "--max-num-seqs", "8", "--max-model-len", "4096", "--rounds", "1",
                "--budget", "60s", "--format", "json", timeout=120)
    seen = list(proxy.seen)
    assert p.returncode == 0, p.stderr[-2000:]
    assert orjson.loads(p.stdout)["limits"]["max_model_len"] == 4096
    assert seen and [s for s in seen if not s[2]] == []
    assert {"/v1/models", "/props", "/v1/completions"} <= {path for _, path, _ in seen}
