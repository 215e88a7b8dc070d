"""Ollama (NDJSON) and llama.cpp (/completion SSE) backends on byte-scripted streams."""
from array import array

import orjson
import pytest

from loadgen.client.backends import make_backend
from loadgen.client.backends.llamacpp import LlamaCppBackend
from loadgen.client.backends.ollama import OllamaBackend
from loadgen.client.recorder import OK, STREAM_ERROR, Row
from tests.scripted import sse


def run(backend, reads: list[bytes], stamps: list[int] | None = None) -> Row:
    row = Row(0, "r0", 0, 8, 4)
    backend.interpret(row, array("q", stamps or list(range(1, len(reads) + 1))), reads)
    return row


def nd(*objs) -> bytes:
    return b"".join(orjson.dumps(o) + b"\n" for o in objs)


OLLAMA_DONE = {"done": True, "total_duration": 90_000_000, "load_duration": 1_000_000,
               "prompt_eval_count": 8, "prompt_eval_duration": 20_000_000, "eval_count": 2,
               "eval_duration": 60_000_000}


def test_ollama_generate_durations_become_server_timings():
    reads = [nd({"response": "a ", "done": False}), nd({"response": "b ", "done": False}), nd(OLLAMA_DONE)]
    row = run(OllamaBackend("completions", "m", {}), reads, [100, 200, 300])
    assert (row.outcome, row.first_token_ns, row.last_token_ns, row.n_chunks) == (OK, 100, 200, 2)
    assert (row.output_tokens, row.prompt_tokens) == (2, 8)
    # queue = total - prompt_eval - eval = 90 - 20 - 60 ms (model load counts as waiting)
    assert (row.server_queue_ms, row.server_prefill_ms, row.server_decode_ms) == (10.0, 20.0, 60.0)


def test_ollama_chat_lines_split_across_reads_at_any_byte():
    whole = nd({"message": {"role": "assistant", "content": "hi "}, "done": False},
               {"message": {"role": "assistant", "content": ""}, **OLLAMA_DONE, "eval_count": 1})
    for cut in range(1, len(whole)):
        row = run(OllamaBackend("chat", "m", {}), [whole[:cut], whole[cut:]], [10, 20])
        assert row.outcome == OK and row.n_chunks == 1 and row.output_tokens == 1, cut


@pytest.mark.parametrize("reads, kind", [
    # no done:true object: the stream was cut
    ([nd({"response": "a", "done": False})], "incomplete_stream"),
    # an error object inside a 200 stream
    ([nd({"response": "a", "done": False}, {"error": "model crashed"})], "error_event"),
    # a line that is not JSON
    ([b"{oops\n", nd(OLLAMA_DONE)], "malformed_chunk"),
])
def test_ollama_broken_streams_are_stream_errors(reads, kind):
    row = run(OllamaBackend("completions", "m", {}), reads)
    assert (row.outcome, row.error_kind) == (STREAM_ERROR, kind)


def test_ollama_body_sets_num_predict_and_path():
    b = OllamaBackend("chat", "llama3", {"options": {"temperature": 0}})
    body = orjson.loads(b.body("hello", 7))
    assert b.path == "/api/chat" and body["stream"] is True
    assert body["options"] == {"num_predict": 7, "temperature": 0}
    assert body["messages"] == [{"role": "user", "content": "hello"}]
    assert OllamaBackend("completions", "m", {}).path == "/api/generate"


def llama_final(n: int) -> str:
    return orjson.dumps({"content": "", "stop": True, "tokens_predicted": n, "tokens_evaluated": 8,
                         "timings": {"prompt_n": 8, "prompt_ms": 12.5, "predicted_n": n,
                                     "predicted_ms": 30.25}}).decode()


def test_llamacpp_timings_become_server_timings():
    reads = [sse('{"content":"a ","stop":false}'), sse('{"content":"b ","stop":false}'), sse(llama_final(2))]
    row = run(LlamaCppBackend("completions", "m", {}), reads, [5, 15, 25])
    assert (row.outcome, row.first_token_ns, row.last_token_ns, row.output_tokens) == (OK, 5, 15, 2)
    assert (row.server_prefill_ms, row.server_decode_ms, row.server_queue_ms) == (12.5, 30.25, None)
    assert row.prompt_tokens == 8


def test_llamacpp_multi_token_chunk_counts_from_tokens_predicted():
    # One chunk carrying text of 3 tokens; tokens_predicted = 3 puts all three on it.
    row = run(LlamaCppBackend("completions", "m", {}), [sse('{"content":"a b c","stop":false}', llama_final(3))])
    assert list(row.chunk_tokens) == [3] and row.output_tokens == 3


@pytest.mark.parametrize("reads, kind", [
    # closed before stop: true
    ([sse('{"content":"a","stop":false}')], "incomplete_stream"),
    # an error event
    ([sse('{"error":{"message":"context too long"}}')], "error_event"),
])
def test_llamacpp_broken_streams_are_stream_errors(reads, kind):
    row = run(LlamaCppBackend("completions", "m", {}), reads)
    assert (row.outcome, row.error_kind) == (STREAM_ERROR, kind)


def test_make_backend_names():
    assert make_backend("llamacpp", "completions", "m", {}).path == "/completion"
    assert make_backend("openai", "chat", "m", {}).path == "/v1/chat/completions"
    with pytest.raises(ValueError, match="unknown backend"):
        make_backend("tgi", "chat", "m", {})
