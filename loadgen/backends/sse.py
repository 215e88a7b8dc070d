"""The one Server-Sent Events parser (WHATWG "event stream" rules), incremental over arbitrary reads.

Feed it bytes as they arrive; it returns the events completed by that read. It handles events split
across reads at any byte (a trailing CR is held back until the next byte shows whether LF follows),
several events in one read, CRLF / CR / LF line ends, comment lines (`: keep-alive`), `event:`,
multi-line `data:` (joined by LF) and a final event without its blank line at end of stream (`close()`).
`id:` and `retry:` are accepted and ignored: a load generator never reconnects a stream.
"""
from __future__ import annotations

import re
from typing import NamedTuple

_LINE_END = re.compile(rb"\r\n|\r|\n")


class Event(NamedTuple):
    event: str | None   # the `event:` field, None for the default "message"
    data: bytes


class SSEParser:
    __slots__ = ("_buf", "_data", "_event", "_has_data")

    def __init__(self) -> None:
        self._buf = b""
        self._data: list[bytes] = []
        self._event: str | None = None
        self._has_data = False

    def feed(self, chunk: bytes) -> list[Event]:
        buf = self._buf + chunk if self._buf else chunk
        events: list[Event] = []
        pos = 0
        for m in _LINE_END.finditer(buf):
            if m.group() == b"\r" and m.end() == len(buf):
                break  # may be the first half of CRLF: wait for the next read
            self._line(buf[pos:m.start()], events)
            pos = m.end()
        self._buf = buf[pos:]
        return events

    def close(self) -> list[Event]:
        """End of stream: a pending line and a pending event (no blank line after it) still count."""
        events: list[Event] = []
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
