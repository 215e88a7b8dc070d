"""Sim profiles: the H200 fit against the measured table, the shipped device profiles, loading."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from loadgen.sim.profiles import load_profile, shipped_profiles

DATA = Path(__file__).resolve().parents[2] / "tests" / "data" / "sim"
MEASURED = json.loads((DATA / "h200-llama8b-measured.json").read_text())
DEVICES = json.loads((DATA / "devices.json").read_text())["devices"]


def fit_errors() -> list[tuple[str, float]]:
    p = load_profile("h200-llama8b")
    out = []
    for r in MEASURED["prefill"]:
        model_ms = p.prefill_ns(r["batch"], r["prompt"]) / 1e6
        out.append((f"prefill batch={r['batch']} prompt={r['prompt']}", model_ms / r["ms"] - 1))
    for r in MEASURED["decode"]:
        model_ms = p.decode_ns(r["batch"], r["context"]) / 1e6
        out.append((f"decode batch={r['batch']} context={r['context']}", model_ms / r["step_ms"] - 1))
    return out


@pytest.mark.parametrize("row, err", fit_errors())
def test_h200_profile_reproduces_every_measured_row_within_15_percent(row, err):
    assert abs(err) <= 0.15, f"{row}: {err:+.1%}"


def test_one_profile_per_device_and_single_stream_decode_below_the_bandwidth_ceiling():
    names = shipped_profiles()
    assert {"tiny", "h200-llama8b"} <= set(names)
    for d in DEVICES:
        assert d["name"] in names
        p = load_profile(d["name"])
        tok_s = 1e9 / p.decode_ns(1, 512)
        # an 8B 16-bit model: decode is bandwidth-bound, below the spec ceiling, not far below
        assert 0.5 * d["ceiling_tok_s_16gb"] < tok_s < d["ceiling_tok_s_16gb"], d["name"]


def test_profile_file_errors_name_every_problem(tmp_path):
    f = tmp_path / "bad.toml"
    f.write_text('name = "bad"\nmodel_name = "m"\nmax_model_len = 10\n[model]\nparams = -1\n')
    with pytest.raises(ValueError) as e:
        load_profile(str(f))
    msg = str(e.value)
    assert str(f) in msg and "'params'" in msg and "missing key 'weight_bytes'" in msg and "'compute_tflops'" in msg
    f.write_text((Path(__file__).resolve().parents[2] / "loadgen/sim/profiles/tiny.toml").read_text()
                 .replace("[engine]", 'memory_compute = "add"\n[engine]'))
    with pytest.raises(ValueError, match=r"'memory_compute' must be \"max\" or \"sum\", got 'add'"):
        load_profile(str(f))
    with pytest.raises(ValueError, match="unknown profile"):
        load_profile("no-such-device")
    with pytest.raises(ValueError, match="no such file"):
        load_profile(str(tmp_path / "missing.toml"))


def test_a_user_profile_file_loads(tmp_path):
    src = load_profile("tiny")
    f = tmp_path / "mine.toml"
    f.write_text((Path(__file__).resolve().parents[2] / "loadgen/sim/profiles/tiny.toml").read_text()
                 .replace('name = "tiny"', 'name = "mine"'))
    p = load_profile(str(f))
    assert p.name == "mine" and p.decode_ns(4, 100) == src.decode_ns(4, 100)


def test_memory_compute_sum_pays_reads_and_compute_one_after_the_other(tmp_path):
    f = tmp_path / "cpu.toml"
    f.write_text((Path(__file__).resolve().parents[2] / "loadgen/sim/profiles/tiny.toml").read_text()
                 .replace("[engine]", 'memory_compute = "sum"\n[engine]'))
    gpu, cpu = load_profile("tiny"), load_profile(str(f))
    assert gpu.memory_compute == "max" and cpu.memory_compute == "sum"
    memory_s = (gpu.weight_bytes / (gpu.weight_bandwidth_gb_s * 1e9)
                + 300 * gpu.kv_bytes_per_token / (gpu.kv_bandwidth_gb_s * 1e9))
    compute_s = (2 * gpu.params * 260 + 4 * gpu.layers * gpu.hidden * 9000) / (gpu.compute_tflops * 1e12)
    base_s = gpu.overhead_us * 1e-6 + gpu.per_seq_us * 1e-6 * 5
    assert gpu.step_ns(260, 5, 300, 9000, True) == round((base_s + max(memory_s, compute_s)) * 1e9)
    assert cpu.step_ns(260, 5, 300, 9000, True) == round((base_s + memory_s + compute_s) * 1e9)
