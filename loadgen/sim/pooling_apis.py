"""Pooling surfaces: POST /v1/embeddings (OpenAI's and vLLM's shape) and POST /v1/rerank (vLLM's, Jina's and
Cohere v2's shape). Neither streams: the answer is one JSON object, sent when the request's prefill ends.

Cost: prefill only, by the engine's step model as for any prompt, no decode. The request is submitted as
a generation of one token: the engine prefills its prompt and "produces" at that step's end, which is when
the pooled output is ready (vLLM's pooling runner likewise finishes a request in its prefill step); the
server counts no generation token for it (driver.py) and the truth records no output token (server.py).
A rerank request's prompt is every (query, document) pair it scores, one after the other (query words, then
the document's): its prefill cost is that of one sequence of documents x query + the documents' tokens
(vLLM scores each pair as a sequence of its own: the sim's attention term over the concatenation is a
little larger than the pairs' sum; its linear terms are the same).

/v1/embeddings: {"model", "input": a string or a list of strings (each an input, one embedding each; their
tokens are the prompt), "encoding_format": "float" (default) or "base64", "dimensions"?}. Answer
{"id", "object": "list", "created", "model", "data": [{"object": "embedding", "index": i, "embedding":
[--embedding-dim floats] or base64 float32}], "usage": {"prompt_tokens", "total_tokens"}}. The vector is
deterministic and cheap: from a CRC-32 of the input's text.
/v1/rerank: {"model", "query": a string, "documents": strings or {"text"} objects, "top_n"?}. Answer
{"id", "model", "usage": {"total_tokens"} (as vLLM gives it), "results": [{"index", "document": {"text"},
"relevance_score"}] sorted by score, highest first, the top_n of them}. Scores are deterministic in (0, 1):
a CRC-32 of query and document.
Bad bodies (no input, no query, documents not a list of texts) are 400s with vLLM's error object.
"""
from __future__ import annotations

import base64
import struct
import zlib
from typing import Any

from loadgen.sim import tokenizer
from loadgen.sim.server import BadRequest, Context, Parsed, Surface

POOLING_ENDPOINTS = ("embeddings", "rerank")


def _texts(v: Any, what: str) -> list[str]:
    """A string, or a list of strings / {"text"} objects, as a list of texts."""
    if isinstance(v, str):
        return [v]
    if isinstance(v, list) and v:
        out = [x if isinstance(x, str) else x.get("text") if isinstance(x, dict) else None for x in v]
        if all(isinstance(x, str) for x in out):
            return out  # type: ignore[return-value]
    raise BadRequest(f"'{what}' must be a string or a non-empty list of strings, got {str(v)[:80]!r}")


def _crc(text: str, salt: int = 0) -> int:
    return zlib.crc32(text.encode("utf-8", "replace"), salt)


class _Pooling(Surface):
    content_type = "application/json"

    def _parsed(self, body: Any, sim, prompt: list, extra: dict) -> Parsed:
        # one "token" of output: the prefill's end, when the pooled answer is ready (module docstring)
        return Parsed(prompt, 1, False, str(body.get("model") or sim.model), extra={"pooling": True, **extra})

    def token_bytes(self, ctx, start, end) -> bytes:  # (never streams: parse() sets stream False)
        raise BadRequest("this endpoint does not stream")

    def final_bytes(self, ctx, sim, token_ns) -> bytes:
        raise BadRequest("this endpoint does not stream")


class Embeddings(_Pooling):
    endpoint = "embeddings"

    def parse(self, body, sim) -> Parsed:
        if not isinstance(body, dict):
            raise BadRequest("the request body must be a JSON object")
        inputs = _texts(body.get("input"), "input")
        fmt = body.get("encoding_format", "float")
        if fmt not in ("float", "base64"):
            raise BadRequest(f"'encoding_format' must be float or base64, got {fmt!r}")
        dim = body.get("dimensions") or getattr(sim, "embedding_dim", 8)
        if isinstance(dim, bool) or not isinstance(dim, int) or dim < 1:
            raise BadRequest(f"'dimensions' must be a positive integer, got {dim!r}")
        prompt = [w for text in inputs for w in tokenizer.words(text)]
        return self._parsed(body, sim, prompt, {"inputs": inputs, "format": fmt, "dim": dim})

    def full_response(self, ctx: Context, sim, token_ns: list[int]) -> dict:
        x = ctx.parsed.extra
        data = [{"object": "embedding", "index": i, "embedding": _vector(text, x["dim"], x["format"])}
                for i, text in enumerate(x["inputs"])]
        p = len(ctx.parsed.prompt)
        return {"id": f"embd-{ctx.request_id}", "object": "list", "created": ctx.created_s,
                "model": ctx.parsed.model, "data": data, "usage": {"prompt_tokens": p, "total_tokens": p}}


def _vector(text: str, dim: int, fmt: str) -> list[float] | str:
    seed = _crc(text)
    values = [((seed >> (k % 24)) ^ (k * 2654435761)) % 2001 / 1000.0 - 1.0 for k in range(dim)]
    if fmt == "base64":
        return base64.b64encode(struct.pack(f"<{dim}f", *values)).decode()
    return values


class Rerank(_Pooling):
    endpoint = "rerank"

    def parse(self, body, sim) -> Parsed:
        if not isinstance(body, dict):
            raise BadRequest("the request body must be a JSON object")
        query = body.get("query")
        if not isinstance(query, str):
            raise BadRequest(f"'query' must be a string, got {str(query)[:80]!r}")
        docs = _texts(body.get("documents"), "documents")
        top_n = body.get("top_n") or len(docs)
        if isinstance(top_n, bool) or not isinstance(top_n, int) or top_n < 1:
            raise BadRequest(f"'top_n' must be a positive integer, got {top_n!r}")
        q = tokenizer.words(query)
        prompt = [w for d in docs for w in (*q, *tokenizer.words(d))]   # every (query, document) pair
        return self._parsed(body, sim, prompt, {"query": query, "documents": docs, "top_n": top_n})

    def full_response(self, ctx: Context, sim, token_ns: list[int]) -> dict:
        x = ctx.parsed.extra
        qseed = _crc(x["query"])
        scored = [(i, (_crc(d, qseed) % 999_983 + 1) / 1_000_000) for i, d in enumerate(x["documents"])]
        scored.sort(key=lambda s: -s[1])
        results = [{"index": i, "document": {"text": x["documents"][i]}, "relevance_score": score}
                   for i, score in scored[: x["top_n"]]]
        return {"id": f"rerank-{ctx.request_id}", "model": ctx.parsed.model,
                "usage": {"total_tokens": len(ctx.parsed.prompt)}, "results": results}
