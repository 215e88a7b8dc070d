"""The one Server-Sent Events parser (WHATWG "event stream" rules), incremental over arbitrary reads.

Feed it bytes as they arrive; it returns the events completed by that read. It handles events split
across reads at any byte (a trailing CR is held back until the next byte shows whether LF follows),
several events in one read, CRLF / CR / LF line ends, comment lines (`: keep-alive`), `event:`,
multi-line `data:` (joined by LF) and a final event without its blank line at end of stream (`close()`).
`id:` and `retry:` are accepted and ignored: a load generator never reconnects a stream.
A line longer than MAX_LINE_BYTES is dropped and counted (`too_long`); the backends make it a
stream_error. Reads of a line still open are joined once, so a huge line costs linear time.
"""
from __future__ import annotations

import re
from typing import NamedTuple

_LINE_END = re.compile(rb"\r\n|\r|\n")
MAX_LINE_BYTES = 16 << 20  # a longer line is dropped and counted in `too_long` (no event is that long)


class Event(NamedTuple):
    event: str | None   # the `event:` field, None for the default "message"
    data: bytes


class SSEParser:
    __slots__ = ("_buf", "_data", "_event", "_has_data", "_pending", "_pending_len", "_skip", "too_long")

    def __init__(self) -> None:
        self._buf = b""
        self._data: list[bytes] = []
        self._event: str | None = None
        self._has_data = False
        self._pending: list[bytes] = []  # reads of a line still open (no line end yet): joined once
        self._pending_len = 0
        self._skip = False               # inside a line longer than MAX_LINE_BYTES: dropped to its end
        self.too_long = 0                # lines dropped for their length (the caller names the error)

    def feed(self, chunk: bytes) -> list[Event]:
        if self._skip:
            m = _LINE_END.search(chunk)
            if m is None:
                return []
            self._skip, chunk = False, chunk[m.end():]
        if (self._buf or self._pending) and b"\n" not in chunk and b"\r" not in chunk \
                and not self._buf.endswith(b"\r"):
            # The open line goes on: keep the read aside (no rescan, so a long line costs linear time).
            self._pending.append(chunk)
            self._pending_len += len(chunk)
            if len(self._buf) + self._pending_len > MAX_LINE_BYTES:
                self._drop_line()
            return []
        if self._pending:
            self._buf += b"".join(self._pending)
            self._pending, self._pending_len = [], 0
        buf = self._buf + chunk if self._buf else chunk
        events: list[Event] = []
        pos = 0
        for m in _LINE_END.finditer(buf):
            if m.group() == b"\r" and m.end() == len(buf):
                break  # may be the first half of CRLF: wait for the next read
            if m.start() - pos > MAX_LINE_BYTES:
                self.too_long += 1
            else:
                self._line(buf[pos:m.start()], events)
            pos = m.end()
        self._buf = buf[pos:]
        if len(self._buf) > MAX_LINE_BYTES:
            self._drop_line()
        return events

    def _drop_line(self) -> None:
        self.too_long += 1
        self._buf, self._pending, self._pending_len, self._skip = b"", [], 0, True

    def close(self) -> list[Event]:
        """End of stream: a pending line and a pending event (no blank line after it) still count."""
        events: list[Event] = []
        if self._pending:
            self._buf += b"".join(self._pending)
            self._pending, self._pending_len = [], 0
        if self._buf:
            self._line(self._buf.rstrip(b"\r"), events)
            self._buf = b""
        self._line(b"", events)
        return events

    def _line(self, line: bytes, events: list[Event]) -> None:
        if not line:
            if self._has_data:
                events.append(Event(self._event, b"\n".join(self._data)))
            self._data, self._event, self._has_data = [], None, False
            return
        if line[0] == 0x3A:  # ':' comment / keep-alive
            return
        name, sep, value = line.partition(b":")
        if sep and value[:1] == b" ":
            value = value[1:]
        if name == b"data":
            self._data.append(value)
            self._has_data = True
        elif name == b"event":
            self._event = value.decode("utf-8", "replace")
