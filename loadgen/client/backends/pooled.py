"""The pooling APIs: OpenAI's `POST /v1/embeddings` and the rerank API `POST /v1/rerank` (vLLM, Jina, Cohere's
v2 shape; SGLang, TEI and Infinity serve the same bodies). Neither streams: the answer is one JSON object.

Requests (plan/bodies.py builds them; no max_tokens, no stream flag):
    embeddings  {"model", "input": the prompt text (one string; a conversation's contents joined by
                newlines)} plus the workload's extra_body (e.g. "encoding_format", "dimensions")
    rerank      {"model", "query": the prompt text, "documents": [text, ...]} plus extra_body (e.g. "top_n")

Answers (recorded shapes in tests/data/pooling/):
    embeddings  {"object": "list", "data": [{"object": "embedding", "index", "embedding": [floats] or a
                base64 string}], "model", "usage": {"prompt_tokens", "total_tokens"}}
    rerank      {"id", "model", "results": [{"index", "relevance_score", "document"?}],
                "usage": {"total_tokens"} (vLLM, Jina; "prompt_tokens" too where the server gives it)}

Row contract (docs/metrics.md, "Pooling APIs"): a pooling answer has no token to stamp, so first_token_ns
and first_answer_ns stay null (no TTFT, TTFA, ITL, TPOT) and last_token_ns is the stamp of the read that
completed the answer: e2e = last_token - intended, the request latency vLLM's bench and AIPerf report.
output_tokens = reasoning_tokens = n_chunks = 0. prompt_tokens = usage.prompt_tokens, else usage.total_tokens
(rerank: every (query, document) pair the server scored, its special tokens included); null when the
answer gives no usage.
Outcome: ok when the answer is a JSON object of the API's shape (embeddings: a non-empty `data` list whose
items each hold an `embedding` list or string; rerank: a `results` list whose items each hold an integer
`index` >= 0 and a numeric `relevance_score`). Otherwise a stream_error: an `error` object (OpenAI's
{"error": {...}}, or vLLM's older {"object": "error", "message"}) inside a 200 answer is error_event with
the server's message; no body at all is incomplete_stream; anything else (not JSON, not an object, the
shape's field missing or wrong) is malformed_chunk, naming what is wrong.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson

from loadgen.client.backends.base import Messages, WithoutPriority, joined
from loadgen.client.backends.stream import as_int
from loadgen.client.recorder import OK, STREAM_ERROR, ErrorKind, Row
from loadgen.config.credentials import clipped


class _Pooled(WithoutPriority):
    # [abandon] after_tokens counts events: none here (config/pooling.py refuses it for these APIs)
    event_end, preamble_events = b"\n\n", 0
    path = ""

    def payload(self, messages: Messages, max_tokens: int, model: str) -> dict[str, Any]:
        """max_tokens: ignored (nothing is generated)."""
        return self._payload(joined(messages), model)

    def _payload(self, text: str, model: str) -> dict[str, Any]:
        raise NotImplementedError

    def reply_text(self, reads: list[bytes]) -> str:
        return ""  # no generated text (and no session turns: the config refuses them)

    def interpret(self, row: Row, read_t_ns: Sequence[int], reads: list[bytes]) -> None:
        row.output_tokens = row.reasoning_tokens = row.n_chunks = 0
        if not reads:
            row.fail(STREAM_ERROR, ErrorKind.INCOMPLETE_STREAM, "the answer had no body")
            return
        body = b"".join(reads)
        try:
            obj = orjson.loads(body)
        except orjson.JSONDecodeError:
            row.fail(STREAM_ERROR, ErrorKind.MALFORMED_CHUNK, f"answer is not JSON: {clipped(body, 120)!r}")
            return
        if not isinstance(obj, dict):
            row.fail(STREAM_ERROR, ErrorKind.MALFORMED_CHUNK, f"answer is not a JSON object: {clipped(body, 120)!r}")
            return
        err = error_text(obj)
        if err is not None:
            row.fail(STREAM_ERROR, ErrorKind.ERROR_EVENT, err)
            return
        usage = obj.get("usage")
        usage = usage if isinstance(usage, dict) else {}
        prompt = as_int(usage.get("prompt_tokens"))
        row.prompt_tokens = prompt if prompt is not None else as_int(usage.get("total_tokens"))
        problem = self.problem(obj)
        if problem is not None:
            row.fail(STREAM_ERROR, ErrorKind.MALFORMED_CHUNK, problem)
            return
        row.last_token_ns = read_t_ns[-1]   # the read that completed the answer (module docstring)
        if row.outcome is None:
            row.outcome = OK

    def problem(self, obj: dict[str, Any]) -> str | None:
        """What is wrong with the answer's shape; None: it is the API's answer."""
        raise NotImplementedError


class EmbeddingsBackend(_Pooled):
    path = "/v1/embeddings"

    def _payload(self, text: str, model: str) -> dict[str, Any]:
        return {"model": model, "input": text, **self.extra_body}

    def problem(self, obj: dict[str, Any]) -> str | None:
        data = obj.get("data")
        if not isinstance(data, list) or not data:
            return f"answer has no `data` list of embeddings: {_shown(obj)}"
        for i, item in enumerate(data):
            vector = item.get("embedding") if isinstance(item, dict) else None
            if not isinstance(vector, (list, str)) or not vector:   # a list of floats, or base64
                return f"answer's data[{i}] has no embedding: {_shown(item)}"
        return None


class RerankBackend(_Pooled):
    path = "/v1/rerank"

    def _payload(self, text: str, model: str) -> dict[str, Any]:
        raise ValueError("a rerank body needs its documents: body_documents")

    def body_documents(self, query: str, documents: list[str], *, model: str | None = None) -> bytes:
        return orjson.dumps({"model": model or self.model, "query": query, "documents": documents,
                             **self.extra_body})

    def problem(self, obj: dict[str, Any]) -> str | None:
        results = obj.get("results")
        if not isinstance(results, list):
            return f"answer has no `results` list: {_shown(obj)}"
        for i, item in enumerate(results):
            index = item.get("index") if isinstance(item, dict) else None
            score = item.get("relevance_score") if isinstance(item, dict) else None
            good_index = isinstance(index, int) and not isinstance(index, bool) and index >= 0
            if not good_index or not isinstance(score, (int, float)) or isinstance(score, bool):
                return f"answer's results[{i}] is not {{index, relevance_score}}: {_shown(item)}"
        return None


def error_text(obj: dict[str, Any]) -> str | None:
    """The server's error message when a 200 answer is an error object; None otherwise."""
    err = obj.get("error")
    if err is not None:
        msg = err.get("message") if isinstance(err, dict) else err
        return str(msg) if msg else f"error: {_shown(err)}"
    if obj.get("object") == "error":
        return str(obj.get("message") or _shown(obj))
    return None


def _shown(v: object) -> str:
    return clipped(orjson.dumps(v), 120)
