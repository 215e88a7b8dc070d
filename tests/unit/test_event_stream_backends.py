"""The OpenAI Responses and Anthropic Messages backends: real vLLM 0.32 streams replayed from byte transcripts
(tests/data/vllm/, tests/e2e/record_vllm_transcripts.py) and hand-written streams for what the tiny model
never sends (reasoning, tool calls, error events, a cut stream)."""
from array import array
from itertools import accumulate

import orjson
import pytest

from loadgen.client.backends import make_backend
from loadgen.client.backends.messages import MessagesBackend
from loadgen.client.backends.responses import ResponsesBackend
from loadgen.client.recorder import OK, STREAM_ERROR, ErrorKind, Row
from tests.transcripts import Transcript

DELTA = {"responses": b"response.output_text.delta", "messages": b'"text_delta"'}
BACKEND = {"responses": ResponsesBackend, "messages": MessagesBackend}


def run(backend, reads: list[bytes], stamps: list[int] | None = None) -> Row:
    row = Row(0, "r0", 0, 8, 8)
    backend.interpret(row, array("q", stamps or range(1, len(reads) + 1)), reads)
    return row


def event_stamps(reads: list[bytes], marker: bytes) -> list[int]:
    """The stamp (1-based read number) of every event holding marker: the read where its blank line ends,
    found by offsets alone (no SSE parser)."""
    body, ends = b"".join(reads), list(accumulate(map(len, reads)))
    out, pos = [], 0
    for block in body.split(b"\n\n")[:-1]:
        pos += len(block) + 2
        if marker in block:
            out.append(next(i for i, e in enumerate(ends) if e >= pos) + 1)
    return out


def event(kind: str, **fields) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps({"type": kind, **fields}) + b"\n\n"


@pytest.mark.parametrize("api", ["responses", "messages"])
def test_recorded_vllm_stream(api):
    t = Transcript("vllm", f"{api}_stream")
    row = run(BACKEND[api]("chat", "tiny", {}), t.body_reads)
    events = [orjson.loads(b.split(b"data: ", 1)[1]) for b in t.body.split(b"\n\n") if b"data: " in b]
    stamps = event_stamps(t.body_reads, DELTA[api])
    assert row.outcome == OK and row.error_kind is None
    assert row.n_chunks == len(stamps) > 1 and list(row.chunk_t_ns) == stamps
    assert (row.first_token_ns, row.first_answer_ns, row.last_token_ns) == (stamps[0], stamps[0], stamps[-1])
    # the events before the first delta (response.created / message_start, ...) are no token: vLLM sent
    # /v1/responses' created and in_progress events in reads of their own
    assert (row.first_token_ns > 1) == (DELTA[api] not in t.body_reads[0])
    assert api != "responses" or row.first_token_ns > 2
    if api == "responses":
        usage = events[-1]["response"]["usage"]
        assert events[-1]["type"] == "response.completed" and events[-1]["response"]["status"] == "incomplete"
        assert row.output_tokens == usage["output_tokens"] == 8 and row.prompt_tokens == usage["input_tokens"]
        # vLLM 0.32's /v1/responses counts one token more than its chat template does (a second BOS)
        assert row.prompt_tokens == t.doc["tokenize"] + 1
        assert row.cached_tokens == 0 and row.reasoning_tokens == 0
        text = next(e["text"] for e in events if e["type"] == "response.output_text.done")
    else:
        usage = next(e for e in events if e["type"] == "message_delta")["usage"]
        assert row.output_tokens == usage["output_tokens"] == 8 and row.prompt_tokens == t.doc["tokenize"]
        assert row.cached_tokens is None and row.reasoning_tokens == 0
        text = "".join(e["delta"]["text"] for e in events if e["type"] == "content_block_delta")
    assert sum(row.chunk_tokens) == 8
    assert BACKEND[api]("chat", "tiny", {}).reply_text(t.body_reads) == text


@pytest.mark.parametrize("api", ["responses", "messages"])
def test_recorded_stream_split_at_every_byte_gives_the_same_row(api):
    t = Transcript("vllm", f"{api}_stream")
    whole = run(BACKEND[api]("chat", "tiny", {}), [t.body], [7])
    for cut in range(1, len(t.body), 7):
        row = run(BACKEND[api]("chat", "tiny", {}), [t.body[:cut], t.body[cut:]], [7, 7])
        assert (row.outcome, row.output_tokens, row.prompt_tokens, row.n_chunks) == (
            whole.outcome, whole.output_tokens, whole.prompt_tokens, whole.n_chunks), cut


@pytest.mark.parametrize("api", ["responses", "messages"])
def test_recorded_stream_cut_before_its_end_is_incomplete(api):
    t = Transcript("vllm", f"{api}_stream")
    end = b"event: response.completed" if api == "responses" else b"event: message_stop"
    cut = t.body[:t.body.index(end)]
    row = run(BACKEND[api]("chat", "tiny", {}), [cut])
    assert (row.outcome, row.error_kind) == (STREAM_ERROR, ErrorKind.INCOMPLETE_STREAM)
    assert row.n_chunks == len(event_stamps([t.body], DELTA[api]))  # the tokens seen are kept


def test_request_bodies():
    msgs = [{"role": "system", "content": "sys"}, {"role": "user", "content": "u1"},
            {"role": "assistant", "content": "a1"}, {"role": "user", "content": "u2"}]
    r = orjson.loads(make_backend("openai", "responses", "m", {"ignore_eos": True}).body_messages(msgs, 5))
    assert r == {"model": "m", "input": msgs, "max_output_tokens": 5, "stream": True, "store": False,
                 "ignore_eos": True}
    m = orjson.loads(make_backend("openai", "messages", "m", {}).body_messages(msgs, 5))
    assert m == {"model": "m", "system": "sys", "messages": msgs[1:], "max_tokens": 5, "stream": True}
    assert "system" not in orjson.loads(MessagesBackend("messages", "m", {}).body("hi", 3))
    assert make_backend("openai", "responses", "m", {}).path == "/v1/responses"
    assert make_backend("openai", "messages", "m", {}).path == "/v1/messages"


def test_responses_reasoning_then_answer_and_usage_details():
    usage = {"input_tokens": 9, "output_tokens": 6, "input_tokens_details": {"cached_tokens": 4},
             "output_tokens_details": {"reasoning_tokens": 3}}
    reads = [event("response.created", response={"status": "in_progress", "usage": None, "error": None}),
             event("response.reasoning_text.delta", delta="think "),
             event("response.reasoning_summary_text.delta", delta="more "),
             event("response.output_text.delta", delta="a ") + event("response.output_text.delta", delta="b "),
             event("response.function_call_arguments.delta", delta='{"x":1}'),
             event("response.output_text.done", text="a b ") +
             event("response.completed", response={"status": "completed", "usage": usage,
                                                    "metrics": {"queue_time_ms": 1.5, "time_to_first_token_ms": 2.5,
                                                                "generation_time_ms": 7.0}})]
    row = run(ResponsesBackend("responses", "m", {}), reads, [10, 20, 30, 40, 50, 60])
    assert row.outcome == OK
    assert (row.first_token_ns, row.first_answer_ns, row.last_token_ns) == (20, 40, 50)
    assert list(row.chunk_t_ns) == [20, 30, 40, 40, 50]
    assert (row.output_tokens, row.prompt_tokens, row.cached_tokens, row.reasoning_tokens) == (6, 9, 4, 3)
    assert (row.server_queue_ms, row.server_prefill_ms, row.server_decode_ms) == (1.5, 2.5, 7.0)
    assert ResponsesBackend("responses", "m", {}).reply_text(reads) == 'a b {"x":1}'


def test_responses_incomplete_event_ends_the_stream():
    reads = [event("response.output_text.delta", delta="a "),
             event("response.incomplete", response={"status": "incomplete", "usage": {"output_tokens": 1}})]
    row = run(ResponsesBackend("responses", "m", {}), reads)
    assert (row.outcome, row.output_tokens, row.reasoning_tokens) == (OK, 1, 0)


@pytest.mark.parametrize("last,detail", [
    (event("response.failed", response={"status": "failed", "error": {"code": "server_error",
                                                                        "message": "engine died"}}), "engine died"),
    (event("error", code="rate_limit", message="slow down", param=None), "slow down"),
    (b'data: {"error": {"message": "boom", "type": "InternalServerError"}}\n\n', "boom"),
])
def test_responses_error_events_are_stream_errors(last, detail):
    row = run(ResponsesBackend("responses", "m", {}), [event("response.output_text.delta", delta="a "), last])
    assert (row.outcome, row.error_kind, row.error_detail) == (STREAM_ERROR, ErrorKind.ERROR_EVENT, detail)
    assert row.n_chunks == 1


def test_messages_thinking_then_text_then_tool_use_and_cache_counts():
    start = {"type": "message", "role": "assistant", "content": [],
             "usage": {"input_tokens": 5, "cache_read_input_tokens": 10, "cache_creation_input_tokens": 2,
                       "output_tokens": 1}}
    reads = [event("message_start", message=start) + b"event: ping\ndata: {\"type\": \"ping\"}\n\n",
             event("content_block_start", index=0, content_block={"type": "thinking", "thinking": ""}),
             event("content_block_delta", index=0, delta={"type": "thinking_delta", "thinking": "hmm "}),
             event("content_block_delta", index=0, delta={"type": "signature_delta", "signature": "c2ln"}) +
             event("content_block_stop", index=0) +
             event("content_block_start", index=1, content_block={"type": "text", "text": ""}),
             event("content_block_delta", index=1, delta={"type": "text_delta", "text": "hi "}),
             event("content_block_start", index=2, content_block={"type": "tool_use", "id": "t1", "name": "f",
                                                                  "input": {}}),
             event("content_block_delta", index=2, delta={"type": "input_json_delta", "partial_json": '{"a"'}),
             event("content_block_stop", index=2) +
             event("message_delta", delta={"stop_reason": "tool_use"}, usage={"output_tokens": 7}) +
             event("message_stop")]
    row = run(MessagesBackend("messages", "m", {}), reads, [1, 2, 3, 4, 5, 6, 7, 8])
    assert row.outcome == OK
    assert list(row.chunk_t_ns) == [3, 5, 6, 7]               # thinking, text, the tool's name, its arguments
    assert (row.first_token_ns, row.first_answer_ns) == (3, 5)
    assert (row.output_tokens, row.prompt_tokens, row.cached_tokens) == (7, 17, 10)
    assert sum(row.chunk_tokens) == 7 and row.reasoning_tokens == row.chunk_tokens[0]
    assert MessagesBackend("messages", "m", {}).reply_text(reads) == 'hi f{"a"'


def test_messages_error_event_is_a_stream_error():
    reads = [event("message_start", message={"usage": {"input_tokens": 3, "output_tokens": 0}}),
             event("content_block_delta", index=0, delta={"type": "text_delta", "text": "a "}),
             event("error", error={"type": "overloaded_error", "message": "Overloaded"})]
    row = run(MessagesBackend("messages", "m", {}), reads)
    assert (row.outcome, row.error_kind, row.error_detail) == (STREAM_ERROR, ErrorKind.ERROR_EVENT, "Overloaded")
    assert (row.n_chunks, row.prompt_tokens) == (1, 3)


def test_malformed_event_is_a_stream_error():
    for backend in (ResponsesBackend("responses", "m", {}), MessagesBackend("messages", "m", {})):
        row = run(backend, [b"event: x\ndata: {not json\n\n"])
        assert (row.outcome, row.error_kind) == (STREAM_ERROR, ErrorKind.MALFORMED_CHUNK)


def test_transcripts_are_real_vllm_answers():
    for name in ("responses_stream", "messages_stream"):
        t = Transcript("vllm", name)
        assert t.status == 200 and t.headers["content-type"].startswith("text/event-stream"), name
