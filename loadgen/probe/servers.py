"""What kind of server the target is (recorded in the manifest as `target.server`), found by asking it.

Kinds: vllm, sglang, llamacpp, tgi, ollama, loadgen-sim (the built-in simulator), unknown.
Evidence (each GET has a short total deadline; a missing endpoint is simply no evidence):
    GET /v1/models     data[].owned_by: "vllm", "sglang", "llamacpp", "loadgen-sim"; "library" (Ollama)
    GET /props         llama.cpp's server properties (default_generation_settings, total_slots, build_info)
    GET /info          TGI's router info (router = "text-generation-router", model_id)
    GET /version       vLLM and SGLang: {"version"}; GET /api/version: Ollama {"version"}
    GET /get_server_info  SGLang
    headers            Server: llama.cpp
    GET /metrics       metric name prefixes: vllm:, sglang:, llamacpp:, tgi_
Each clue votes for a kind with a weight (a clue only one engine gives weighs 2, a shared or generic one
1); the kind with the most weight wins, `unknown` without any. Result: {"kind", "version", "evidence":
[clue strings], "votes": {kind: weight}}.
"""
from __future__ import annotations

import re
import ssl
from typing import TextIO

import orjson

from loadgen.probe.probe_http import Probe, ProbeError

KINDS = ("vllm", "sglang", "llamacpp", "tgi", "ollama", "loadgen-sim", "unknown")
DETECT_TIMEOUT_S = 3.0
_OWNERS = {"vllm": "vllm", "sglang": "sglang", "llamacpp": "llamacpp", "loadgen-sim": "loadgen-sim",
           "library": "ollama", "ollama": "ollama"}
_METRIC_PREFIXES = (("vllm:", "vllm"), ("sglang:", "sglang"), ("llamacpp:", "llamacpp"), ("tgi_", "tgi"))


def _json(status: int, data: bytes):
    if status != 200:
        return None
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return None


def classify(answers: dict[str, tuple[int, dict[str, str], bytes] | None]) -> dict:
    """The kind from the answers to the GETs above (path -> (status, headers, body) or None): pure."""
    votes: dict[str, int] = {}
    evidence: list[str] = []
    version = None

    def vote(kind: str, weight: int, clue: str) -> None:
        votes[kind] = votes.get(kind, 0) + weight
        evidence.append(f"{clue} -> {kind}")

    for path, answer in answers.items():
        if answer is None:
            continue
        status, headers, data = answer
        if headers.get("server", "").lower().startswith("llama.cpp"):
            vote("llamacpp", 1, f"{path}: Server header {headers['server']!r}")
            break
    for path, answer in answers.items():
        if answer is None:
            continue
        status, headers, data = answer
        obj = None if path == "/metrics" else _json(status, data)
        if path == "/v1/models" and isinstance(obj, dict) and isinstance(obj.get("data"), list):
            for m in obj["data"][:1]:
                owner = str(m.get("owned_by", "")) if isinstance(m, dict) else ""
                if owner in _OWNERS:
                    vote(_OWNERS[owner], 2, f"/v1/models owned_by {owner!r}")
        elif path == "/props" and isinstance(obj, dict) and ("default_generation_settings" in obj
                                                             or "total_slots" in obj):
            vote("llamacpp", 2, "/props has default_generation_settings/total_slots")
            version = version or obj.get("build_info")
        elif path == "/info" and isinstance(obj, dict) and "model_id" in obj and (
                "router" in obj or "max_input_tokens" in obj or "max_total_tokens" in obj):
            vote("tgi", 2, f"/info router {obj.get('router')!r}")
            version = version or obj.get("version")
        elif path == "/api/version" and isinstance(obj, dict) and isinstance(obj.get("version"), str):
            vote("ollama", 2, "/api/version answers")
            version = version or obj["version"]
        elif path == "/get_server_info" and isinstance(obj, dict):
            vote("sglang", 2, "/get_server_info answers")
        elif path == "/version" and isinstance(obj, dict) and isinstance(obj.get("version"), str):
            evidence.append(f"/version {obj['version']!r}")
            version = version or obj["version"]
        elif path == "/metrics" and status == 200:
            names = set(re.findall(rb"^([a-zA-Z_:][a-zA-Z0-9_:]*)", data, re.M))
            for prefix, kind in _METRIC_PREFIXES:
                n = sum(1 for name in names if name.startswith(prefix.encode()))
                if n:
                    vote(kind, 1, f"/metrics: {n} {prefix}* metric names")
    kind = max(votes, key=lambda k: (votes[k], -KINDS.index(k))) if votes else "unknown"
    return {"kind": kind, "version": version if isinstance(version, str) else None, "evidence": evidence,
            "votes": votes}


PATHS = ("/v1/models", "/props", "/info", "/version", "/api/version", "/get_server_info", "/metrics")


def detect(base_url: str, headers: dict[str, str] | None = None, timeout_s: float = DETECT_TIMEOUT_S,
           progress: TextIO | None = None, tls: ssl.SSLContext | bool = True) -> dict:
    """The kind (classify) from the GETs of PATHS, with the run's headers and TLS choice (probe_http.py);
    a certificate that does not verify raises ConfigError."""
    if progress is not None:
        progress.write(f"detecting the server kind (GET {', '.join(PATHS)}; at most {timeout_s:g} s each)\n")
        progress.flush()
    probe = Probe(base_url, timeout_s, headers, tls)
    answers: dict = {}
    errors = []
    try:
        for path in PATHS:
            try:
                answers[path] = probe.get(path)
            except ProbeError as e:
                answers[path] = None
                errors.append(str(e))
                if e.unreachable:
                    break  # nothing answers: do not wait again for every path
    finally:
        probe.close()
    out = classify(answers)
    if errors:
        out["errors"] = errors[:3]
    return out
