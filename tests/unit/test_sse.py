import itertools

import pytest

from loadgen.client.backends.sse import Event, SSEParser


def parse(chunks: list[bytes]) -> list[Event]:
    p = SSEParser()
    events = []
    for c in chunks:
        events += p.feed(c)
    return events + p.close()


STREAM = (b": keep-alive\r\n\r\n"
          b"data: {\"a\":1}\r\n\r\n"
          b"event: error\ndata: {\"error\":{\"message\":\"boom\"}}\n\n"
          b"data: line1\ndata: line2\n\n"
          b"data:nospace\r\r"
          b"id: 7\nretry: 10\ndata: [DONE]\n\n")
EXPECTED = [Event(None, b'{"a":1}'), Event("error", b'{"error":{"message":"boom"}}'),
            Event(None, b"line1\nline2"), Event(None, b"nospace"), Event(None, b"[DONE]")]


def test_whole_stream():
    assert parse([STREAM]) == EXPECTED


@pytest.mark.parametrize("cut", range(1, len(STREAM)))
def test_every_single_cut_gives_the_same_events(cut):
    assert parse([STREAM[:cut], STREAM[cut:]]) == EXPECTED


def test_every_pair_of_cuts_gives_the_same_events():
    n = len(STREAM)
    for a, b in itertools.combinations(range(1, n), 2):
        assert parse([STREAM[:a], STREAM[a:b], STREAM[b:]]) == EXPECTED, (a, b)


def test_byte_by_byte():
    assert parse([STREAM[i:i + 1] for i in range(len(STREAM))]) == EXPECTED


def test_last_event_without_blank_line_is_delivered_at_close():
    assert parse([b"data: x\n\ndata: tail"]) == [Event(None, b"x"), Event(None, b"tail")]


def test_crlf_split_between_reads_is_one_line_end():
    # "\r" then "\n" in the next read must not end an extra (empty) line in between.
    assert parse([b"data: a\r", b"\ndata: b\r\n\r\n"]) == [Event(None, b"a\nb")]


def test_comment_only_stream_has_no_events():
    assert parse([b": ping\n\n: ping\n\n"]) == []
