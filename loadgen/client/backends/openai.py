"""OpenAI-compatible `/v1/completions` and `/v1/chat/completions` with `stream: true` (vLLM, SGLang,
llama.cpp's server, TGI's Messages API, Ollama's /v1).

A chunk is an SSE event whose choice carries non-empty output text; chat's role-only first chunk is not a
token. Answer text: `text`, `delta.content`, and a tool call's pieces (`delta.tool_calls[i].function`'s
`name` and `arguments`, joined: a tool-call-only stream is timed like content). Reasoning text:
`delta.reasoning_content`, or `delta.reasoning` (vLLM >= 0.19.1's name), output that is not yet the
answer: the row's first_answer_ns is the first answer chunk's stamp (None when the stream had none),
reasoning_tokens is usage.completion_tokens_details.reasoning_tokens when given and not below the
reasoning chunks, else counted from them (backends/stream.py). Tokens per chunk follow the rule in
backends/stream.py, with N = usage.completion_tokens. A stream is ok when it ends with `data: [DONE]` or a choice with a
`finish_reason`; an `{"error": ...}` event inside a 200 stream, a chunk that is not JSON or a
`tool_calls` that is not a list of objects with string pieces makes it a stream_error (tokens seen are
kept).
The usage's prompt_tokens_details.cached_tokens, when given, fills cached_tokens (after the stream, as
every other field).
A workload's tools / response_format (structure(), plan/structured.py) are sent in every body, and each ok
reply is judged after its stream by backends/replies.py from the content text and the calls' pieces (by
index) that the full parse keeps: reply_valid, tool_calls, reply_problem. Such streams take the full parse
(the fast path below never reads every event's text); a workload without them pays nothing.
Server timings fill server_*_ms from whatever the stream carries: vLLM's per-request `metrics` object
(with --enable-per-request-metrics) or llama.cpp's `timings` object on its last chunk (prompt_ms,
predicted_ms; llama-server sends it on every OpenAI-compatible stream).

Fast path (same result, no per-chunk JSON parsing): when the stream is LF-framed one-line `data: {...}`
events, ends with a usage chunk and `[DONE]`, usage.completion_tokens equals the number of content
events (one token each), every content event carries its text as a string (`"text":"` or
`"content":"`, counted once over the body: an error event, a reasoning or a tool-call delta without
content text makes the count short) and, for chat, no event carries reasoning text (`_quiet_reasoning`:
every `"reasoning…"` key is null, empty or the usage's reasoning_tokens), only the usage chunk and the
first and last content events are parsed; every other event is checked by its framing (`data: {` ...
`}`). Anything else, or any doubt, takes the full parse above. (A tool-call piece in an event that also
carries content text is that event's one answer token either way; only the full parse checks its
shape.) Chunk times are the stamp of the read that completed each event.
"""
from __future__ import annotations

from array import array
from collections.abc import Sequence
from itertools import chain, islice, repeat
from typing import Any

import orjson

from loadgen.client.backends.base import Messages, messages_payload, user
from loadgen.client.backends.llamacpp import llamacpp_timings
from loadgen.client.backends.replies import ReplyCheck
from loadgen.client.backends.stream import Stream, as_float, sse_events
from loadgen.client.recorder import OK, Row
from loadgen.config.credentials import clipped

PATHS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}


class OpenAIBackend:
    event_end = b"\n\n"

    def __init__(self, api: str, model: str, extra_body: dict[str, Any]):
        self.api, self.model, self.extra_body = api, model, extra_body
        self.path = PATHS[api]
        self.preamble_events = 1 if api == "chat" else 0  # chat's first event: delta.role, no content
        self.fields: dict[str, Any] = {}      # tools / tool_choice / response_format (structure())
        self.check: ReplyCheck | None = None

    def structure(self, fields: dict[str, Any]) -> None:
        """Send these body fields (plan/structured.body_fields) in every request and judge every ok reply
        against them (backends/replies.py): such streams always take the full parse."""
        self.fields = dict(fields)
        self.check = ReplyCheck(fields) if fields else None

    def body(self, prompt: str, max_tokens: int, *, model: str | None = None, priority: int | None = None) -> bytes:
        return self.body_messages(user(prompt), max_tokens, model=model, priority=priority)

    def body_messages(self, messages: Messages, max_tokens: int, *, model: str | None = None,
                      priority: int | None = None) -> bytes:
        payload = messages_payload(self.api, model or self.model, messages)
        payload.update(max_tokens=max_tokens, stream=True, stream_options={"include_usage": True})
        if priority is not None:  # vLLM's `priority` (lower is served first under --scheduling-policy priority)
            payload["priority"] = priority
        payload.update(self.fields)
        payload.update(self.extra_body)
        return orjson.dumps(payload)

    def reply_text(self, reads: list[bytes]) -> str:
        stream = Stream()
        state: dict[str, Any] = {"usage": None, "metrics": None, "ended": False}
        for _, data in sse_events([0] * len(reads), reads, stream):
            self._event(data, 0, stream, state)
        return "".join(stream.texts)

    def reply_message(self, reads: list[bytes]) -> dict[str, Any]:
        """The finished chat reply as the assistant message an agentic session's next request sends back
        (plan/bodies.py): its content text (None when empty beside calls, as OpenAI writes it) and its
        tool calls as streamed, by index: id, function name and arguments, each joined from its pieces
        (a call without an id gets `call_<index>`). Read after the stream, once per turn, never per chunk."""
        content: list[str] = []
        calls: dict[int, dict[str, Any]] = {}
        for _, data in sse_events([0] * len(reads), reads, Stream()):
            try:
                obj = orjson.loads(data) if data != b"[DONE]" else None
            except orjson.JSONDecodeError:
                continue
            choices = obj.get("choices") if isinstance(obj, dict) else None
            for choice in choices if isinstance(choices, list) else ():
                delta = choice.get("delta") if isinstance(choice, dict) else None
                if not isinstance(delta, dict):
                    continue
                if isinstance(delta.get("content"), str):
                    content.append(delta["content"])
                pieces = delta.get("tool_calls")
                for pos, piece in enumerate(pieces if isinstance(pieces, list) else ()):
                    if isinstance(piece, dict):
                        _call_piece(calls, pos, piece)
        text = "".join(content)
        msg: dict[str, Any] = {"role": "assistant", "content": text}
        if calls:
            msg["content"] = text or None
            msg["tool_calls"] = [{"id": c["id"] or f"call_{i}", "type": "function",
                                  "function": {"name": "".join(c["name"]), "arguments": "".join(c["arguments"])}}
                                 for i, c in sorted(calls.items())]
        return msg

    def interpret(self, row: Row, read_t_ns: Sequence[int], reads: list[bytes]) -> None:
        if self.check is not None or not self._interpret_fast(row, read_t_ns, reads):
            self._interpret_full(row, read_t_ns, reads)

    def _interpret_fast(self, row: Row, read_t_ns: Sequence[int], reads: list[bytes]) -> bool:
        # Whole-body checks (each one C pass over the bytes) instead of a check per event: any doubt
        # returns False and the full parse decides.
        if not reads:
            return False
        body = b"".join(reads)
        if b"\r" in body:
            return False  # CR framing: the full parse
        breaks = list(map(bytes.count, reads, repeat(b"\n", len(reads))))  # line breaks in each read
        n_breaks = sum(breaks)
        ends = list(map((1).__rrshift__, breaks))  # b >> 1: the events each read completes (see below)
        n_events = sum(ends)
        # The framing: `data: {...}` events, each boundary `}\n\ndata: {`, then `data: [DONE]\n\n`. Those
        # n_events - 2 boundaries and the ending hold 2 * n_events line breaks: when the body has that many,
        # every line break is in one of them (no event holds one, blank lines are exactly two breaks).
        # Every read's count even (2 * n_events == n_breaks): no blank line is split across two reads (the
        # first read holding half of a split one would hold an odd number), so each read completes
        # breaks // 2 events.
        if not (n_events >= 3 and 2 * n_events == n_breaks and body.startswith(b"data: {")
                and body.endswith(b"}\n\ndata: [DONE]\n\n") and body.count(b"}\n\ndata: {") == n_events - 2):
            return False
        sep = body.find(b"\n\n")
        last_ev, usage_ev = body[:-len(b"\n\ndata: [DONE]\n\n")].rsplit(b"\n\n", 2)[-2:]
        try:
            tail = orjson.loads(usage_ev[6:])
            obj = orjson.loads(body[6:sep])
        except orjson.JSONDecodeError:
            return False
        if not isinstance(tail, dict) or not isinstance(obj, dict):
            return False
        skip, content = 0, n_events - 2
        probe = Stream()
        ended = self._choices(obj, 0, probe)
        if not probe.chunk_t:  # chat's role-only first chunk: not a token
            skip, content = 1, content - 1
            if not content:
                return False
            try:
                obj = orjson.loads(body[sep + 8:body.find(b"\n\n", sep + 2)])
            except orjson.JSONDecodeError:
                return False
            probe = Stream()
            ended = self._choices(obj, 0, probe) or ended
        usage = tail.get("usage")
        if not isinstance(usage, dict) or tail.get("choices") or usage.get("completion_tokens") != content:
            return False
        if len(probe.chunk_t) != 1:  # the first content event: one token
            return False
        key = _TEXT_KEY[self.api]  # one per content event (and in a role chunk's empty content)
        if body.count(key) != content + (skip and key in body[:sep]):
            return False  # an event without its text as a string: an error, reasoning or tool-call delta
        if self.api == "chat" and not _quiet_reasoning(body):
            return False
        try:
            obj = orjson.loads(last_ev[6:])
        except orjson.JSONDecodeError:
            return False
        probe = Stream()
        ended = self._choices(obj, 0, probe) or ended
        if len(probe.chunk_t) != 1 or not ended:  # the last content event: one token
            return False
        # each event stamped with the read that completed it; usually one event per read up to the last
        t, m = row.chunk_t_ns, skip + content
        if ends[:m].count(1) == m:
            t.extend(read_t_ns[skip:m])
        else:
            t.extend(islice(chain.from_iterable(map(repeat, read_t_ns, ends)), skip, m))
        row.prompt_tokens = usage.get("prompt_tokens")
        row.cached_tokens = cached_tokens(usage)
        row.reasoning_tokens = reasoning_tokens(usage) or 0  # no reasoning event: only the server may say
        row.chunk_tokens.extend(_ONES[:content] if content <= len(_ONES) else repeat(1, content))
        row.n_chunks = row.output_tokens = content
        row.first_token_ns, row.last_token_ns = t[0], t[-1]
        row.first_answer_ns = t[0]
        server_timings(row, tail.get("metrics"), tail.get("timings"))
        if row.outcome is None:
            row.outcome = OK
        return True

    def _interpret_full(self, row: Row, read_t_ns: Sequence[int], reads: list[bytes]) -> None:
        stream = Stream() if self.check is None else Stream().judged()
        state: dict[str, Any] = {"usage": None, "metrics": None, "timings": None, "ended": False}
        for t, data in sse_events(read_t_ns, reads, stream):
            self._event(data, t, stream, state)
        usage = state["usage"] or {}
        stream.fill(row, usage.get("completion_tokens"), usage.get("prompt_tokens"), state["ended"],
                    "[DONE] or a finish_reason", reasoning_tokens(usage))
        row.cached_tokens = cached_tokens(usage)
        server_timings(row, state["metrics"], state["timings"])
        if self.check is not None and row.outcome == OK:  # a cut-off reply is not judged
            row.reply_valid, row.tool_calls, row.reply_problem = self.check.judge(*stream.reply())

    def _event(self, data: bytes, t: int, stream: Stream, state: dict[str, Any]) -> None:
        if data == b"[DONE]":
            state["ended"] = True
            return
        obj = stream.decode(data)
        if obj is None:
            return
        if isinstance(obj.get("usage"), dict):
            state["usage"] = obj["usage"]
        if obj.get("metrics") is not None:
            state["metrics"] = obj["metrics"]
        if obj.get("timings") is not None:
            state["timings"] = obj["timings"]
        if self._choices(obj, t, stream):
            state["ended"] = True

    @staticmethod
    def _choices(obj: dict[str, Any], t: int, stream: Stream) -> bool:
        """Adds the object's chunks to stream (reasoning, then answer); True when a choice says it finished."""
        finished = False
        choices = obj.get("choices")
        for choice in choices if isinstance(choices, list) else ():
            if not isinstance(choice, dict):
                continue
            text = choice.get("text")
            if text is None:
                delta = choice.get("delta")
                if isinstance(delta, dict):
                    stream.reasoning(t, delta.get("reasoning_content") or delta.get("reasoning"))
                    text = delta.get("content")  # anything but a str carries no token (Stream.token)
                    if stream.content is not None and isinstance(text, str):
                        stream.content.append(text)
                    calls = delta.get("tool_calls")
                    if calls is not None:
                        text = _with_tool_calls(text, calls, stream)
            elif stream.content is not None and isinstance(text, str):
                stream.content.append(text)
            stream.token(t, text)
            finished = finished or bool(choice.get("finish_reason"))
        return finished


_ONES = array("l", [1]) * 4096   # one token a chunk, for chunk_tokens: a slice of it is one copy
_TEXT_KEY = {"completions": b'"text":"', "chat": b'"content":"'}  # a content event's text, as servers write it
# Reasoning keys that may stand in a plain content stream's body without carrying output: null or empty
# fields (SGLang writes every delta field, null when unused) and the usage's reasoning count.
_QUIET_REASONING = (b'"reasoning_content":null', b'"reasoning":null', b'"reasoning_content": null',
                    b'"reasoning": null', b'"reasoning_content":""', b'"reasoning":""', b'"reasoning_tokens"')


def _quiet_reasoning(body: bytes) -> bool:
    """No event of this body can carry reasoning text: each reasoning key is in a quiet form. Text that
    merely mentions one (escaped quotes inside content) counts against it: the full parse decides."""
    n = body.count(b'"reasoning')
    return not n or n == sum(map(body.count, _QUIET_REASONING))


def _with_tool_calls(text: object, calls: object, stream: Stream) -> str | None:
    """The delta's answer text: its content followed by each tool call's name and arguments pieces. A
    tool_calls that is not a list of objects, or a piece that is not a string, makes the stream malformed."""
    if not isinstance(calls, list):
        stream.malformed = stream.malformed or f"delta.tool_calls is not a list: {_shown(calls)}"
        return text if isinstance(text, str) else None
    parts = [text] if isinstance(text, str) else []
    for pos, call in enumerate(calls):
        fn = call.get("function") if isinstance(call, dict) else None
        if fn is None and isinstance(call, dict):
            continue  # a piece with only its index or id: no text
        if not isinstance(fn, dict):
            stream.malformed = stream.malformed or f"delta.tool_calls piece is not an object with a function: " \
                                                   f"{_shown(call)}"
            continue
        kept = None
        if stream.calls is not None:  # a judged reply: each call's pieces, by its index
            index = call.get("index", pos)
            kept = stream.calls.setdefault(index if isinstance(index, int) else pos, ([], []))
        for k, field in enumerate(("name", "arguments")):
            piece = fn.get(field)
            if isinstance(piece, str):
                parts.append(piece)
                if kept is not None:
                    kept[k].append(piece)
            elif piece is not None:
                stream.malformed = stream.malformed or (f"delta.tool_calls function.{field} is not a string: "
                                                        f"{_shown(piece)}")
    return "".join(parts)


def _call_piece(calls: dict[int, dict[str, Any]], pos: int, piece: dict[str, Any]) -> None:
    # One streamed piece of a tool call (reply_message): its index (else its place), id, name and arguments.
    index = piece.get("index", pos)
    call = calls.setdefault(index if isinstance(index, int) else pos, {"id": "", "name": [], "arguments": []})
    if isinstance(piece.get("id"), str) and piece["id"] and not call["id"]:
        call["id"] = piece["id"]
    fn = piece.get("function")
    if isinstance(fn, dict):
        for field in ("name", "arguments"):
            if isinstance(fn.get(field), str):
                call[field].append(fn[field])


def _shown(value: object) -> str:
    return clipped(orjson.dumps(value), 120)


def reasoning_tokens(usage: dict[str, Any]) -> int | None:
    """usage.completion_tokens_details.reasoning_tokens (OpenAI, vLLM, SGLang when they count them); None
    when the usage does not say."""
    return usage_count(usage, "completion_tokens_details", "reasoning_tokens")


def cached_tokens(usage: dict[str, Any]) -> int | None:
    """usage.prompt_tokens_details.cached_tokens: prompt tokens served from the server's prefix cache (vLLM
    with --enable-prompt-tokens-details, SGLang, OpenAI); None when the usage does not say."""
    return usage_count(usage, "prompt_tokens_details", "cached_tokens")


def usage_count(usage: dict[str, Any], details_key: str, key: str) -> int | None:
    """usage[details_key][key] when it is a count (an int >= 0, not a bool); None otherwise (also used by
    the Responses backend, whose usage names its details differently)."""
    details = usage.get(details_key)
    n = details.get(key) if isinstance(details, dict) else None
    return n if isinstance(n, int) and not isinstance(n, bool) and n >= 0 else None


def server_timings(row: Row, metrics: object, timings: object = None) -> None:
    # llama.cpp's timings (the same object as on its native /completion: see backends/llamacpp.py).
    if isinstance(timings, dict):
        llamacpp_timings(row, timings)
    # vLLM's per-request metrics (--enable-per-request-metrics), in the final usage chunk.
    if isinstance(metrics, dict):
        row.server_queue_ms = as_float(metrics.get("queue_time_ms"))
        row.server_prefill_ms = as_float(metrics.get("time_to_first_token_ms"))
        row.server_decode_ms = as_float(metrics.get("generation_time_ms"))
