from array import array

import pytest

from loadgen.client.backends.openai import OpenAIBackend
from loadgen.client.backends.stream import spread_tokens
from loadgen.client.recorder import OK, STREAM_ERROR, Row
from tests.scripted import sse


def interpret(api: str, reads: list[bytes], stamps: list[int] | None = None) -> Row:
    row = Row(0, "r0", 0, 8, 4)
    OpenAIBackend(api, "m", {}).interpret(row, array("q", stamps or list(range(len(reads)))), reads)
    return row


def test_completions_stream_one_token_per_chunk():
    reads = [sse('{"choices":[{"text":"a "}]}'), sse('{"choices":[{"text":"b ","finish_reason":"length"}]}'),
             sse('{"choices":[],"usage":{"prompt_tokens":8,"completion_tokens":2}}', "[DONE]")]
    row = interpret("completions", reads, [100, 200, 300])
    assert (row.outcome, row.first_token_ns, row.last_token_ns) == (OK, 100, 200)
    assert (row.output_tokens, row.prompt_tokens, row.n_chunks) == (2, 8, 2)
    assert list(row.chunk_tokens) == [1, 1]


def test_chat_role_chunk_is_not_a_token():
    reads = [sse('{"choices":[{"delta":{"role":"assistant","content":""}}]}'),
             sse('{"choices":[{"delta":{"content":"hi "}}]}'),
             sse('{"choices":[{"delta":{},"finish_reason":"stop"}]}', "[DONE]")]
    row = interpret("chat", reads, [10, 20, 30])
    assert (row.outcome, row.first_token_ns, row.n_chunks, row.output_tokens) == (OK, 20, 1, 1)


def test_multi_token_chunks_take_their_count_from_usage():
    # Two chunks, usage says 6 tokens: one each, the other 4 spread by text length (3:1).
    reads = [sse('{"choices":[{"text":"aaaaaa"}]}', '{"choices":[{"text":"bb","finish_reason":"length"}]}',
                 '{"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":6}}', "[DONE]")]
    row = interpret("completions", reads)
    assert list(row.chunk_tokens) == [4, 2] and row.output_tokens == 6


def test_error_event_inside_a_200_stream():
    reads = [sse('{"choices":[{"text":"a"}]}', '{"error":{"message":"engine died","code":500}}')]
    row = interpret("completions", reads)
    assert (row.outcome, row.error_kind, row.error_detail) == (STREAM_ERROR, "error_event", "engine died")
    assert row.n_chunks == 1  # the tokens seen before the error are kept


def test_malformed_chunk():
    row = interpret("completions", [sse('{"choices":[{"text":"a"}]}', "{not json", "[DONE]")])
    assert (row.outcome, row.error_kind) == (STREAM_ERROR, "malformed_chunk")


def test_stream_that_stops_early_is_incomplete():
    row = interpret("completions", [sse('{"choices":[{"text":"a"}]}')])
    assert (row.outcome, row.error_kind) == (STREAM_ERROR, "incomplete_stream")


def test_vllm_per_request_metrics_fill_server_timings():
    reads = [sse('{"choices":[{"text":"a","finish_reason":"length"}]}',
                 '{"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":1},'
                 '"metrics":{"queue_time_ms":1.5,"time_to_first_token_ms":20.0,"generation_time_ms":0.0}}',
                 "[DONE]")]
    row = interpret("completions", reads)
    assert (row.server_queue_ms, row.server_prefill_ms, row.server_decode_ms) == (1.5, 20.0, 0.0)


@pytest.mark.parametrize("lengths,total,expected", [
    ([3, 3, 3], None, [1, 1, 1]),      # no usage: one token per chunk
    ([3, 3, 3], 3, [1, 1, 1]),         # usage agrees with the chunk count
    ([6, 2], 6, [4, 2]),               # 4 extra tokens spread 3:1 by length
    ([1, 1, 1], 5, [2, 2, 1]),         # ties broken by position, sum exact
    ([5, 1, 1, 1], 2, [2, 0, 0, 0]),   # fewer tokens than chunks: spread by length alone
    ([], 4, []),                        # no chunks
])
def test_spread_tokens(lengths, total, expected):
    got = spread_tokens(lengths, total)
    assert got == expected
    if total is not None and lengths:
        assert sum(got) == total


def test_body_passes_extra_fields_and_asks_for_usage():
    import orjson

    body = orjson.loads(OpenAIBackend("chat", "m", {"ignore_eos": True, "min_tokens": 4}).body("hi", 16))
    assert body["messages"] == [{"role": "user", "content": "hi"}]
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert (body["max_tokens"], body["ignore_eos"], body["min_tokens"]) == (16, True, 4)
