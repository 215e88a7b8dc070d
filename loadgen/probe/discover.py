"""The model to ask for, when the workload and flags do not name one: the target's `GET /v1/models`
(OpenAI-compatible servers, Ollama's /v1, llama.cpp's server, the built-in simulator). One model served:
that one (said on stderr, recorded in the manifest's config.model). Several, none, or no answer within
DISCOVER_TIMEOUT_S: a named input error (exit 2) that lists what the server offers.
"""
from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request

from loadgen.config.workload import ConfigError
from loadgen.config.credentials import redact_url

DISCOVER_TIMEOUT_S = 5.0


def discover_model(url: str, headers: dict[str, str], tls: ssl.SSLContext | bool = True,
                   timeout_s: float = DISCOVER_TIMEOUT_S) -> str:
    where = redact_url(url.rstrip("/").removesuffix("/v1")) + "/v1/models"
    context = None
    if url.startswith("https://"):
        context = tls if isinstance(tls, ssl.SSLContext) else ssl.create_default_context()
        if tls is False:
            context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    req = urllib.request.Request(url.rstrip("/").removesuffix("/v1") + "/v1/models", headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout_s, context=context) as resp:
            body = resp.read(1 << 20)
    except urllib.error.HTTPError as e:
        raise ConfigError([f"model: not given, and {where} answered HTTP {e.code}: pass --model"]) from None
    except (urllib.error.URLError, OSError, ValueError) as e:
        why = getattr(e, "reason", None) or e
        raise ConfigError([f"model: not given, and {where} did not answer within {timeout_s:g}s ({why}): "
                           f"pass --model"]) from None
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
