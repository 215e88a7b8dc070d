"""The pooling APIs (api = "embeddings" | "rerank"): the [rerank] table, and what a workload may not ask of
an API that answers with one JSON object and generates no token.

[rerank] (api = "rerank" only): `documents` (how many documents each request ranks, drawn per request like a
length: N, MIN..MAX or a distribution; default 8) and `document_tokens` (each document's length in tokens,
drawn per document; required). The query is the request's prompt text (prompt.tokens).

Refused up front (exit 2, each named by its key or flag): an output length ([output] tokens / --max-tokens, a
[[mix]] class's output), tools / tool_choice / response_format, images, a multi-turn [session], an
[abandon] after_tokens (a streaming-only cut-off), a [[mix]] class's priority, an SLO on a metric the answer
has no stamp for (ttft, ttfa, tpot, itl_p99: only e2e), and for rerank a shared [prefix] (the query is
sent once per request, not as a prompt prefix). A [rerank] table with another API is refused too.
"""
from __future__ import annotations

from loadgen.config.lengths import Lengths
from loadgen.config.options import POOLING_APIS
from loadgen.config.runconfig import RerankSpec, RunConfig
from loadgen.config.sections import Reader
from loadgen.config.slo import split_slo_key

DEFAULT_DOCUMENTS = 8


def rerank(r: Reader) -> RerankSpec | None:
    """[rerank]: the documents of each rerank request (api = "rerank"; a missing table: 8 documents whose
    length must still be given, so a rerank workload without the table is refused naming it)."""
    t = r.raw.get("rerank")
    if r.api() != "rerank":
        if t is not None:
            r.bad("rerank", "the [rerank] table is for api = \"rerank\" only")
        return None
    if not isinstance(t, dict):
        r.bad("rerank.document_tokens", "missing: api = \"rerank\" needs a [rerank] table with document_tokens "
                                        "(each document's length in tokens; documents = how many, default 8)")
        return RerankSpec(Lengths(value=DEFAULT_DOCUMENTS), Lengths(value=1))
    count = r.lengths("rerank.documents") if "documents" in t else Lengths(value=DEFAULT_DOCUMENTS)
    return RerankSpec(count, r.lengths("rerank.document_tokens"))


def across(r: Reader, config: RunConfig) -> None:
    """What a pooling API cannot carry (module docstring); every problem named by its key or flag."""
    api = config.api
    if api not in POOLING_APIS:
        return
    what = f"api = \"{api}\" answers with one JSON object and generates no token"
    if r.given("output.tokens"):
        r.bad("output.tokens", f"{what}: there is no output length to ask for (remove it)")
    for i, c in enumerate(r.raw.get("mix") or ()):
        if isinstance(c, dict) and c.get("output") is not None:
            r.bad(f"mix[{i}].output", f"{what}: a class gives no output length (remove it)")
    for i, c in enumerate(config.mix):
        if c.priority is not None:
            r.bad(f"mix[{i}].priority", f"api = \"{api}\" sends no priority field (only completions and chat do)")
    s = config.structured
    if s is not None:
        for key, on in (("tools", s.has_tools), ("tool_choice", s.tool_choice), ("response_format", s.has_schema)):
            if on:
                r.bad(f"request.{key}", f"{what}: it sends no {key}")
    if config.session is not None:
        r.bad("session", f"{what}: there is no reply to send back, so no multi-turn conversation")
    if config.abandon is not None and config.abandon.after_tokens is not None:
        r.bad("abandon.after_tokens", f"{what}: nothing streams, so no cut-off after output tokens "
                                      f"(after_ms cuts by time)")
    if api == "rerank" and config.prefix is not None:
        r.bad("prefix", "api = \"rerank\" sends its query once per request with the documents: no shared prompt "
                        "prefix")
    for key, _ in config.slo or ():
        metric, _cls = split_slo_key(key)
        if metric != "e2e":
            r.problems.append(f"--slo: {key}: {what}, so it has no {metric}: only e2e can be bounded")
