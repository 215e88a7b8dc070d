"""What every backend does with a finished response body, whatever its framing (SSE or NDJSON).

Stream holds the token-bearing chunks found so far (their read stamps and text lengths), which of them
are reasoning (a model's thinking, before its answer) and the stamp of the first answer chunk (any
chunk that is not reasoning: content, completion text, a tool call's text), and the first malformed
event and error event seen. Backends decode each event with `decode()`, add text with
`token()`, then `fill()` the row: token fields by the counting rule below, then the outcome.

Token counting rule (every backend): a chunk is an event that carries non-empty output text. When the
server reports the output token count N and there are C chunks: N == C gives one token per chunk;
otherwise each chunk gets one token and the remaining N - C are spread over the chunks in proportion to
their text length (largest remainder, so the sum is exactly N); when N < C the N tokens are spread by
length alone and some chunks carry 0. Without a count, each chunk is one token and output_tokens = C.
Reasoning tokens: the server's count when it gives one (usage.completion_tokens_details.reasoning_tokens),
else the tokens this rule gives the reasoning chunks. A server count below the number of reasoning chunks
is one the stream contradicts (every chunk is at least one token): counted by the rule too. vLLM 0.32's
deepseek_r1 parser says 0 for a reply that streamed reasoning without generating `<think>` (it counts the
tokens between a generated `<think>` and `</think>` only). An event that carries reasoning and answer text
at once is two chunks with the same stamp (reasoning first), so both kinds are counted and the ITL rule
sees one read.
Outcome: an error event inside a 200 stream, else a malformed event, else a missing end-of-stream
marker makes it a stream_error (the tokens seen are kept); otherwise ok.
"""
from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import orjson

from loadgen.client.backends.sse import MAX_LINE_BYTES, SSEParser
from loadgen.client.recorder import OK, STREAM_ERROR, ErrorKind, Row
from loadgen.config.credentials import clipped


class Stream:
    __slots__ = ("chunk_t", "lengths", "texts", "reasoning_at", "first_answer", "error", "malformed", "content",
                 "calls")

    def __init__(self) -> None:
        self.chunk_t: list[int] = []
        self.lengths: list[int] = []
        self.texts: list[str] = []          # answer text only (reply_text: a session's next turn sends it)
        self.reasoning_at: list[int] = []   # positions in chunk_t of the reasoning chunks
        self.first_answer: int | None = None  # stamp of the first answer chunk; None: no answer yet
        self.error: str | None = None
        self.malformed: str | None = None
        # Kept only when the reply is judged (backends/replies.py; None otherwise): the content text
        # pieces, and each tool call's name and arguments pieces by its index.
        self.content: list[str] | None = None
        self.calls: dict[int, tuple[list[str], list[str]]] | None = None

    def judged(self) -> "Stream":
        """This stream, keeping what a judge of the reply reads (content, calls)."""
        self.content, self.calls = [], {}
        return self

    def reply(self) -> tuple[str, list[list[str]]]:
        """The content text, and [name, arguments] of each call in index order (judged() streams)."""
        calls = self.calls or {}
        return "".join(self.content or ()), [["".join(calls[i][0]), "".join(calls[i][1])] for i in sorted(calls)]

    def decode(self, data: bytes) -> dict[str, Any] | None:
        """The event's JSON object; None for an error event or a malformed one (both recorded)."""
        try:
            obj = orjson.loads(data)
        except orjson.JSONDecodeError:
            self.malformed = self.malformed or f"event is not JSON: {clipped(data, 120)!r}"
            return None
        if not isinstance(obj, dict):
            self.malformed = self.malformed or f"event is not a JSON object: {clipped(data, 120)!r}"
            return None
        err = obj.get("error")
        if err is not None:  # `"error": null` beside a chunk's fields is no error
            self.error = (err.get("message") if isinstance(err, dict) else None) or str(err)
            return None
        return obj

    def lines_dropped(self, n: int) -> None:
        # Lines over sse.MAX_LINE_BYTES (SSE or NDJSON): the stream is malformed, named by its cause.
        if n:
            self.malformed = self.malformed or f"{n} line(s) longer than {MAX_LINE_BYTES} bytes (dropped)"

    def token(self, t_ns: int, text: str | None) -> None:
        """An answer chunk (content, completion text, a tool call's text)."""
        if isinstance(text, str) and text:  # anything else a server sends as text carries no token
            self.chunk_t.append(t_ns)
            self.lengths.append(len(text))
            self.texts.append(text)
            if self.first_answer is None:
                self.first_answer = t_ns

    def reasoning(self, t_ns: int, text: str | None) -> None:
        """A reasoning chunk: output, but not yet the answer."""
        if isinstance(text, str) and text:
            self.reasoning_at.append(len(self.chunk_t))
            self.chunk_t.append(t_ns)
            self.lengths.append(len(text))

    def fill(self, row: Row, output_tokens: int | None, prompt_tokens: int | None, ended: bool,
             end_marker: str, reasoning_tokens: int | None = None) -> None:
        """reasoning_tokens: the server's count (None, or fewer than the reasoning chunks: counted from them)."""
        row.prompt_tokens = prompt_tokens
        row.chunk_t_ns.extend(self.chunk_t)
        tokens = spread_tokens(self.lengths, output_tokens)
        row.chunk_tokens.extend(tokens)
        row.n_chunks = len(self.chunk_t)
        row.output_tokens = output_tokens if output_tokens is not None else len(self.chunk_t)
        if self.chunk_t:
            row.first_token_ns, row.last_token_ns = self.chunk_t[0], self.chunk_t[-1]
        row.first_answer_ns = self.first_answer
        row.reasoning_tokens = (reasoning_tokens if reasoning_tokens is not None
                                and reasoning_tokens >= len(self.reasoning_at)
                                else sum(tokens[i] for i in self.reasoning_at))
        if self.error is not None:
            row.fail(STREAM_ERROR, ErrorKind.ERROR_EVENT, self.error)
        elif self.malformed is not None:
            row.fail(STREAM_ERROR, ErrorKind.MALFORMED_CHUNK, self.malformed)
        elif not ended:
            row.fail(STREAM_ERROR, ErrorKind.INCOMPLETE_STREAM, f"stream closed before {end_marker}")
        elif row.outcome is None:
            row.outcome = OK


def sse_events(read_t_ns: Sequence[int], reads: list[bytes], stream: Stream) -> Iterator[tuple[int, bytes]]:
    """(stamp, data) of every SSE event in the reads: an event is stamped with the read that completed
    it; what the stream's end completes, with the last read's stamp. Lines the parser dropped as too
    long make the stream malformed."""
    parser = SSEParser()
    for t, data in zip(read_t_ns, reads):
        for ev in parser.feed(data):
            yield t, ev.data
    if len(read_t_ns):
        for ev in parser.close():
            yield read_t_ns[-1], ev.data
    stream.lines_dropped(parser.too_long)


def spread_tokens(lengths: list[int], total: int | None) -> list[int]:
    """Tokens per chunk under the rule in the module comment."""
    c = len(lengths)
    if total is None or total == c or c == 0:
        return [1] * c
    base = np.ones(c, dtype=np.int64) if total > c else np.zeros(c, dtype=np.int64)
    rest = total - int(base.sum())
    weights = np.asarray(lengths, dtype=np.float64)
    if weights.sum() <= 0:
        weights = np.ones(c)
    share = weights / weights.sum() * rest
    add = np.floor(share).astype(np.int64)
    left = rest - int(add.sum())
    if left:
        add[np.argsort(-(share - add), kind="stable")[:left]] += 1
    out: list[int] = (base + add).tolist()
    return out


def as_int(v: object) -> int | None:
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def as_float(v: object) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None
