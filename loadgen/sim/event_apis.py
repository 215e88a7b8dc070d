"""Event-stream surfaces: OpenAI's Responses API (POST /v1/responses) and Anthropic's Messages API
(POST /v1/messages), with the event shapes vLLM 0.32 writes (tests/data/vllm/*_stream.json, recorded).

Both stream SSE events `event: <type>\\ndata: {"type": <type>, ...}\\n\\n`; the opening events are written
as soon as the response starts (before the first token, as vLLM and the real APIs do); one delta event per
chunk of tokens (--tokens-per-chunk K); --reasoning-tokens R makes output tokens 0..R-1 reasoning (the
truth's first_answer_ns is token R's send time); --tool-calls applies to chat only. Token text is "tok ".

/v1/responses: {"input": a string or a list of messages (content a string or parts with `text`),
"instructions" (a system message before them), "max_output_tokens", "stream"}. Events: response.created,
response.in_progress; a reasoning item (output_item.added, response.reasoning_text.delta...,
reasoning_text.done, output_item.done) when R > 0; the message item (output_item.added, content_part.added,
response.output_text.delta..., output_text.done, content_part.done, output_item.done); then
response.completed whose response has status "incomplete" with incomplete_details.reason
"max_output_tokens" (the output always reaches it, as vLLM reports that case) and usage {input_tokens,
input_tokens_details.cached_tokens, output_tokens, output_tokens_details.reasoning_tokens, total_tokens},
plus vLLM's per-request `metrics` with --per-request-metrics. No [DONE].

/v1/messages: {"system" (a string or text blocks), "messages", "max_tokens", "stream"}. Events:
message_start (message.usage: input_tokens = prompt - cached, output_tokens 0), a thinking block
(content_block_start, thinking_delta..., content_block_stop) when R > 0, a text block (content_block_start,
text_delta..., content_block_stop), message_delta (stop_reason "max_tokens"; usage: input_tokens,
cache_read_input_tokens when the prefix cache served some, output_tokens), message_stop.
A missing max token count is DEFAULT_MAX_TOKENS, as on every surface.
"""
from __future__ import annotations

from typing import Any

import orjson

from loadgen.sim import tokenizer
from loadgen.sim.openai_api import max_tokens_field
from loadgen.sim.server import BadRequest, Context, Parsed, Surface, server_timings

TEXT = tokenizer.OUTPUT_TOKEN_TEXT


def _event(kind: str, **fields: Any) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps({"type": kind, **fields}) + b"\n\n"


def _prompt(messages: Any, system: Any, sim) -> list:
    """The prompt's tokens: the system text as a first system message, then the messages (chat's rule)."""
    if isinstance(messages, str):
        messages = [{"role": "user", "content": messages}]
    if system is not None:
        try:
            text = tokenizer.message_text(system)
        except ValueError:
            raise BadRequest("the system text must be a string or a list of text blocks") from None
        messages = [{"role": "system", "content": text}, *(messages if isinstance(messages, list) else [])]
    try:
        return tokenizer.words(tokenizer.chat_prompt_text(messages, getattr(sim, "chat_template", "none")))
    except ValueError as e:
        raise BadRequest(str(e)) from None


def _parsed(body: Any, sim, messages_key: str, system_key: str, max_key: str) -> Parsed:
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    return Parsed(_prompt(body.get(messages_key), body.get(system_key), sim), max_tokens_field(body, max_key),
                  bool(body.get("stream", False)), str(body.get("model") or sim.model),
                  extra={"reasoning": getattr(sim, "reasoning_tokens", 0)})


def _split(ctx: Context, start: int, end: int) -> tuple[int, int, int]:
    """(reasoning tokens, answer tokens) among output tokens start..end-1, and the reasoning count R."""
    r = ctx.parsed.extra.get("reasoning", 0)
    return max(0, min(end, r) - start), max(0, end - max(start, r)), r


class Responses(Surface):
    endpoint = "responses"

    def parse(self, body, sim) -> Parsed:
        return _parsed(body, sim, "input", "instructions", "max_output_tokens")

    def _ids(self, ctx: Context) -> tuple[str, str, str]:
        return f"resp_{ctx.request_id}", f"rs_{ctx.request_id}", f"msg_{ctx.request_id}"

    def _response(self, ctx: Context, status: str, output: list, usage: dict | None) -> dict:
        out = {"id": self._ids(ctx)[0], "object": "response", "created_at": ctx.created_s, "model": ctx.parsed.model,
               "status": status, "output": output, "max_output_tokens": ctx.parsed.max_tokens,
               "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
               "error": None, "usage": usage}
        return out

    def _usage(self, ctx: Context, n_out: int) -> dict:
        p, r = len(ctx.parsed.prompt), ctx.parsed.extra.get("reasoning", 0)
        cached = ctx.gen.cached_tokens if ctx.gen is not None else 0
        return {"input_tokens": p, "input_tokens_details": {"cached_tokens": cached}, "output_tokens": n_out,
                "output_tokens_details": {"reasoning_tokens": min(r, n_out)}, "total_tokens": p + n_out}

    def _output(self, ctx: Context, n_out: int) -> list:
        _, rs_id, msg_id = self._ids(ctx)
        n_r, n_a, _ = _split(ctx, 0, n_out)
        out: list[dict] = []
        if n_r:
            out.append({"id": rs_id, "type": "reasoning", "summary": [],
                        "content": [{"type": "reasoning_text", "text": TEXT * n_r}], "status": "completed"})
        if n_a:
            out.append({"id": msg_id, "type": "message", "role": "assistant", "status": "completed",
                        "content": [{"type": "output_text", "text": TEXT * n_a, "annotations": []}]})
        return out

    def opening_bytes(self, ctx) -> bytes:
        head = self._response(ctx, "in_progress", [], None)
        return _event("response.created", response=head) + _event("response.in_progress", response=head)

    def token_bytes(self, ctx, start, end) -> bytes:
        _, rs_id, msg_id = self._ids(ctx)
        n_r, n_a, r = _split(ctx, start, end)
        out = b""
        if n_r and start == 0:
            out += _event("response.output_item.added", output_index=0,
                          item={"id": rs_id, "type": "reasoning", "summary": [], "status": "in_progress"})
        if n_r:
            out += _event("response.reasoning_text.delta", item_id=rs_id, output_index=0, content_index=0,
                          delta=TEXT * n_r)
        if n_a and start <= r:  # the answer's first chunk: the reasoning item ends, the message item opens
            out += self._close_reasoning(ctx, r) + _event(
                "response.output_item.added", output_index=int(r > 0),
                item={"id": msg_id, "type": "message", "role": "assistant", "status": "in_progress", "content": []})
            out += _event("response.content_part.added", item_id=msg_id, output_index=int(r > 0), content_index=0,
                          part={"type": "output_text", "text": "", "annotations": []})
        if n_a:
            out += _event("response.output_text.delta", item_id=msg_id, output_index=int(r > 0), content_index=0,
                          delta=TEXT * n_a)
        return out

    def _close_reasoning(self, ctx: Context, n_r: int) -> bytes:
        if not n_r:
            return b""
        item = self._output(ctx, n_r)[0]
        return (_event("response.reasoning_text.done", item_id=item["id"], output_index=0, content_index=0,
                       text=TEXT * n_r) + _event("response.output_item.done", output_index=0, item=item))

    def final_bytes(self, ctx, sim, token_ns) -> bytes:
        n_out = len(token_ns)
        n_r, n_a, _ = _split(ctx, 0, n_out)
        output = self._output(ctx, n_out)
        out = b""
        if n_a:
            item = output[-1]
            i = len(output) - 1
            out += (_event("response.output_text.done", item_id=item["id"], output_index=i, content_index=0,
                           text=TEXT * n_a)
                    + _event("response.content_part.done", item_id=item["id"], output_index=i, content_index=0,
                             part=item["content"][0])
                    + _event("response.output_item.done", output_index=i, item=item))
        elif n_r:
            out += self._close_reasoning(ctx, n_r)
        return out + _event("response.completed", response=self.full_response(ctx, sim, token_ns))

    def full_response(self, ctx, sim, token_ns) -> dict:
        n_out = len(token_ns)
        out = self._response(ctx, "incomplete", self._output(ctx, n_out), self._usage(ctx, n_out))
        if sim.per_request_metrics and token_ns:
            out["metrics"] = server_timings(ctx.gen, token_ns)
        return out

    def malformed_bytes(self) -> bytes:
        return b'event: response.output_text.delta\ndata: {"type": "response.output_text.delta", "delta": "tok \n\n'

    def error_body(self, status, message) -> dict:
        kind = "server_error" if status >= 500 else "invalid_request_error"
        return {"error": {"message": message, "type": kind, "param": None, "code": status}}


class Messages(Surface):
    endpoint = "messages"

    def parse(self, body, sim) -> Parsed:
        return _parsed(body, sim, "messages", "system", "max_tokens")

    def _usage(self, ctx: Context, n_out: int) -> dict:
        cached = ctx.gen.cached_tokens if ctx.gen is not None else 0
        u = {"input_tokens": len(ctx.parsed.prompt) - cached, "output_tokens": n_out}
        return {**u, "cache_read_input_tokens": cached} if cached else u

    def opening_bytes(self, ctx) -> bytes:
        return _event("message_start", message={
            "id": f"msg_{ctx.request_id}", "type": "message", "role": "assistant", "content": [],
            "model": ctx.parsed.model, "stop_reason": None, "stop_sequence": None, "usage": self._usage(ctx, 0)})

    def token_bytes(self, ctx, start, end) -> bytes:
        n_r, n_a, r = _split(ctx, start, end)
        out = b""
        if n_r and start == 0:
            out += _event("content_block_start", index=0, content_block={"type": "thinking", "thinking": ""})
        if n_r:
            out += _event("content_block_delta", index=0, delta={"type": "thinking_delta", "thinking": TEXT * n_r})
        if n_a and start <= r:  # the answer's first chunk: the thinking block ends, the text block starts
            if r:
                out += _event("content_block_stop", index=0)
            out += _event("content_block_start", index=int(r > 0), content_block={"type": "text", "text": ""})
        if n_a:
            out += _event("content_block_delta", index=int(r > 0), delta={"type": "text_delta", "text": TEXT * n_a})
        return out

    def final_bytes(self, ctx, sim, token_ns) -> bytes:
        n_out = len(token_ns)
        _, n_a, r = _split(ctx, 0, n_out)
        out = _event("content_block_stop", index=int(r > 0 and n_a > 0)) if n_out else b""
        return out + _event("message_delta", delta={"stop_reason": "max_tokens", "stop_sequence": None},
                            usage=self._usage(ctx, n_out)) + _event("message_stop")

    def full_response(self, ctx, sim, token_ns) -> dict:
        n_r, n_a, _ = _split(ctx, 0, len(token_ns))
        content = ([{"type": "thinking", "thinking": TEXT * n_r, "signature": ""}] if n_r else []) + (
            [{"type": "text", "text": TEXT * n_a}] if n_a else [])
        return {"id": f"msg_{ctx.request_id}", "type": "message", "role": "assistant", "content": content,
                "model": ctx.parsed.model, "stop_reason": "max_tokens", "stop_sequence": None,
                "usage": self._usage(ctx, len(token_ns))}

    def malformed_bytes(self) -> bytes:
        return b'event: content_block_delta\ndata: {"type": "content_block_delta", "delta": {"text": "tok \n\n'

    def error_body(self, status, message) -> dict:
        kind = {400: "invalid_request_error", 429: "rate_limit_error", 529: "overloaded_error"}.get(
            status, "api_error")
        return {"type": "error", "error": {"type": kind, "message": message}}
