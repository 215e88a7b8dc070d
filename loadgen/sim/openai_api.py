"""OpenAI (vLLM-flavoured) surfaces: POST /v1/completions and /v1/chat/completions.

Accepted body fields: `prompt` (a string, a list of one string, or a list of token ids) or
`messages`; `max_tokens` (chat also `max_completion_tokens`; default DEFAULT_MAX_TOKENS);
`stream`; `stream_options.include_usage` (and `continuous_usage_stats`); `model` (echoed); anything else (`ignore_eos`,
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
"""
from __future__ import annotations

from typing import Any

import orjson

from loadgen.sim import tokenizer
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
                      {"continuous_usage": continuous, "llamacpp": getattr(sim, "emulate", "") == "llamacpp"})

    def token_bytes(self, ctx, start, end) -> bytes:
        last = self._last(ctx, end)
        chunk = {**self._head(ctx, "text_completion"),
                 "choices": [{"index": 0, "text": tokenizer.OUTPUT_TOKEN_TEXT * (end - start),
                              "logprobs": None, "finish_reason": "length" if last else None,
                              "stop_reason": None}]}
        return _sse(self._with_usage(ctx, chunk, end))

    def _llamacpp_finish(self, ctx, n_out) -> list[dict]:
        return [{**self._head(ctx, "text_completion"),
                 "choices": [{"text": "", "index": 0, "logprobs": None, "finish_reason": "length"}],
                 "usage": self.usage(ctx, n_out)}]

    def full_response(self, ctx, sim, token_ns) -> dict:
        out = {**self._head(ctx, "text_completion"),
               "choices": [{"index": 0, "text": tokenizer.OUTPUT_TOKEN_TEXT * len(token_ns),
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
        except ValueError as e:
            raise BadRequest(str(e)) from None
        return Parsed(tokenizer.words(text), max_tokens_field(body, "max_completion_tokens", "max_tokens"),
                      stream, model or sim.model, include_usage,
                      {"continuous_usage": continuous, "llamacpp": getattr(sim, "emulate", "") == "llamacpp",
                       "reasoning": getattr(sim, "reasoning_tokens", 0),
                       "reasoning_field": getattr(sim, "reasoning_field", "reasoning_content"),
                       "tool_calls": getattr(sim, "tool_calls", False)})

    def _delta(self, ctx: Context, start: int, end: int) -> dict:
        # Output tokens start..end-1: those below the reasoning count as reasoning, the rest as the answer.
        extra = ctx.parsed.extra
        r = extra.get("reasoning", 0)
        delta: dict[str, Any] = {}
        if start < r:
            delta[extra["reasoning_field"]] = tokenizer.OUTPUT_TOKEN_TEXT * (min(end, r) - start)
        first = max(start, r)
        if first < end:
            text = tokenizer.OUTPUT_TOKEN_TEXT * (end - first)
            if not extra.get("tool_calls"):
                delta["content"] = text
            elif first == r:  # the call's first piece: who it calls
                delta["tool_calls"] = [{"index": 0, "id": f"call-{ctx.request_id}", "type": "function",
                                        "function": {"name": "sim_tool", "arguments": text}}]
            else:
                delta["tool_calls"] = [{"index": 0, "function": {"arguments": text}}]
        return delta

    def _finish(self, ctx: Context) -> str:
        return "tool_calls" if ctx.parsed.extra.get("tool_calls") else "length"

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
