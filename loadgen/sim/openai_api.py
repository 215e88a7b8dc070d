"""OpenAI (vLLM-flavoured) surfaces: POST /v1/completions and /v1/chat/completions.

Accepted body fields: `prompt` (a string, a list of one string, or a list of token ids) or
`messages`; `max_tokens` (chat also `max_completion_tokens`; default DEFAULT_MAX_TOKENS);
`stream`; `stream_options.include_usage` (and `continuous_usage_stats`); `model` (echoed; with
--lora-modules one not served is a 404 as vLLM's); `priority` (an int64, default 0: the engine orders its
queue by it under --scheduling-policy priority, engine.py); anything else (`ignore_eos`,
`min_tokens`, `temperature`, ...) is accepted and ignored: the output is always exactly
max_tokens tokens, finish_reason "length".

Streaming is SSE as vLLM writes it: `data: {json}\\n\\n` per token (one token per chunk, or
--tokens-per-chunk K), chat's first event carries `delta.role` with empty content (sent together
with the first token, as vLLM does), the last token's chunk has finish_reason "length", then a
usage chunk with empty `choices` when include_usage (with --per-request-metrics it carries vLLM's
`metrics` object), then `data: [DONE]\\n\\n`.

Reasoning and tool calls (chat only; server flags, so every request of a run gets them):
--reasoning-tokens R makes output tokens 0..R-1 stream as `delta.<--reasoning-field>` (reasoning_content,
or reasoning as vLLM >= 0.19.1) and the rest as the answer; a chunk that spans the boundary carries both
fields; the usage says `completion_tokens_details.reasoning_tokens` = the reasoning tokens sent.
--tool-calls makes the answer stream as `delta.tool_calls` pieces of one call: the first answer chunk
carries its index, id, type and `function.name` with the first arguments text, each later one
`{"index": 0, "function": {"arguments": text}}`; the last chunk's finish_reason is "tool_calls". Token
text is "tok " in every field, so each field's tokens are the sim tokenizer's count of its text.

A request that sends `tools` (chat) or `response_format` gets a structured reply instead (sim/structured.py):
a tool call of a declared function with JSON arguments, or JSON content of the schema, a word per token;
the truth says whether it is valid (--invalid-json-share draws some invalid).
"""
from __future__ import annotations

from typing import Any

import orjson

from loadgen.sim import images, tokenizer
from loadgen.sim.native_apis import llamacpp_timings
from loadgen.sim.server import DEFAULT_MAX_TOKENS, BadRequest, Context, Parsed, Surface, server_timings



def max_tokens_field(body: dict, *keys: str) -> int:
    for key in keys:
        v = body.get(key)
        if v is not None:
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise BadRequest(f"'{key}' must be a positive integer, got {v!r}")
            return v
    return DEFAULT_MAX_TOKENS


INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1   # vLLM's bounds on `priority`


def _priority(body: dict) -> int:
    # vLLM's `priority: int = 0` (lower is served first under --scheduling-policy priority)
    v = body.get("priority", 0)
    if isinstance(v, bool) or not isinstance(v, int) or not INT64_MIN <= v <= INT64_MAX:
        raise BadRequest(f"'priority' must be an integer in [{INT64_MIN}, {INT64_MAX}], got {v!r}")
    return v


def _common(body: Any) -> tuple[bool, bool, bool, str]:
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    stream = bool(body.get("stream", False))
    opts = body.get("stream_options") or {}
    if not isinstance(opts, dict):
        raise BadRequest("'stream_options' must be an object")
    include_usage = bool(opts.get("include_usage", False))
    continuous = include_usage and bool(opts.get("continuous_usage_stats", False))
    return stream, include_usage, continuous, str(body.get("model") or "")


def _structure(body: dict, chat: bool) -> dict:
    # the fields server.py's structured.plan reads (tools only on chat); {} when none is sent
    keys = ("tools", "tool_choice", "response_format") if chat else ("response_format",)
    fields = {k: body[k] for k in keys if body.get(k) is not None}
    return {"structure": fields} if fields else {}


def _text(ctx: Context, start: int, end: int) -> str:
    reply = ctx.parsed.extra.get("reply")
    return reply.text(start, end) if reply is not None else tokenizer.OUTPUT_TOKEN_TEXT * (end - start)


def _sse(obj: dict) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


class _OpenAI(Surface):
    object_chunk = ""
    id_prefix = ""

    def _head(self, ctx: Context, obj: str) -> dict:
        return {"id": f"{self.id_prefix}{ctx.request_id}", "object": obj, "created": ctx.created_s,
                "model": ctx.parsed.model}

    def usage(self, ctx: Context, n_out: int) -> dict:
        p = len(ctx.parsed.prompt)
        u: dict[str, Any] = {"prompt_tokens": p, "total_tokens": p + n_out, "completion_tokens": n_out}
        if ctx.gen is not None and ctx.gen.cached_tokens:
            u["prompt_tokens_details"] = {"cached_tokens": ctx.gen.cached_tokens}
        if ctx.parsed.extra.get("reasoning"):
            u["completion_tokens_details"] = {"reasoning_tokens": min(ctx.parsed.extra["reasoning"], n_out)}
        return u

    def final_bytes(self, ctx, sim, token_ns) -> bytes:
        if getattr(sim, "emulate", "vllm") == "llamacpp":
            return self._llamacpp_final(ctx, token_ns)
        out = b""
        if ctx.parsed.include_usage:
            chunk = {**self._head(ctx, self.object_chunk), "choices": [], "usage": self.usage(ctx, len(token_ns))}
            if sim.per_request_metrics and token_ns:
                chunk["metrics"] = server_timings(ctx.gen, token_ns)
            out += _sse(chunk)
        return out + b"data: [DONE]\n\n"

    def _llamacpp_final(self, ctx: Context, token_ns: list[int]) -> bytes:
        chunks = self._llamacpp_finish(ctx, len(token_ns))
        if token_ns:
            chunks[-1]["timings"] = llamacpp_timings(ctx, token_ns)
        return b"".join(_sse(c) for c in chunks) + b"data: [DONE]\n\n"

    def _llamacpp_finish(self, ctx: Context, n_out: int) -> list[dict]:
        raise NotImplementedError

    def _last(self, ctx: Context, end: int) -> bool:
        return end == ctx.parsed.max_tokens and not ctx.parsed.extra.get("llamacpp")

    def _with_usage(self, ctx: Context, chunk: dict, n_out: int) -> dict:
        # include_usage: `usage: null` on every chunk but the last, or running counts with
        # stream_options.continuous_usage_stats (as vLLM)
        if ctx.parsed.include_usage:
            chunk["usage"] = self.usage(ctx, n_out) if ctx.parsed.extra.get("continuous_usage") else None
        return chunk


class Completions(_OpenAI):
    endpoint = "completions"
    object_chunk = "text_completion"
    id_prefix = "cmpl-"

    def parse(self, body, sim) -> Parsed:
        stream, include_usage, continuous, model = _common(body)
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if isinstance(prompt, str):
            ids = tokenizer.words(prompt)
        elif isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            ids = list(prompt)
        else:
            raise BadRequest("'prompt' must be a string or a list of token ids (one prompt per request)")
        return Parsed(ids, max_tokens_field(body, "max_tokens"), stream, model or sim.model, include_usage,
                      {"continuous_usage": continuous, "llamacpp": getattr(sim, "emulate", "") == "llamacpp",
                       **_structure(body, chat=False)},
                      priority=_priority(body))

    def token_bytes(self, ctx, start, end) -> bytes:
        last = self._last(ctx, end)
        chunk = {**self._head(ctx, "text_completion"),
                 "choices": [{"index": 0, "text": _text(ctx, start, end),
                              "logprobs": None, "finish_reason": "length" if last else None,
                              "stop_reason": None}]}
        return _sse(self._with_usage(ctx, chunk, end))

    def _llamacpp_finish(self, ctx, n_out) -> list[dict]:
        return [{**self._head(ctx, "text_completion"),
                 "choices": [{"text": "", "index": 0, "logprobs": None, "finish_reason": "length"}],
                 "usage": self.usage(ctx, n_out)}]

    def full_response(self, ctx, sim, token_ns) -> dict:
        out = {**self._head(ctx, "text_completion"),
               "choices": [{"index": 0, "text": _text(ctx, 0, len(token_ns)),
                            "logprobs": None, "finish_reason": "length", "stop_reason": None}],
               "usage": self.usage(ctx, len(token_ns))}
        if sim.per_request_metrics and token_ns:
            out["metrics"] = server_timings(ctx.gen, token_ns)
        return out


class ChatCompletions(_OpenAI):
    endpoint = "chat"
    object_chunk = "chat.completion.chunk"
    id_prefix = "chatcmpl-"

    def parse(self, body, sim) -> Parsed:
        stream, include_usage, continuous, model = _common(body)
        try:
            text = tokenizer.chat_prompt_text(body.get("messages"), getattr(sim, "chat_template", "none"))
            pictures = images.image_tokens(body.get("messages"))
            results = tokenizer.tool_call_ids(body["messages"])
        except ValueError as e:
            raise BadRequest(str(e)) from None
        return Parsed(tokenizer.words(text) + pictures, max_tokens_field(body, "max_completion_tokens", "max_tokens"),
                      stream, model or sim.model, include_usage,
                      {"continuous_usage": continuous, "llamacpp": getattr(sim, "emulate", "") == "llamacpp",
                       "reasoning": getattr(sim, "reasoning_tokens", 0),
                       "reasoning_field": getattr(sim, "reasoning_field", "reasoning_content"),
                       "tool_calls": getattr(sim, "tool_calls", False), "image_tokens": len(pictures),
                       "tool_results": results,
                       **_structure(body, chat=True)},
                      priority=_priority(body))

    def _delta(self, ctx: Context, start: int, end: int) -> dict:
        # Output tokens start..end-1: those below the reasoning count as reasoning, the rest as the answer.
        extra = ctx.parsed.extra
        r = extra.get("reasoning", 0)
        delta: dict[str, Any] = {}
        if start < r:
            delta[extra["reasoning_field"]] = tokenizer.OUTPUT_TOKEN_TEXT * (min(end, r) - start)
        first = max(start, r)
        if first < end:
            reply = extra.get("reply")  # a structured reply (sim/structured.py), else the plain "tok " text
            text = reply.text(first - r, end - r) if reply is not None else tokenizer.OUTPUT_TOKEN_TEXT * (end - first)
            if not self._calls(ctx):
                delta["content"] = text
            elif first == r:  # the call's first piece: who it calls
                name = reply.name if reply is not None else "sim_tool"
                delta["tool_calls"] = [{"index": 0, "id": f"call-{ctx.request_id}", "type": "function",
                                        "function": {"name": name, "arguments": text}}]
            else:
                delta["tool_calls"] = [{"index": 0, "function": {"arguments": text}}]
        return delta

    @staticmethod
    def _calls(ctx: Context) -> bool:
        # the answer is a tool call: the request's tools (a structured reply), else --tool-calls
        reply = ctx.parsed.extra.get("reply")
        return reply.kind == "call" if reply is not None else bool(ctx.parsed.extra.get("tool_calls"))

    def _finish(self, ctx: Context) -> str:
        return "tool_calls" if self._calls(ctx) else "length"

    def first_bytes(self, ctx) -> bytes:
        chunk = {**self._head(ctx, "chat.completion.chunk"),
                 "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                              "logprobs": None, "finish_reason": None}]}
        return _sse(self._with_usage(ctx, chunk, 0))

    def token_bytes(self, ctx, start, end) -> bytes:
        last = self._last(ctx, end)
        chunk = {**self._head(ctx, "chat.completion.chunk"),
                 "choices": [{"index": 0, "delta": self._delta(ctx, start, end),
                              "logprobs": None, "finish_reason": self._finish(ctx) if last else None}]}
        return _sse(self._with_usage(ctx, chunk, end))

    def _llamacpp_finish(self, ctx, n_out) -> list[dict]:
        out = [{**self._head(ctx, "chat.completion.chunk"),
                "choices": [{"finish_reason": self._finish(ctx), "index": 0, "delta": {}}]}]
        if ctx.parsed.include_usage:
            out.append({**self._head(ctx, "chat.completion.chunk"), "choices": [], "usage": self.usage(ctx, n_out)})
        return out

    def full_response(self, ctx, sim, token_ns) -> dict:
        out = {**self._head(ctx, "chat.completion"),
               "choices": [{"index": 0, "message": {"role": "assistant", **self._message(ctx, len(token_ns))},
                            "logprobs": None, "finish_reason": self._finish(ctx)}],
               "usage": self.usage(ctx, len(token_ns))}
        if sim.per_request_metrics and token_ns:
            out["metrics"] = server_timings(ctx.gen, token_ns)
        return out

    def _message(self, ctx: Context, n: int) -> dict:
        # The non-streamed reply: the stream's fields, whole (content null beside a tool call, as OpenAI).
        delta = self._delta(ctx, 0, n)
        return {"content": None, **delta} if "tool_calls" in delta else {"content": "", **delta}
