"""The OpenAI backend's fast path (no per-chunk JSON parsing) gives exactly what the full parse gives."""
from array import array

import pytest

from loadgen.client.backends.openai import OpenAIBackend
from loadgen.client.recorder import Row


def cmpl(text, finish=b"null"):
    return b'data: {"choices":[{"index":0,"text":"' + text + b'","finish_reason":' + finish + b'}]}\n\n'


def chat(content=None, role=False, finish=b"null"):
    delta = b'{"role":"assistant","content":""}' if role else b'{"content":"' + content + b'"}'
    return b'data: {"choices":[{"index":0,"delta":' + delta + b',"finish_reason":' + finish + b'}]}\n\n'


def usage(n):
    return b'data: {"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":' + str(n).encode() + b'}}\n\n'


DONE = b"data: [DONE]\n\n"
C4 = [cmpl(b"a"), cmpl(b"b"), cmpl(b"c"), cmpl(b"d", b'"length"'), usage(4) + DONE]
STREAMS = {
    "one read per chunk": C4,
    "coalesced reads": [C4[0] + C4[1], C4[2], C4[3] + C4[4]],
    "blank line split across reads": [C4[0][:-1], C4[0][-1:] + C4[1], *C4[2:]],
    # the middle read holds the second half of one blank line and the first half of the next: an even
    # number of line breaks, but the first read's is odd
    "two blank lines split across reads": [C4[0][:-1], C4[0][-1:] + C4[1][:-1], C4[1][-1:] + C4[2], *C4[3:]],
    "two events in one read, then one per read": [C4[0] + C4[1], C4[2], C4[3], C4[4]],
    "chat with role chunk": [chat(role=True), chat(b"x"), chat(b"y", finish=b'"stop"'), usage(2) + DONE],
    "multi-token chunks (usage > chunks)": [cmpl(b"aa bb"), cmpl(b"c", b'"length"'), usage(3) + DONE],
    "malformed chunk": [cmpl(b"a"), b'data: {"choices":[{"te\n\n', cmpl(b"c", b'"length"'), usage(3) + DONE],
    "error event": [cmpl(b"a"), b'data: {"error":{"message":"boom"}}\n\n', usage(1) + DONE],
    # an error event in a token's place, the usage counting it: the events' text count is short
    "error event counted as a token": [cmpl(b"a"), b'data: {"error":{"message":"boom"}}\n\n', cmpl(b"c", b'"length"'),
                                       usage(3) + DONE],
    # `"error": null` beside a chunk's fields is no error, on either path
    "null error field": [b'data: {"choices":[{"index":0,"text":"a","finish_reason":null}],"error":null}\n\n',
                         cmpl(b"b", b'"length"'), usage(2) + DONE],
    "no usage": [cmpl(b"a"), cmpl(b"b", b'"length"'), DONE],
    # more tokens than the fast path's prebuilt array of ones (openai._ONES) holds
    "5,000 tokens": [cmpl(b"t")] * 4999 + [cmpl(b"z", b'"length"'), usage(5000) + DONE],
    "incomplete": [cmpl(b"a"), cmpl(b"b")],
}


@pytest.mark.parametrize("name", list(STREAMS))
def test_fast_path_equals_full_parse(name):
    reads = STREAMS[name]
    t = array("q", [1000 * (i + 1) for i in range(len(reads))])
    b = OpenAIBackend("chat" if "chat" in name else "completions", "m", {})
    fast, full = Row(0, "r", 0, 1, 4), Row(0, "r", 0, 1, 4)
    b.interpret(fast, t, reads)
    b._interpret_full(full, t, reads)
    for f in ("outcome", "error_kind", "output_tokens", "n_chunks", "prompt_tokens", "first_token_ns",
              "last_token_ns", "first_answer_ns", "reasoning_tokens"):
        assert getattr(fast, f) == getattr(full, f), f
    assert list(fast.chunk_t_ns) == list(full.chunk_t_ns) and list(fast.chunk_tokens) == list(full.chunk_tokens)


def test_fast_path_is_taken_for_the_common_stream():
    r = Row(0, "r", 0, 1, 4)
    assert OpenAIBackend("completions", "m", {})._interpret_fast(r, array("q", range(1, 6)), C4)
    assert list(r.chunk_t_ns) == [1, 2, 3, 4] and r.outcome == "ok"


def test_a_null_error_field_stays_on_the_fast_path():
    r = Row(0, "r", 0, 1, 4)
    assert OpenAIBackend("completions", "m", {})._interpret_fast(r, array("q", [1, 2, 3]), STREAMS["null error field"])
    assert r.outcome == "ok" and r.output_tokens == 2


def test_a_stream_longer_than_the_ones_array_stays_on_the_fast_path():
    r = Row(0, "r", 0, 1, 4)
    reads = STREAMS["5,000 tokens"]
    assert OpenAIBackend("completions", "m", {})._interpret_fast(r, array("q", range(1, len(reads) + 1)), reads)
    assert r.output_tokens == 5000 and list(r.chunk_tokens) == [1] * 5000
