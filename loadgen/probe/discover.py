"""What the target serves, asked before the run: its models (`GET /v1/models`; Ollama's `/api/tags`) and
their context limit.

discover_model: the model to ask for, when the workload and flags do not name one: the target's
`GET /v1/models` (OpenAI-compatible servers, Ollama's /v1, llama.cpp's server, the built-in simulator).
One model served: that one (said on stderr, recorded in the manifest's config.model). Several, none, or
no answer within DISCOVER_TIMEOUT_S: a named input error (exit 2) that lists what the server offers.

check_model: a named model the target does not serve is an input error (exit 2) listing what it serves
(Ollama's `name` matches `name:latest`). Not checked: servers that answer under any model name (llama.cpp's
llama-server, which serves its one model; loadgen's simulator, which echoes the name), and a target whose
model list does not answer (a warning; the run goes on).

context_limit: the most tokens (prompt + max_tokens) one request of the model may hold, and where that
was read: `max_model_len` of its `/v1/models` entry (vLLM, SGLang, the simulator); else llama.cpp's
per-slot context, `GET /props` `default_generation_settings.n_ctx` (or its total `n_ctx` / `total_slots`,
or `/v1/models` `meta.n_ctx` / `total_slots`). None when the target publishes none (Ollama, TGI: the plan
is then not checked, plan/context.py).
"""
from __future__ import annotations

import json
import ssl
from dataclasses import dataclass, field

from loadgen.config.workload import ConfigError
from loadgen.config.credentials import redact_url
from loadgen.probe.probe_http import Probe, ProbeError

DISCOVER_TIMEOUT_S = 5.0
ANY_NAME_KINDS = ("llamacpp", "loadgen-sim")   # servers.py kinds that answer under any model name


def _base(url: str) -> str:
    return url.rstrip("/").removesuffix("/v1")


def _fetch(url: str, path: str, headers: dict[str, str], tls: ssl.SSLContext | bool,
           timeout_s: float) -> tuple[int, bytes]:
    """(status, body) of GET base + path through the bounded probe (the run's TLS choice and headers);
    raises ProbeError (no complete answer) or ConfigError (a certificate that does not verify)."""
    probe = Probe(url, timeout_s, headers, tls)
    try:
        status, _, body = probe.get(path)
        return status, body
    finally:
        probe.close()


def discover_model(url: str, headers: dict[str, str], tls: ssl.SSLContext | bool = True,
                   timeout_s: float = DISCOVER_TIMEOUT_S) -> str:
    """tls: the run's choice (ClientOptions.ssl_context; probe_http.py turns it into the context)."""
    where = redact_url(_base(url)) + "/v1/models"
    try:
        status, body = _fetch(url, "/v1/models", headers, tls, timeout_s)
    except ProbeError as e:
        raise ConfigError([f"model: not given, and {where} did not answer within {timeout_s:g}s ({e}): "
                           f"pass --model"]) from None
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


@dataclass(frozen=True)
class Served:
    """The target's model list: ids in its order, each entry as served, and the URL that listed them."""
    where: str                                         # e.g. http://host:port/v1/models (no credentials)
    models: tuple[str, ...]
    entries: dict[str, dict] = field(default_factory=dict)
    problem: str | None = None                         # why there is no list (then models is empty)


def _get_json(url: str, path: str, headers: dict[str, str], tls: ssl.SSLContext | bool,
              timeout_s: float) -> tuple[object, str | None]:
    """(the decoded answer, None) or (None, why not)."""
    try:
        status, body = _fetch(url, path, headers, tls, timeout_s)
    except ProbeError as e:
        return None, f"no answer within {timeout_s:g}s ({e})"
    if status != 200:
        return None, f"HTTP {status}"
    try:
        return json.loads(body), None
    except ValueError:
        return None, "not JSON"


def served_models(url: str, headers: dict[str, str], tls: ssl.SSLContext | bool = True,
                  timeout_s: float = DISCOVER_TIMEOUT_S) -> Served:
    """GET /v1/models (data[].id); when that gives no list, Ollama's GET /api/tags (models[].name)."""
    problems = []
    for path, key, name in (("/v1/models", "data", "id"), ("/api/tags", "models", "name")):
        where = redact_url(_base(url)) + path
        obj, why = _get_json(url, path, headers, tls, timeout_s)
        items = obj.get(key) if isinstance(obj, dict) else None
        if isinstance(items, list):
            entries = {m[name]: m for m in items if isinstance(m, dict) and isinstance(m.get(name), str)}
            return Served(where, tuple(entries), entries)
        problems.append(f"{where}: {why or 'no model list'}")
    return Served(redact_url(_base(url)) + "/v1/models", (), {}, "; ".join(problems))


def _serves(served: Served, model: str) -> str | None:
    """The served id the model's name means (Ollama: `name` is `name:latest`), None if not served."""
    for m in (model, f"{model}:latest"):
        if m in served.entries:
            return m
    return None


def check_model(model: str, served: Served, server_kind: str | None, key: str = "model") -> str | None:
    """Raises ConfigError when the target lists models and `model` is not one (the message names `key`,
    e.g. a [[mix]] class's `mix[1].model`); returns a warning when the check could not be made (None
    otherwise)."""
    # the simulator answers under any name unless it serves LoRA adapters (--lora-modules): it lists them
    # beside its model and then answers only under those names, as vLLM does
    strict_sim = server_kind == "loadgen-sim" and served.problem is None and len(served.models) > 1
    if server_kind in ANY_NAME_KINDS and not strict_sim:
        return None
    if served.problem is not None:
        return f"could not check that the target serves model {model!r}: {served.problem}"
    if _serves(served, model) is None:
        listed = ", ".join(served.models[:20]) + (f" (and {len(served.models) - 20} more)"
                                                  if len(served.models) > 20 else "")
        hint = ("pass one of them with --model (or set none: the one model served is then used)" if key == "model"
                else "name one of them (a LoRA adapter is listed under its name once the server loads it)")
        raise ConfigError([f"{key}: {model!r} is not served by the target: {served.where} lists "
                           f"{listed or 'no models'}; {hint}"])
    return None


def _dict(v: object) -> dict:
    return v if isinstance(v, dict) else {}


def _whole(v: object) -> int | None:
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 1 else None


def context_limit(url: str, headers: dict[str, str], served: Served, model: str,
                  tls: ssl.SSLContext | bool = True,
                  timeout_s: float = DISCOVER_TIMEOUT_S) -> tuple[int | None, str]:
    """(tokens, where it was read) of one request's context; (None, why none) when unpublished."""
    entry = served.entries.get(_serves(served, model) or "", {})
    limit = _whole(entry.get("max_model_len"))
    if limit:
        return limit, f"max_model_len of {model!r} in {served.where}"
    props, _ = _get_json(url, "/props", headers, tls, timeout_s)
    if isinstance(props, dict):
        where = redact_url(_base(url)) + "/props"
        published = published_limits(None, props)  # the one reader of llama.cpp's slots and per-slot context
        slots, per_slot = published["slots"] or 1, published["ctx_per_slot"]
        if per_slot:
            return per_slot, f"default_generation_settings.n_ctx (per slot) in {where}"
        total = _whole(props.get("n_ctx")) or _whole(_dict(entry.get("meta")).get("n_ctx"))
        if total:
            return total // slots, f"n_ctx {total} / total_slots {slots} in {where}"
    return None, f"not published by the target ({served.where} has no max_model_len, no llama.cpp /props)"


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
