"""The model to ask for, when the workload and flags do not name one: the target's `GET /v1/models`
(OpenAI-compatible servers, Ollama's /v1, llama.cpp's server, the built-in simulator). One model served:
that one (said on stderr, recorded in the manifest's config.model). Several, none, or no answer within
DISCOVER_TIMEOUT_S: a named input error (exit 2) that lists what the server offers.
"""
from __future__ import annotations

import json
import ssl

from loadgen.config.workload import ConfigError
from loadgen.config.credentials import redact_url
from loadgen.probe.probe_http import Probe, ProbeError

DISCOVER_TIMEOUT_S = 5.0


def discover_model(url: str, headers: dict[str, str], tls: ssl.SSLContext | bool = True,
                   timeout_s: float = DISCOVER_TIMEOUT_S) -> str:
    """tls: the run's choice (ClientOptions.ssl_context; probe_http.py turns it into the context)."""
    where = redact_url(url.rstrip("/").removesuffix("/v1")) + "/v1/models"
    probe = Probe(url, timeout_s, headers, tls)  # a certificate that does not verify: ConfigError
    try:
        status, _, body = probe.get("/v1/models")
    except ProbeError as e:
        raise ConfigError([f"model: not given, and {where} did not answer within {timeout_s:g}s ({e}): "
                           f"pass --model"]) from None
    finally:
        probe.close()
    if status != 200:
        raise ConfigError([f"model: not given, and {where} answered HTTP {status}: pass --model"])
    try:
        data = json.loads(body)
        ids = [m["id"] for m in data["data"] if isinstance(m, dict) and isinstance(m.get("id"), str)]
    except (ValueError, KeyError, TypeError):
        raise ConfigError([f"model: not given, and {where} did not return an OpenAI model list: "
                           f"pass --model"]) from None
    if len(ids) != 1:
        offered = ", ".join(ids[:20]) or "none"
        raise ConfigError([f"model: not given, and {where} serves {len(ids)} models ({offered}): pass --model"])
    return ids[0]
