"""Per-request rows and per-chunk stamps, in memory while the run goes, flushed as it goes.

A Row is created for every scheduled request before the run starts, so every request yields exactly one
row whatever happens to it. Times on a Row are absolute `time.monotonic_ns()` values during the run;
results/folder.py turns them into int64 ns from t0 when writing (None stays null, never 0).

Once a finished row is written in a flushed part (RunWriter.flush), the part is its only copy: the
recorder drops it from the row list (its slot becomes None), so a long run's memory stays flat, and the
end of the run reads the flushed rows back from the parts (RunWriter.finalize).
"""
from __future__ import annotations

from array import array
from enum import StrEnum
from typing import Literal

from loadgen.config.credentials import redact_text


class Outcome(StrEnum):
    """Exactly one per row; the values are the `outcome` column's strings."""
    OK = "ok"
    HTTP_ERROR = "http_error"            # the server answered with a status >= 400 (error_kind http_<status>)
    STREAM_ERROR = "stream_error"        # 200, but: an error event, a malformed chunk, or no end of stream
    CONNECTION_ERROR = "connection_error"  # refused, reset or closed by the peer (error_kind says which)
    TIMEOUT = "timeout"                  # request_timeout elapsed, or still in flight when the drain ended
    DROPPED = "dropped"                  # held back by --max-concurrency and never started before the end
    ABANDONED = "abandoned"              # cut off by the client at its planned point ([abandon]): not a failure
    INTERRUPTED = "interrupted"          # in flight when SIGINT/SIGTERM stopped the run
    CANCELLED = "cancelled"              # not yet due when SIGINT/SIGTERM stopped the run


OK, HTTP_ERROR, STREAM_ERROR, CONNECTION_ERROR, TIMEOUT, DROPPED, ABANDONED, INTERRUPTED, CANCELLED = Outcome


class ErrorKind(StrEnum):
    """Why a row is not ok (the `error_kind` column), besides `http_<status>` for HTTP errors."""
    CONNECT_FAILED = "connect_failed"        # connection_error: refused, unreachable, bad address
    RESET = "reset"                          # connection_error: closed by the peer before the end
    BAD_RESPONSE = "bad_response"            # connection_error: not HTTP/1.x, bad framing, oversized head
    RESPONSE_TOO_LARGE = "response_too_large"  # connection_error: the body exceeded the transport's bound
    CLIENT_ERROR = "client_error"            # connection_error: an unexpected client-side failure
    ERROR_EVENT = "error_event"              # stream_error: an error object inside a 200 stream
    MALFORMED_CHUNK = "malformed_chunk"      # stream_error: an event that is not a JSON object, or too long
    INCOMPLETE_STREAM = "incomplete_stream"  # stream_error: closed before its end marker
    REQUEST_TIMEOUT = "request_timeout"      # timeout: run.request_timeout elapsed
    DRAIN_TIMEOUT = "drain_timeout"          # timeout: still in flight when the drain ended
    INTERRUPTED = "interrupted"              # interrupted: in flight at SIGINT/SIGTERM
    CANCELLED = "cancelled"                  # cancelled: not yet due at SIGINT/SIGTERM
    DROPPED = "dropped"                      # dropped: held back by --max-concurrency until the end
    SESSION_BROKEN = "session_broken"        # dropped: an earlier turn of its conversation failed
    ABANDONED = "abandoned"                  # abandoned: closed by the client as planned ([abandon])


def http_error_kind(status: int) -> str:
    return f"http_{status}"

TIME_FIELDS = ("intended_ns", "dispatched_ns", "connected_ns", "sent_ns", "response_ns",
               "first_token_ns", "first_answer_ns", "last_token_ns", "done_ns")


class Row:
    __slots__ = ("idx", "request_id", "worker", "warmup", "planned_prompt_tokens", "max_tokens",
                 *TIME_FIELDS, "slot_wait_ns", "outcome", "http_status", "error_kind", "error_detail",
                 "prompt_tokens", "cached_tokens", "output_tokens", "reasoning_tokens", "n_chunks",
                 "server_queue_ms", "server_prefill_ms",
                 "server_decode_ms", "chunk_t_ns", "chunk_tokens",
                 # workload shape (None = not set); after/think_ns drive session turns
                 "prefix_group", "session", "turn", "after", "think_ns",
                 # [abandon]: cut off this long after dispatch / after this many output tokens (None = no)
                 "abandon_after_ns", "abandon_after_tokens", "cut",
                 "images", "image_width", "image_height",   # [image]: how many, each w x h pixels (None = none)
                 # its [[mix]] class's name (the `class` column; None = no mix), the model named in its body,
                 # the priority sent (None = none sent)
                 "mix_class", "model", "priority",
                 # the reply judged against the workload's tools / response_format (backends/replies.py)
                 "reply_valid", "tool_calls", "reply_problem",
                 # agentic sessions: its tool round (0 = a user message, k = the k-th request in a row carrying
                 # tool results; None = not agentic or never built) and the tool latency it waits (a tool
                 # round's; the plan's draw until the runner knows)
                 "tool_round", "tool_latency_ns")
    # Annotations only (no class attributes: the slots hold the values). Times are absolute monotonic ns.
    idx: int
    request_id: str
    worker: int
    warmup: bool
    planned_prompt_tokens: int
    max_tokens: int
    intended_ns: int
    dispatched_ns: int | None
    connected_ns: int | None
    sent_ns: int | None
    response_ns: int | None
    first_token_ns: int | None     # the first output token of any kind (reasoning included)
    first_answer_ns: int | None    # the first answer token (content or tool call); None: no answer
    last_token_ns: int | None
    done_ns: int | None
    slot_wait_ns: int | None
    outcome: str | None            # an Outcome once finished
    http_status: int | None
    error_kind: str | None         # an ErrorKind or http_<status>
    error_detail: str | None
    prompt_tokens: int | None
    cached_tokens: int | None      # prompt tokens the server says its prefix cache served (None: not said)
    output_tokens: int | None
    reasoning_tokens: int | None   # of output_tokens, the reasoning ones (None: the stream was not read)
    n_chunks: int
    server_queue_ms: float | None
    server_prefill_ms: float | None
    server_decode_ms: float | None
    chunk_t_ns: array[int]
    chunk_tokens: array[int]
    prefix_group: int | None
    session: int | None
    turn: int | None
    after: int | None
    think_ns: int
    abandon_after_ns: int | None
    abandon_after_tokens: int | None
    images: int | None
    image_width: int | None
    image_height: int | None
    cut: tuple[int, bytes] | None  # (events, their end mark): the transport closes the stream after that many
    mix_class: str | None
    model: str | None
    priority: int | None
    reply_valid: bool | None       # the reply is what was asked (valid JSON / valid calls); None: not judged
    tool_calls: int | None         # calls in the reply; None: no tools were sent (or the row is not ok)
    reply_problem: str | None      # why reply_valid is False: "<kind>: <detail>"
    tool_round: int | None
    tool_latency_ns: int | None

    def __init__(self, idx: int, request_id: str, intended_ns: int, planned_prompt_tokens: int,
                 max_tokens: int, warmup: bool = False, worker: int = 0):
        self.idx, self.request_id, self.worker, self.warmup = idx, request_id, worker, warmup
        self.planned_prompt_tokens, self.max_tokens = planned_prompt_tokens, max_tokens
        self.intended_ns = intended_ns
        self.dispatched_ns = self.connected_ns = self.sent_ns = self.response_ns = None
        self.first_token_ns = self.first_answer_ns = self.last_token_ns = self.done_ns = None
        self.slot_wait_ns = None
        self.outcome = self.http_status = self.error_kind = self.error_detail = None
        self.prompt_tokens = self.cached_tokens = self.output_tokens = self.reasoning_tokens = None
        self.n_chunks = 0
        self.server_queue_ms = self.server_prefill_ms = self.server_decode_ms = None
        self.chunk_t_ns = array("q")   # one stamp per token-bearing chunk (absolute monotonic ns)
        self.chunk_tokens = array("l")  # tokens carried by each chunk
        self.prefix_group = self.session = self.turn = None
        self.after = None   # idx of the previous turn: this row is sent think_ns after that one is done
        self.think_ns = 0
        self.abandon_after_ns = self.abandon_after_tokens = self.cut = None
        self.images = self.image_width = self.image_height = None
        self.mix_class = self.model = self.priority = None
        self.reply_valid = self.tool_calls = self.reply_problem = None
        self.tool_round = self.tool_latency_ns = None

    def fail(self, outcome: str, kind: str, detail: str | None = None) -> None:
        # The first failure wins: a timeout that follows a reset is still a reset.
        if self.outcome is None:
            self.outcome, self.error_kind = outcome, kind
            # a server may echo credentials back in its error text: redacted before it reaches a file
            self.error_detail = redact_text(detail)[:300] if detail else None


class Recorder:
    """Holds every Row until it is flushed; `take_finished()` hands the rows finished since the last call to
    the flusher, `release()` drops the ones a part now holds. `rows` is the very list the runner dispatches
    from: a released slot is None, which the runner skips (it never needs a finished row again)."""

    def __init__(self, rows: list[Row]):
        # Typed list[Row] because that is what the runner reads (it never reads a finished row); a
        # released slot holds None (release()).
        self.rows = rows
        self._pos: dict[int, int] | None | Literal[False] = False  # row idx -> position in `rows`: see release()
        self._finished: list[Row] = []
        self.done = self.failed = 0
        self.ttft_window_ns: list[int] = []  # recent TTFTs for the progress line
        self.e2e_window_ns: list[int] = []   # recent e2e of answers without a token (embeddings, rerank): the same

    def finish(self, row: Row) -> None:
        self._finished.append(row)
        if row.outcome == OK:
            self.done += 1
            if row.first_token_ns is not None:
                self.ttft_window_ns.append(row.first_token_ns - row.intended_ns)
                del self.ttft_window_ns[:-200]
            elif row.last_token_ns is not None:   # a pooling answer: no first token, its e2e
                self.e2e_window_ns.append(row.last_token_ns - row.intended_ns)
                del self.e2e_window_ns[:-200]
        elif row.outcome not in (CANCELLED, ABANDONED):  # never sent / closed as planned: not a failure
            self.failed += 1

    def take_finished(self) -> list[Row]:
        out, self._finished = self._finished, []
        return out

    def release(self, flushed: list[Row]) -> None:
        # These finished rows are in a written part now: drop them (may run in the flush thread; a list
        # slot assignment is atomic, and the runner reads only rows that are not finished).
        rows, pos = self.rows, self._pos
        if pos is False:
            # built at the first release, not before t0: None where idx = position (one process); a
            # --workers share holds every Nth row of the plan
            pos = self._pos = (None if all(r.idx == i for i, r in enumerate(rows))
                               else {r.idx: i for i, r in enumerate(rows)})
        for r in flushed:
            rows[r.idx if pos is None else pos[r.idx]] = None  # type: ignore[call-overload]  # a released slot

    def unflushed(self) -> list[Row]:
        """The rows no part holds (all of them when nothing was released), for RunWriter.finalize."""
        return [r for r in self.rows if r is not None]  # None: released
