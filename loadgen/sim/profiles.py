"""Engine profiles: a model on a device, as TOML (shipped ones in loadgen/sim/profiles/, or any
file given to --profile). The step-time model (all times in profile ns; divide by --speed for
real time):

  gpu_ns  = overhead + max(memory, compute) + per_seq * sequences_in_step
  memory  = weight_bytes / weight_bandwidth + kv_tokens_read * kv_bytes_per_token / kv_bandwidth
  compute = (2 * params * tokens_in_step + attn_flops_per_pair * attention_pairs) / compute_flops
  step_ns = max(launch, gpu_ns)   launch = prefill_launch if any prompt token is in the step
                                          else decode_launch
          + multi_token + multi_token_kv * kv_tokens_read
                          if the step computes more than one token (optional, default 0)

kv_tokens_read = sum over the step's sequences of the tokens in their KV cache (context);
attention_pairs = sum over new tokens of the context they attend to (a prompt chunk of n new
tokens after c cached ones gives n*c + n*(n+1)/2); attn_flops_per_pair = 4 * layers * hidden.
`launch` is the host's time to launch the kernels of one forward pass, which overlaps GPU work:
near zero for decode (CUDA graphs), ~15 ms for an eager prefill in the measured H200 stack.

Three optional keys (default 0) describe engines measured by `loadgen fit` (docs/twin.md):
multi_token_us, the extra cost of a step that computes more than one token (llama.cpp on a CPU runs a
one-token step through a matrix-vector path several times cheaper than any larger batch),
multi_token_kv_us, likewise per KV token read (llama.cpp on a CPU reads a batched decode's contexts at
~1.7 us a token, one stream's at ~1.05), and
request_overhead_us, host time per request before the engine sees it (HTTP, tokenization): it delays
the request's admission, not any step. And one optional key, memory_compute = "max" (default: a GPU reads
memory while it computes, the roofline) or "sum" (a CPU engine: the step pays its memory reads and its
compute one after the other, so a prompt chunk in a step with decodes adds to their reads rather than
hiding them; measured on llama.cpp and vLLM's CPU build by `loadgen fit`'s mixed probe).
"""
from __future__ import annotations

import tomllib
from dataclasses import dataclass, fields
from importlib import resources
from pathlib import Path

BLOCK_SIZE = 16


@dataclass(frozen=True)
class Profile:
    name: str
    model_name: str  # reported by /v1/models and in responses
    description: str
    max_model_len: int
    # model
    params: float
    weight_bytes: float
    kv_bytes_per_token: float
    layers: int
    hidden: int
    # step time
    overhead_us: float
    per_seq_us: float
    weight_bandwidth_gb_s: float
    kv_bandwidth_gb_s: float
    compute_tflops: float
    prefill_launch_us: float
    decode_launch_us: float
    # engine defaults (flags override)
    max_num_seqs: int
    max_num_batched_tokens: int
    kv_capacity_tokens: int
    # optional (fit.py): see the module comment
    multi_token_us: float = 0.0
    multi_token_kv_us: float = 0.0   # per KV token read, in a step of more than one token (fit.py)
    request_overhead_us: float = 0.0
    memory_compute: str = "max"   # "max" (overlapped: a GPU) or "sum" (one after the other: a CPU)

    def step_ns(self, tokens: int, seqs: int, kv_tokens_read: int, attention_pairs: int, has_prefill: bool) -> int:
        memory_s = (self.weight_bytes / (self.weight_bandwidth_gb_s * 1e9)
                    + kv_tokens_read * self.kv_bytes_per_token / (self.kv_bandwidth_gb_s * 1e9))
        flops = 2 * self.params * tokens + 4 * self.layers * self.hidden * attention_pairs
        compute_s = flops / (self.compute_tflops * 1e12)
        work_s = memory_s + compute_s if self.memory_compute == "sum" else max(memory_s, compute_s)
        gpu_s = self.overhead_us * 1e-6 + work_s + self.per_seq_us * 1e-6 * seqs
        launch_s = (self.prefill_launch_us if has_prefill else self.decode_launch_us) * 1e-6
        multi_s = (self.multi_token_us + self.multi_token_kv_us * kv_tokens_read) * 1e-6 if tokens > 1 else 0.0
        return round((max(launch_s, gpu_s) + multi_s) * 1e9)

    # the two shapes of the measured table
    def prefill_ns(self, batch: int, prompt: int) -> int:
        return self.step_ns(batch * prompt, batch, batch * prompt, batch * prompt * (prompt + 1) // 2, True)

    def decode_ns(self, batch: int, context: int) -> int:
        return self.step_ns(batch, batch, batch * (context + 1), batch * (context + 1), False)


_SECTIONS = ("model", "step", "engine")
_OPTIONAL = {"description": "", "multi_token_us": 0.0, "multi_token_kv_us": 0.0, "request_overhead_us": 0.0,
             "memory_compute": "max"}
MEMORY_COMPUTE = ("max", "sum")


def shipped_profiles() -> list[str]:
    root = resources.files("loadgen.sim") / "profiles"
    return sorted(p.name[:-5] for p in root.iterdir() if p.name.endswith(".toml"))


def load_profile(name_or_file: str) -> Profile:
    """A shipped profile name (see shipped_profiles()) or a path to a TOML file; ValueError
    naming the file and every problem."""
    path = Path(name_or_file)
    if name_or_file.endswith(".toml") or path.exists():
        if not path.is_file():
            raise ValueError(f"--profile {name_or_file}: no such file")
        text, where = path.read_text(), str(path)
    else:
        res = resources.files("loadgen.sim") / "profiles" / f"{name_or_file}.toml"
        if not res.is_file():
            raise ValueError(f"--profile {name_or_file!r}: unknown profile (shipped: {', '.join(shipped_profiles())}; "
                             "or give a .toml file)")
        text, where = res.read_text(), f"profile {name_or_file}"
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"{where}: not valid TOML: {e}") from None
    flat = {k: data.get(k) for k in ("name", "model_name", "description", "max_model_len")}
    for sec in _SECTIONS:
        flat.update(data.get(sec, {}))
    problems = []
    values = {}
    for f in fields(Profile):
        v = flat.get(f.name)
        if v is None:
            if f.name in _OPTIONAL:
                v = _OPTIONAL[f.name]
            elif f.name == "name":
                v = path.stem if path.suffix == ".toml" else name_or_file
            else:
                problems.append(f"missing key '{f.name}'")
                continue
        if f.type in ("float", "int"):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
                problems.append(f"'{f.name}' must be a number >= 0, got {v!r}")
                continue
            v = int(v) if f.type == "int" else float(v)
        elif f.name == "memory_compute" and v not in MEMORY_COMPUTE:
            problems.append(f"'memory_compute' must be \"max\" or \"sum\", got {v!r}")
            continue
        values[f.name] = v
    for k in ("weight_bandwidth_gb_s", "kv_bandwidth_gb_s", "compute_tflops", "max_num_seqs",
              "max_num_batched_tokens", "kv_capacity_tokens", "max_model_len"):
        if values.get(k) == 0:
            problems.append(f"'{k}' must be > 0")
    if problems:
        raise ValueError(f"{where}: " + "; ".join(problems))
    return Profile(**values)
