"""Fuzz targets: the raw HTTP response parser and the SSE / NDJSON stream interpreters take
any bytes, split at any points, and end with a named outcome, never another exception or a hang:
oversized lines and heads, invalid UTF-8, bad chunk sizes, bodies that never end."""
from __future__ import annotations

from array import array

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loadgen.client.backends import make_backend
from loadgen.client.rawhttp import parse_response
from loadgen.client.recorder import Outcome, Row
from loadgen.client.transport import TransportError

SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# Pieces that make the fuzzer hit the interesting paths: framing, JSON shapes, bad bytes.
PIECES = [b"data: ", b"\n", b"\r\n", b"\r", b"\n\n", b"[DONE]", b'{"choices":[{"text":"a","finish_reason":null}]}',
          b'{"choices":[{"delta":{"content":"x"}}]}', b'{"usage":{"completion_tokens":3}}', b'{"error":"boom"}',
          b'{"response":"t","done":false}', b'{"done":true,"eval_count":2}', b'{"content":"c","stop":false}',
          b'{"stop":true}', b"\xff\xfe", b"\xc3", b": keep-alive", b"event: x", b"{", b"}", b"null", b"[]",
          b'{"choices":null}', b'{"choices":[null]}', b'{"choices":[{"delta":null}]}', b'{"usage":5}',
          b'{"choices":[{"text":5}]}', b'{"choices":[{"delta":{"content":[1]}}]}', b'{"response":7,"done":false}',
          b'{"content":{"a":1},"stop":false}', b'{"done":true,"eval_count":"x"}', b'{"stop":true,"timings":3}']
STREAMS = st.lists(st.one_of(st.sampled_from(PIECES), st.binary(max_size=40)), max_size=40).map(b"".join)


def _split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({min(c, len(data)) for c in cuts})
    out, prev = [], 0
    for p in points + [len(data)]:
        out.append(data[prev:p])
        prev = p
    return [x for x in out if x]


def _interpret(backend_name: str, api: str, reads: list[bytes]) -> Row:
    row = Row(0, "r", 0, 8, 8)
    backend = make_backend(backend_name, api, "m", {})
    backend.interpret(row, array("q", range(1, len(reads) + 1)), reads)
    return row


@pytest.mark.parametrize("backend_name, api", [("openai", "completions"), ("openai", "chat"),
                                               ("ollama", "completions"), ("llamacpp", "completions")])
@SETTINGS
@given(data=STREAMS, cuts=st.lists(st.integers(0, 2000), max_size=12))
def test_stream_interpreters_take_any_bytes(backend_name, api, data, cuts):
    row = _interpret(backend_name, api, _split(data, cuts))
    assert row.outcome in tuple(Outcome) and row.n_chunks == len(row.chunk_t_ns) == len(row.chunk_tokens)
    assert sum(row.chunk_tokens) <= max(row.output_tokens or 0, row.n_chunks)


HEADS = st.lists(st.sampled_from([b"HTTP/1.1 200 OK", b"HTTP/1.0 abc", b"HTTP/1.1", b"\r\n", b"\r\n\r\n",
                                  b"Content-Length: 5", b"Content-Length: x", b"Content-Length: -3",
                                  b"Transfer-Encoding: chunked", b"Connection: close", b"5\r\nhello\r\n",
                                  b"zz\r\n", b"0\r\n\r\n", b"ffffffffffffffffffff\r\n", b"\xff"]),
                 max_size=14).map(b"".join)


@SETTINGS
@given(data=st.one_of(HEADS, st.binary(max_size=200)), cuts=st.lists(st.integers(0, 300), max_size=8),
       closed=st.booleans())
def test_raw_http_parser_takes_any_bytes(data, cuts, closed):
    try:
        p = parse_response(_split(data, cuts) or [b""], closed)
    except TransportError as e:
        assert e.kind == "bad_response"
        return
    if p is not None:
        assert len(p.body_reads) == len(_split(data, cuts) or [b""])


@pytest.mark.parametrize("backend_name", ["openai", "ollama"])
def test_an_oversized_line_is_a_named_stream_error(backend_name):
    # 64 MiB without a line end, in 64 KiB reads: linear work, then a named outcome.
    reads = [b"data: {" if backend_name == "openai" else b'{"response":"'] + [b"a" * 65536] * 1024
    row = _interpret(backend_name, "completions", reads)
    assert row.outcome == "stream_error" and row.error_kind == "malformed_chunk"
    assert "longer than" in row.error_detail
