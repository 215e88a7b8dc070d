"""The explain options: `backend` in the workload and --backend, run flags, report flags (exit 2, no traceback)."""
import json
import subprocess
import sys

import pytest

from loadgen.config import workload as config
from loadgen.config.workload import ConfigError
from tests.unit.test_config import GOOD


def write(tmp_path, text: str) -> str:
    p = tmp_path / "w.toml"
    p.write_text(text)
    return str(p)


@pytest.mark.parametrize("file_value, flag, expected", [
    (None, None, "openai"),          # default
    ('"ollama"', None, "ollama"),     # from the file
    ('"ollama"', "llamacpp", "llamacpp"),  # the flag wins
])
def test_backend_from_file_and_flag(tmp_path, file_value, flag, expected):
    text = (f"backend = {file_value}\n" if file_value else "") + GOOD
    assert config.load(write(tmp_path, text), {"--backend": flag}).backend == expected


def test_unknown_backend_names_file_and_key(tmp_path):
    path = write(tmp_path, 'backend = "tgi"\n' + GOOD)
    with pytest.raises(ConfigError) as e:
        config.load(path)
    assert e.value.problems == [f"{path}: backend: must be one of openai, ollama, llamacpp, got 'tgi'"]


def cli(*args):
    return subprocess.run([sys.executable, "-m", "loadgen", *args], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("args, message", [
    # roofline needs both halves
    (["--device", "h100-sxm"], "--model-config"),
    # unknown device
    (["--device", "h900", "--model-config", "CFG"], "unknown device 'h900'"),
    # a config without the fields the roofline needs
    (["--device", "h100-sxm", "--model-config", "BAD"], "field 'num_hidden_layers'"),
    # a window without a unit
    (["--window", "5"], "--window"),
])
def test_report_bad_flags_exit_2_without_traceback(tmp_path, args, message):
    from tests.frames import make_run, stream
    from loadgen.results.folder import write_json, write_parquet

    run = make_run([{"id": "a", "tokens": stream(30, 4, 10)}])
    (tmp_path / "run").mkdir()
    write_json(tmp_path / "run" / "manifest.json", {"status": "complete", "config": {}, "target": {}})
    write_parquet(tmp_path / "run" / "requests.parquet", run.requests)
    write_parquet(tmp_path / "run" / "tokens.parquet", run.tokens)
    cfg = {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4}
    (tmp_path / "cfg.json").write_text(json.dumps(cfg))
    (tmp_path / "bad.json").write_text("{}")
    args = [str(tmp_path / "cfg.json") if a == "CFG" else str(tmp_path / "bad.json") if a == "BAD" else a for a in args]
    p = cli("report", str(tmp_path / "run"), *args)
    assert p.returncode == 2, p.stderr
    assert message in p.stderr and "Traceback" not in p.stderr


def test_run_bad_scrape_interval_exits_2(tmp_path):
    p = cli("run", write(tmp_path, GOOD), "--scrape-metrics", "--scrape-interval", "fast", "--url", "http://127.0.0.1:9")
    assert p.returncode == 2 and "--scrape-interval" in p.stderr and "Traceback" not in p.stderr
