"""Issue 15 defect 9: a measured decode rate above the bandwidth ceiling is flagged as impossible (the
model config or device does not describe the server), in the summary and in the text report."""
import json

from loadgen.analysis.roofline import bandwidth_from, model_shape, roofline
from loadgen.report.explain_text import roofline_lines

LLAMA_8B = {"num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8,
            "intermediate_size": 14336, "vocab_size": 128256, "torch_dtype": "bfloat16"}


def _roofline(tmp_path, measured):
    p = tmp_path / "config.json"
    p.write_text(json.dumps(LLAMA_8B))
    bw, source = bandwidth_from("h100-sxm", None)
    return roofline(model_shape(str(p)), bw, source, 1000, 200, measured, "probes")


def test_above_the_ceiling_is_flagged(tmp_path):
    r = _roofline(tmp_path, 640.0)  # ~320 % of the ~199 tok/s ceiling
    assert r["above_ceiling"] is True and "impossible" in r["warning"]
    text = "\n".join(roofline_lines(r))
    assert "IMPOSSIBLE: measured 310% of the ceiling" in text


def test_below_the_ceiling_is_not(tmp_path):
    r = _roofline(tmp_path, 150.0)
    assert r["above_ceiling"] is False and r["warning"] is None
