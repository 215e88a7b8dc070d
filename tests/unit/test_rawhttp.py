"""rawhttp's response parsing, done after the stream from the stamped raw reads (no sockets here)."""
import pytest

from hypothesis import given, settings
from hypothesis import strategies as st

from loadgen.client import rawhttp
from loadgen.client.rawhttp import parse_response
from loadgen.client.transport import TransportError

HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


def chunk(payload: bytes) -> bytes:
    return f"{len(payload):x}\r\n".encode() + payload + b"\r\n"


EV = [b"data: a\n\n", b"data: bb\n\n", b"data: [DONE]\n\n"]


def test_chunked_body_is_split_back_per_read():
    reads = [HEAD, chunk(EV[0]), chunk(EV[1]) + chunk(EV[2]) + b"0\r\n\r\n"]
    p = parse_response(reads, closed=False)
    assert p.status == 200 and p.chunked and p.complete and p.keep_alive
    assert p.body_reads == [b"", EV[0], EV[1] + EV[2]]


def test_head_and_first_chunk_in_one_read_and_a_chunk_split_across_reads():
    whole = chunk(EV[1])
    reads = [HEAD + chunk(EV[0]), whole[:5], whole[5:] + b"0\r\n", b"\r\n"]
    p = parse_response(reads, closed=False)
    assert p.complete
    assert p.body_reads[0] == EV[0] and p.body_reads[1] + p.body_reads[2] == EV[1] and p.body_reads[3] == b""


def test_a_false_end_mark_inside_data_is_not_the_end():
    payload = b"data: 0\r\n\r\n"  # the read ends with 0\r\n\r\n but it is data
    reads = [HEAD, f"{len(payload):x}\r\n".encode() + payload]
    assert parse_response(reads, closed=False).complete is False


def test_content_length_and_head_not_yet_complete():
    assert parse_response([b"HTTP/1.1 200 OK\r\nContent-Le"], closed=False) is None
    p = parse_response([b"HTTP/1.1 429 Too Many\r\nContent-Length: 4\r\nConnection: close\r\n\r\nsl", b"ow"],
                       closed=False)
    assert p.status == 429 and p.complete and not p.keep_alive and p.body_reads == [b"sl", b"ow"]


def test_not_http_is_a_bad_response():
    with pytest.raises(TransportError) as e:
        parse_response([b"SSH-2.0-OpenSSH\r\n\r\n"], closed=False)
    assert e.value.kind == "bad_response"


# The read-by-read de-chunker (the common case) gives exactly what the joined path gives, or defers to it.
CHUNKS = st.lists(st.tuples(st.binary(min_size=1, max_size=30), st.sampled_from([b"", b";ext=1", b" "])),
                  max_size=8)


@settings(max_examples=300, deadline=None)
@given(chunks=CHUNKS, ending=st.sampled_from([b"0\r\n\r\n", b"0\r\n", b"0\r\nX-T: 1\r\n\r\n", b"", b"3\r\nab"]),
       cuts=st.lists(st.integers(0, 400), max_size=10))
def test_read_by_read_dechunk_equals_the_joined_path(chunks, ending, cuts):
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    raw = head + b"".join(b"%x%s\r\n%s\r\n" % (len(d), ext, d) for d, ext in chunks) + ending
    points = sorted({min(c, len(raw)) for c in cuts} | {len(raw)})
    reads = [raw[a:b] for a, b in zip([0] + points, points) if b > a]
    offsets, pos = [], 0
    for r in reads:
        offsets.append((pos, pos + len(r)))
        pos += len(r)
    body, owner, complete = rawhttp._dechunk(raw, len(head), offsets)
    expect = rawhttp._split_by_read(body, owner, offsets, len(head))
    fast = rawhttp._dechunk_reads(reads, len(head))
    if fast is not None:
        assert fast == (expect, complete)
    p = parse_response(reads, closed=False)
    assert (p.body_reads, p.complete) == (expect, complete)


def _joined(reads, header_end):
    offsets, pos = [], 0
    for r in reads:
        offsets.append((pos, pos + len(r)))
        pos += len(r)
    body, owner, complete = rawhttp._dechunk(b"".join(reads), header_end, offsets)
    return rawhttp._split_by_read(body, owner, offsets, header_end), complete


def test_one_whole_chunk_per_read_known_sizes_equals_the_joined_path():
    # The common stream: every read one whole chunk; from the second stream on its size lines are known.
    payloads = [b"data: %d\n\n" % (i % 10) for i in range(12)] + [b"data: [DONE]\n\n"]
    reads = [HEAD] + [chunk(p) for p in payloads] + [b"0\r\n\r\n"]
    for _ in range(2):
        assert rawhttp._dechunk_reads(reads, len(HEAD)) == _joined(reads, len(HEAD)) == ([b"", *payloads, b""], True)
    # a known size line on a read that is not exactly its chunk: the general path takes it
    whole = chunk(payloads[0])
    for split in ([HEAD, whole[:-3], whole[-3:] + chunk(payloads[1]), b"0\r\n\r\n"],
                  [HEAD, whole + chunk(payloads[1]), b"0\r\n\r\n"],
                  [HEAD, whole[:-2] + b"XY", b"0\r\n\r\n"]):  # the CRLF after data is skipped, not checked
        assert rawhttp._dechunk_reads(split, len(HEAD)) == _joined(split, len(HEAD))
