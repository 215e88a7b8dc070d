"""A server that never answers is probed once before the run (not 16 times, each bounded only by
request_timeout), stderr says what calibration waits for; a run that reached no server is invalid (exit 3)
with a named reason, without the generator's "add workers" advice."""
import orjson

from tests.integration.conftest import loadgen, workload
from tests.misbehaving import Silent

def _wl(tmp_path):
    path = workload(tmp_path, requests=4, rate="50/s")
    with open(path) as f:
        text = f.read().replace('drain_timeout = "10s"', 'drain_timeout = "1s"')
    with open(path, "w") as f:
        f.write(text)
    return path


def test_calibration_gives_up_after_the_first_unanswered_probe(tmp_path):
    with Silent() as server:
        p = loadgen("run", _wl(tmp_path), "--url", server.url, "--out", str(tmp_path / "r"),
                    timeout=100)
        calib = server.heads_with(b"calib-")
    assert calib == 1, calib
    assert "each waits at most 10s" in p.stderr and "calibration failed: the first probe" in p.stderr, p.stderr
    assert "Traceback" not in p.stderr


def test_unreachable_target_is_not_a_success(tmp_path):
    out = tmp_path / "r"
    p = loadgen("run", _wl(tmp_path), "--url", "http://127.0.0.1:1", "--out", str(out), "--quiet", timeout=100)
    assert p.returncode == 3, p.stderr
    assert "target unreachable" in p.stderr and "add workers" not in p.stderr
    manifest = orjson.loads((out / "manifest.json").read_bytes())
    assert manifest["status"] == "invalid"
    assert manifest["invalid_reasons"][0].startswith("target unreachable: no request reached the server")
    rep = loadgen("report", str(out))
    assert "target unreachable" in rep.stdout and "add workers" not in rep.stdout
