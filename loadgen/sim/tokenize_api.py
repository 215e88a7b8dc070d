"""The simulator's tokenizer endpoints, answering in the shapes of the server it emulates (`--emulate`).

vllm (default; vLLM's protocol: TokenizeCompletionRequest / TokenizeChatRequest, TokenizeResponse):
    POST /tokenize {"model"?, "prompt": str, "add_special_tokens"?} or {"model"?, "messages": [...],
    "add_generation_prompt"?} -> {"count", "max_model_len", "tokens"}; any other body (llama.cpp's
    {"content"}, TGI's {"inputs"}) is a 400 error object, as vLLM's request validation answers it.
    POST /detokenize {"tokens": [ids]} -> {"prompt"}.
llamacpp (llama-server, tools/server: handle_tokenize, handle_apply_template, handle_props):
    POST /tokenize {"content": str, "add_special"?, "with_pieces"?} -> {"tokens": [ids]} (with_pieces:
    [{"id", "piece"}]); a body without `content` (e.g. the vLLM shape) -> 200 {"tokens": []}, as
    llama-server answers it. POST /detokenize {"tokens"} -> {"content"}. POST /apply-template
    {"messages"} -> {"prompt"}. GET /props -> default_generation_settings, total_slots, model_path,
    build_info.
The sim's tokenizer has no special tokens (sim/tokenizer.py): add_special_tokens and add_special change
nothing. Its chat template is `--chat-template` (none: a templated prompt is the messages' text, and
add_generation_prompt changes nothing; sim: role and end markers per message, see sim/tokenizer.py).
"""
from __future__ import annotations

import orjson
from aiohttp import web

from loadgen.sim import tokenizer
from loadgen.sim.server import json_response

EMULATE = ("vllm", "llamacpp")


def _vllm_error(message: str) -> web.Response:
    return json_response({"object": "error", "message": message, "type": "BadRequestError", "param": None,
                          "code": 400}, status=400)


def _llamacpp_error(message: str) -> web.Response:
    return json_response({"error": {"code": 400, "message": message, "type": "invalid_request_error"}}, status=400)


async def _body(request: web.Request):
    try:
        body = orjson.loads(await request.read())
    except orjson.JSONDecodeError as e:
        raise ValueError(f"body is not JSON: {e}") from None
    if not isinstance(body, dict):
        raise ValueError("body must be a JSON object")
    return body


def routes(emulate: str):
    """(method, path, make_handler(sim)) for the flavour; make_handler as in native_apis.routes."""
    if emulate == "llamacpp":
        return [("POST", "/tokenize", _llamacpp_tokenize), ("POST", "/detokenize", _llamacpp_detokenize),
                ("POST", "/apply-template", _llamacpp_apply_template), ("GET", "/props", _llamacpp_props)]
    return [("POST", "/tokenize", _vllm_tokenize), ("POST", "/detokenize", _vllm_detokenize)]


def _vllm_tokenize(sim):
    async def h(request):
        try:
            body = await _body(request)
            if isinstance(body.get("messages"), list):
                gen = body.get("add_generation_prompt", True) is not False  # vLLM's default: True
                ids = tokenizer.encode(tokenizer.chat_prompt_text(body["messages"], sim.chat_template, gen))
            elif isinstance(body.get("prompt"), str):
                ids = tokenizer.encode(body["prompt"])
            else:
                raise ValueError("1 validation error: field 'prompt' (string) or 'messages' (list) required")
        except ValueError as e:
            return _vllm_error(str(e))
        return json_response({"count": len(ids), "max_model_len": sim.max_model_len, "tokens": ids})
    return h


def _ids(body: dict) -> list[int]:
    ids = body.get("tokens")
    if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise ValueError("expected {'tokens': [ints]}")
    return ids


def _vllm_detokenize(sim):
    async def h(request):
        try:
            return json_response({"prompt": tokenizer.decode(_ids(await _body(request)))})
        except ValueError as e:
            return _vllm_error(str(e))
    return h


def _llamacpp_tokenize(sim):
    async def h(request):
        try:
            body = await _body(request)
        except ValueError as e:
            return _llamacpp_error(str(e))
        content = body.get("content")
        if not isinstance(content, str):
            return json_response({"tokens": []})  # llama-server: no `content`, no tokens (and no error)
        words = tokenizer.words(content)
        ids = [tokenizer.token_id(w) for w in words]
        if body.get("with_pieces"):
            return json_response({"tokens": [{"id": i, "piece": w} for i, w in zip(ids, words)]})
        tokenizer.encode(content)  # remember the words for /detokenize
        return json_response({"tokens": ids})
    return h


def _llamacpp_detokenize(sim):
    async def h(request):
        try:
            return json_response({"content": tokenizer.decode(_ids(await _body(request)))})
        except ValueError as e:
            return _llamacpp_error(str(e))
    return h


def _llamacpp_apply_template(sim):
    async def h(request):
        try:
            messages = (await _body(request)).get("messages")
            return json_response({"prompt": tokenizer.chat_prompt_text(messages, sim.chat_template)})
        except ValueError as e:
            return _llamacpp_error(str(e))
    return h


def _llamacpp_props(sim):
    async def h(request):
        engine = getattr(sim.backend, "engine", None)  # fixed mode: no engine, unlimited concurrency
        slots = engine.cfg.max_num_seqs if engine is not None else 1
        return json_response({"default_generation_settings": {"n_ctx": sim.max_model_len, "params": {}},
                              "total_slots": slots, "model_path": sim.model, "build_info": "loadgen-sim",
                              "chat_template": ""})
    return h
