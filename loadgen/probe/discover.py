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


def _whole(v) -> int | None:
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 else None


def published_limits(models: object, props: object) -> dict[str, int | None]:
    """Every limit a server publishes, from its answers (parsed JSON, None when it gave none) to
    GET /v1/models and GET /props; None where it publishes none (pure):
        max_model_len  tokens per sequence: /v1/models data[0].max_model_len (vLLM, SGLang, the simulator),
                       else llama.cpp's tokens per slot
        slots          sequences served at once: llama.cpp /props total_slots (vLLM and SGLang publish none)
        ctx_per_slot   llama.cpp /props default_generation_settings.n_ctx"""
    data = models.get("data") if isinstance(models, dict) else None
    first = data[0] if isinstance(data, list) and data and isinstance(data[0], dict) else {}
    props = props if isinstance(props, dict) else {}
    settings = props.get("default_generation_settings")
    ctx = _whole(settings.get("n_ctx")) if isinstance(settings, dict) else None
    return {"max_model_len": _whole(first.get("max_model_len")) or ctx, "slots": _whole(props.get("total_slots")),
            "ctx_per_slot": ctx}
