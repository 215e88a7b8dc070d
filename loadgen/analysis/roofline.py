"""The decode roofline: what the hardware allows a single stream, from a model config and a device.

From a Hugging Face `config.json`:
    head_dim         = head_dim, or hidden_size / num_attention_heads
    kv_heads         = num_key_value_heads (default num_attention_heads: no GQA)
    bytes/element    = from torch_dtype (bfloat16/float16 2, float32 4, float8*/int8 1); model_shape(dtype=) overrides
    params           = embeddings (vocab x hidden) + lm_head unless tie_word_embeddings
                       + per layer: q and o (hidden x heads*head_dim each), k and v (hidden x kv_heads*head_dim
                       each), gated MLP (3 x hidden x intermediate_size), two norms (2 x hidden)
    weight_bytes     = params x bytes/element
    kv_bytes_per_token = 2 x layers x kv_heads x head_dim x bytes/element   (K and V, every layer)
    kv_bytes_per_request = kv_bytes_per_token x (prompt + output tokens) at the workload's mean lengths
    single-stream decode ceiling (tokens/s) = bandwidth / (weight_bytes + kv bytes of one request)
A decode step must read every weight once, plus the sequence's KV cache: a single stream cannot beat it.
Device bandwidths (vendor specs) ship in loadgen/data/devices.json.
"""
from __future__ import annotations

import json
import re
from importlib import resources
from pathlib import Path

from loadgen.errors import LoadgenError

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "half": 2, "float32": 4, "float": 4, "float8_e4m3fn": 1,
               "float8": 1, "int8": 1}


class RooflineError(LoadgenError, ValueError):
    pass


def devices() -> dict[str, dict]:
    data = json.loads(resources.files("loadgen.data").joinpath("devices.json").read_text())
    return {d["name"]: d for d in data["devices"]}


def bandwidth_from(device: str | None, bandwidth: str | None) -> tuple[float, str]:
    """Bytes/s and where it came from. `bandwidth` like '3350GB/s', '3.35TB/s'."""
    if bandwidth:
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*(GB|TB|GiB|TiB)/s\s*", bandwidth)
        if not m:
            raise RooflineError(f"--bandwidth: expected e.g. '3350GB/s' or '3.35TB/s', got {bandwidth!r}")
        scale = {"GB": 1e9, "TB": 1e12, "GiB": 2**30, "TiB": 2**40}[m.group(2)]
        return float(m.group(1)) * scale, f"--bandwidth {bandwidth}"
    table = devices()
    if device not in table:
        raise RooflineError(f"--device: unknown device {device!r} (known: {', '.join(table)})")
    return table[device]["mem_bandwidth_gb_s"] * 1e9, f"{device} ({table[device]['mem_bandwidth_gb_s']} GB/s)"


def model_shape(path: str | Path, dtype: str | None = None) -> dict:
    p = Path(path)
    try:
        cfg = json.loads(p.read_text())
    except FileNotFoundError:
        raise RooflineError(f"{p}: no such model config") from None
    except json.JSONDecodeError as e:
        raise RooflineError(f"{p}: not valid JSON: {e}") from None
    cfg = cfg.get("text_config", cfg)  # multimodal configs nest the language model

    def need(key: str) -> int:
        v = cfg.get(key)
        if not isinstance(v, int) or v <= 0:
            raise RooflineError(f"{p}: field {key!r} must be a positive integer, got {v!r}")
        return v

    layers, hidden, heads = need("num_hidden_layers"), need("hidden_size"), need("num_attention_heads")
    kv_heads = cfg.get("num_key_value_heads") or heads
    head_dim = cfg.get("head_dim") or hidden // heads
    name = dtype or cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16"
    if name not in DTYPE_BYTES:
        raise RooflineError(f"{p}: field 'torch_dtype' {name!r} is not one of {', '.join(DTYPE_BYTES)}")
    nbytes = DTYPE_BYTES[name]
    vocab = cfg.get("vocab_size") or 0
    inter = cfg.get("intermediate_size") or 4 * hidden
    per_layer = 2 * hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim + 3 * hidden * inter + 2 * hidden
    params = layers * per_layer + vocab * hidden * (1 if cfg.get("tie_word_embeddings") else 2) + hidden
    return {"layers": layers, "hidden_size": hidden, "heads": heads, "kv_heads": kv_heads, "head_dim": head_dim,
            "dtype": name, "bytes_per_element": nbytes, "params": params, "weight_bytes": params * nbytes,
            "kv_bytes_per_token": 2 * layers * kv_heads * head_dim * nbytes}


def roofline(shape: dict, bandwidth_b_s: float, source: str, prompt_tokens: float, output_tokens: float,
             measured_single_stream_tok_s: float | None, measured_from: str) -> dict:
    kv_req = shape["kv_bytes_per_token"] * (prompt_tokens + output_tokens)
    ceiling = bandwidth_b_s / (shape["weight_bytes"] + kv_req)
    out = {"bandwidth": source, "bandwidth_bytes_per_s": bandwidth_b_s, **shape,
           "mean_prompt_tokens": prompt_tokens, "mean_output_tokens": output_tokens,
           "kv_bytes_per_request": kv_req, "single_stream_ceiling_tok_s": ceiling,
           "measured_single_stream_tok_s": measured_single_stream_tok_s, "measured_from": measured_from,
           "fraction_of_ceiling": None}
    if measured_single_stream_tok_s:
        out["fraction_of_ceiling"] = measured_single_stream_tok_s / ceiling
    # Faster than the bandwidth allows is impossible: the model config or the device does not describe the
    # server (e.g. the built-in simulator serves its own profile, whatever model name the workload gives).
    above = (out["fraction_of_ceiling"] or 0) > ABOVE_CEILING
    out["above_ceiling"] = above
    out["warning"] = (f"measured {out['fraction_of_ceiling']:.0%} of the ceiling, which is impossible: the model "
                      f"config or the device does not match the server that answered (the built-in simulator "
                      f"serves its own --profile whatever the workload's model says)") if above else None
    return out


ABOVE_CEILING = 1.05  # measured/ceiling beyond this is not noise
