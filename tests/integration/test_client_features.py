"""Issue 15, features users expect: the model is discovered from /v1/models when not given; `loadgen
export` writes one CSV / JSON line per scheduled request; --request-timeout is a flag."""
import io

import orjson
import polars as pl
import pytest

from loadgen.config.workload import ConfigError
from loadgen.probe.discover import discover_model
from tests.integration.conftest import loadgen, workload
from tests.misbehaving import BasicAuthServer


def _without_model(path: str) -> str:
    with open(path) as f:
        text = f.read().replace('model = "sim"\n', "")
    with open(path, "w") as f:
        f.write(text)
    return path


def test_model_is_discovered_and_export_writes_every_row(fixed_sim, tmp_path):
    out = tmp_path / "r"
    p = loadgen("run", _without_model(workload(tmp_path, requests=8, max_tokens=4)), "--url", fixed_sim.url,
                "--out", str(out), "--no-calibrate", "--request-timeout", "7s")
    assert p.returncode == 0, p.stderr
    assert "model: loadgen-sim-fixed" in p.stderr
    manifest = orjson.loads((out / "manifest.json").read_bytes())
    assert manifest["config"]["model"] == "loadgen-sim-fixed"
    assert manifest["config"]["request_timeout_ns"] == 7_000_000_000

    csv = loadgen("export", str(out), "--format", "csv")
    assert csv.returncode == 0, csv.stderr
    df = pl.read_csv(io.StringIO(csv.stdout))
    assert df.height == 8 and df["idx"].to_list() == list(range(8))
    assert (df["outcome"] == "ok").all() and (df["ttft_ms"] > 0).all()
    lines = loadgen("export", str(out), "--format", "jsonl").stdout.splitlines()
    rows = [orjson.loads(x) for x in lines]
    assert len(rows) == 8 and rows[0]["request_id"] == df["request_id"][0]
    assert rows[3]["e2e_ms"] == pytest.approx(df["e2e_ms"][3])


def test_export_of_a_folder_that_is_not_a_run(tmp_path):
    p = loadgen("export", str(tmp_path))
    assert p.returncode == 2 and "not a loadgen results folder" in p.stderr


def test_discovery_names_what_went_wrong():
    with BasicAuthServer("Basic abc") as server:
        assert discover_model(server.url, {"Authorization": "Basic abc"}) == "m"
        with pytest.raises(ConfigError) as e:
            discover_model(server.url, {})
        assert "answered HTTP 401: pass --model" in str(e.value)
    with pytest.raises(ConfigError) as e:
        discover_model("http://127.0.0.1:1", {}, timeout_s=2)
    assert "did not answer" in str(e.value)
