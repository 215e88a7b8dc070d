"""Roofline numbers for a known layout, and the errors for bad input."""
import json

import pytest

from loadgen.analysis.roofline import RooflineError, bandwidth_from, devices, model_shape, roofline

LLAMA_8B = {"num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8,
            "intermediate_size": 14336, "vocab_size": 128256, "torch_dtype": "bfloat16", "tie_word_embeddings": False}


def write(tmp_path, cfg) -> str:
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    return str(p)


def test_llama_8b_layout(tmp_path):
    s = model_shape(write(tmp_path, LLAMA_8B))
    assert s["kv_bytes_per_token"] == 131072                 # 128 KiB, as docs/design.md says
    assert s["params"] == pytest.approx(8.03e9, rel=0.01)     # Llama-3-8B
    bw, source = bandwidth_from("h100-sxm", None)
    r = roofline(s, bw, source, 1000, 200, 150.0, "probes")
    # 3350 GB/s over 16.06 GB of weights + 1200 tokens x 128 KiB: about 199 tokens/s
    assert r["single_stream_ceiling_tok_s"] == pytest.approx(3350e9 / (s["weight_bytes"] + 1200 * 131072))
    assert 190 < r["single_stream_ceiling_tok_s"] < 210
    assert r["fraction_of_ceiling"] == pytest.approx(150.0 / r["single_stream_ceiling_tok_s"])
    assert r["kv_bytes_per_request"] == 1200 * 131072


def test_shipped_device_table_matches_the_shared_one():
    assert devices()["h200"]["mem_bandwidth_gb_s"] == 4800


@pytest.mark.parametrize("device, bandwidth, expected", [
    (None, "3.35TB/s", 3.35e12),   # explicit bandwidth
    (None, "900 GB/s", 9e11),
    ("a10g", None, 600e9),         # from the table
])
def test_bandwidth(device, bandwidth, expected):
    assert bandwidth_from(device, bandwidth)[0] == pytest.approx(expected)


@pytest.mark.parametrize("cfg, message", [
    ({**LLAMA_8B, "num_hidden_layers": "32"}, "field 'num_hidden_layers'"),  # wrong type
    ({k: v for k, v in LLAMA_8B.items() if k != "hidden_size"}, "field 'hidden_size'"),  # missing
    ({**LLAMA_8B, "torch_dtype": "float64x"}, "torch_dtype"),               # unknown dtype
])
def test_bad_config_names_file_and_field(tmp_path, cfg, message):
    path = write(tmp_path, cfg)
    with pytest.raises(RooflineError, match=message) as e:
        model_shape(path)
    assert path in str(e.value)


def test_unknown_device_and_bad_bandwidth():
    with pytest.raises(RooflineError, match="unknown device 'h900'"):
        bandwidth_from("h900", None)
    with pytest.raises(RooflineError, match="--bandwidth"):
        bandwidth_from(None, "fast")
