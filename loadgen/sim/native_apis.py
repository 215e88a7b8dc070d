"""Ollama and llama.cpp surfaces, on the same engine as the OpenAI ones.

Ollama, POST /api/generate {"prompt", "options": {"num_predict"}, "stream" (default true)} and
POST /api/chat {"messages", ...}: NDJSON, one object per chunk ({"response": "tok "} or
{"message": {"role": "assistant", "content": "tok "}}, "done": false), then a final "done": true
object with durations in ns: total_duration = finish - arrival, load_duration = 0 (the model
is always loaded), prompt_eval_duration = scheduled -> first token, eval_duration = first ->
last token (so the rest of total_duration is queueing); prompt_eval_count, eval_count.

llama.cpp, POST /completion {"prompt" (string or token ids), "n_predict", "stream" (default
false)}: SSE `data: {"content": "tok ", "stop": false}` per chunk, then a final `stop: true`
event (no [DONE]) with `timings`: prompt_n, prompt_ms (scheduled -> first token), predicted_n,
predicted_ms (first -> last token) and the per-token / per-second figures.

Missing num_predict / n_predict: DEFAULT_MAX_TOKENS (16), as for the OpenAI surfaces.
"""
from __future__ import annotations

import datetime

import orjson

from loadgen.sim import tokenizer
from loadgen.sim.server import DEFAULT_MAX_TOKENS, BadRequest, Context, Parsed, Surface


def _n(body: dict, key: str, where: dict | None = None) -> int:
    src = body if where is None else where
    v = src.get(key)
    if v is None or v == -1:
        return DEFAULT_MAX_TOKENS
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise BadRequest(f"'{key}' must be a positive integer, got {v!r}")
    return v


def _durations(ctx: Context, token_ns: list[int]) -> dict:
    gen = ctx.gen
    first, last = token_ns[0], token_ns[-1]
    sched = gen.scheduled_ns if gen.scheduled_ns is not None else gen.arrival_ns
    return {"total_duration": last - gen.arrival_ns, "load_duration": 0,
            "prompt_eval_count": gen.prompt_tokens, "prompt_eval_duration": first - sched,
            "eval_count": len(token_ns), "eval_duration": last - first}


def _now_iso() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat().replace("+00:00", "Z")


class _Ollama(Surface):
    content_type = "application/x-ndjson"

    def _parse(self, body, sim, text: str) -> Parsed:
        opts = body.get("options") or {}
        if not isinstance(opts, dict):
            raise BadRequest("'options' must be an object")
        return Parsed(tokenizer.words(text), _n(body, "num_predict", opts), bool(body.get("stream", True)),
                      str(body.get("model") or sim.model))

    def _piece(self, ctx: Context, text: str) -> dict:
        raise NotImplementedError

    def token_bytes(self, ctx, start, end) -> bytes:
        piece = self._piece(ctx, tokenizer.OUTPUT_TOKEN_TEXT * (end - start))
        obj = {"model": ctx.parsed.model, "created_at": _now_iso(), **piece, "done": False}
        return orjson.dumps(obj) + b"\n"

    def final_bytes(self, ctx, sim, token_ns) -> bytes:
        obj = {"model": ctx.parsed.model, "created_at": _now_iso(), **self._piece(ctx, ""), "done": True,
               "done_reason": "length", **_durations(ctx, token_ns)}
        return orjson.dumps(obj) + b"\n"

    def full_response(self, ctx, sim, token_ns) -> dict:
        return {"model": ctx.parsed.model, "created_at": _now_iso(),
                **self._piece(ctx, tokenizer.OUTPUT_TOKEN_TEXT * len(token_ns)), "done": True,
                "done_reason": "length", **_durations(ctx, token_ns)}

    def malformed_bytes(self) -> bytes:
        return b'{"model": "malformed", "response": "tok \n'

    def error_body(self, status, message) -> dict:
        return {"error": message}


class OllamaGenerate(_Ollama):
    endpoint = "ollama_generate"

    def parse(self, body, sim) -> Parsed:
        if not isinstance(body, dict) or not isinstance(body.get("prompt"), str):
            raise BadRequest("'prompt' must be a string")
        return self._parse(body, sim, body["prompt"])

    def _piece(self, ctx, text) -> dict:
        return {"response": text}


class OllamaChat(_Ollama):
    endpoint = "ollama_chat"

    def parse(self, body, sim) -> Parsed:
        if not isinstance(body, dict):
            raise BadRequest("the request body must be a JSON object")
        try:
            text = tokenizer.chat_prompt_text(body.get("messages"), getattr(sim, "chat_template", "none"))
        except ValueError as e:
            raise BadRequest(str(e)) from None
        return self._parse(body, sim, text)

    def _piece(self, ctx, text) -> dict:
        return {"message": {"role": "assistant", "content": text}}


def llamacpp_timings(ctx: Context, token_ns: list[int]) -> dict:
    # llama-server's `timings` object (keys and order as recorded in tests/data/llamacpp/): prompt_n
    # counts the prompt tokens it processed, cache_n those reused from its cache.
    d = _durations(ctx, token_ns)
    p_ms, g_ms = d["prompt_eval_duration"] / 1e6, d["eval_duration"] / 1e6
    cached = ctx.gen.cached_tokens if ctx.gen is not None else 0
    pn, gn = d["prompt_eval_count"] - cached, d["eval_count"]
    return {"cache_n": cached, "prompt_n": pn, "prompt_ms": p_ms, "prompt_per_token_ms": p_ms / pn if pn else 0.0,
            "prompt_per_second": pn / (p_ms / 1e3) if p_ms > 0 else 0.0,
            "predicted_n": gn, "predicted_ms": g_ms, "predicted_per_token_ms": g_ms / (gn - 1) if gn > 1 else 0.0,
            "predicted_per_second": (gn - 1) / (g_ms / 1e3) if g_ms > 0 else 0.0}


class LlamaCppCompletion(Surface):
    endpoint = "llamacpp_completion"

    def parse(self, body, sim) -> Parsed:
        if not isinstance(body, dict):
            raise BadRequest("the request body must be a JSON object")
        prompt = body.get("prompt")
        if isinstance(prompt, str):
            ids = tokenizer.words(prompt)
        elif isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            ids = list(prompt)
        else:
            raise BadRequest("'prompt' must be a string or a list of token ids")
        return Parsed(ids, _n(body, "n_predict"), bool(body.get("stream", False)), str(body.get("model") or sim.model))

    def token_bytes(self, ctx, start, end) -> bytes:
        return b"data: " + orjson.dumps({"content": tokenizer.OUTPUT_TOKEN_TEXT * (end - start), "stop": False,
                                         "id_slot": 0, "index": 0}) + b"\n\n"

    def _final(self, ctx, token_ns, content: str) -> dict:
        return {"content": content, "stop": True, "id_slot": 0, "index": 0, "model": ctx.parsed.model,
                "tokens_predicted": len(token_ns), "tokens_evaluated": len(ctx.parsed.prompt),
                "stop_type": "limit", "timings": llamacpp_timings(ctx, token_ns)}

    def final_bytes(self, ctx, sim, token_ns) -> bytes:
        return b"data: " + orjson.dumps(self._final(ctx, token_ns, "")) + b"\n\n"

    def full_response(self, ctx, sim, token_ns) -> dict:
        return self._final(ctx, token_ns, tokenizer.OUTPUT_TOKEN_TEXT * len(token_ns))

    def malformed_bytes(self) -> bytes:
        return b'data: {"content": "tok \n\n'

    def error_body(self, status, message) -> dict:
        kind = "server_error" if status >= 500 else "invalid_request_error"
        return {"error": {"code": status, "message": message, "type": kind}}


def routes():
    def handler(surface: Surface):
        def make(sim):
            async def h(request):
                return await sim.serve(request, surface)
            return h
        return make

    return [("POST", "/api/generate", handler(OllamaGenerate())),
            ("POST", "/api/chat", handler(OllamaChat())),
            ("POST", "/completion", handler(LlamaCppCompletion()))]
