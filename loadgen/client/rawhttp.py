"""A minimal HTTP/1.1 client transport whose hot path is the protocol callback itself.

Why: with aiohttp a read is stamped when the reading task resumes, i.e. after the loop has parsed and
dispatched every other socket that was ready in the same iteration; measured against the simulator's
truth this put ~0.5-0.8 ms of error into the median ITL gap at 100 req/s (tests/bench/README.md). Here
`data_received` stamps the read (one clock read, two appends) before anything else happens, and all
parsing (status line, headers, chunked framing) is done after the stream, from the raw bytes.

Scope: plain http:// (https goes through aiohttp), one request per connection at a time, keep-alive
with no pool limit (an idle connection is reused, else a new one is opened: nothing queues; one idle for
IDLE_EXPIRY_NS is closed instead, before the server's own keep-alive timeout can race a request, and so is
one whose FIN the kernel holds unread, `_unread`), responses
framed by `Transfer-Encoding: chunked`, `Content-Length`, or connection close. Bounds: a head over
MAX_HEAD_BYTES is a bad_response; a response over MAX_RESPONSE_BYTES is cut off (response_too_large,
what arrived is kept); malformed status lines, lengths and chunk sizes are bad_response.
The contract is transport.Transport / transport.Response; here `stamped()` only parses: each read was
stamped in the protocol callback (on the now_ns clock it was given).
"""
from __future__ import annotations

import asyncio
import re
import select
import time
from array import array
from collections.abc import Awaitable, Callable
from itertools import compress
from types import TracebackType
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from loadgen.client.offload import OFFLOAD_READS, in_worker
from loadgen.client.recorder import ErrorKind, Row
from loadgen.client.transport import IDLE_EXPIRY_NS, Transport, TransportError

_END_CHUNKED = b"0\r\n\r\n"
MAX_HEAD_BYTES = 64 << 10        # a longer response head is a bad_response
MAX_RESPONSE_BYTES = 1 << 30     # a longer response is cut off: response_too_large (a 32k-token stream is ~6 MB)
_HEX = re.compile(rb"[0-9A-Fa-f]{1,16}")
# Bare chunk-size lines already validated by _HEX -> their size: a stream repeats a handful of sizes, so
# the common read costs a dict look-up instead of a regex match and an int() (bounded: a hostile server
# cannot grow it).
_SIZES: dict[bytes, int] = {}
_SIZES_MAX = 4096
Offsets = list[tuple[int, int]]  # each read's (start, end) byte range in the joined raw response


class _Conn(asyncio.Protocol):
    __slots__ = ("transport", "t", "data", "done", "wake_any", "closed", "lost", "size", "limit", "too_large",
                 "now_ns", "cut_events", "cut_mark", "cut_reached", "idle_since_ns")

    transport: asyncio.Transport  # set by connection_made, before any other callback or use

    def __init__(self, limit: int = 1 << 30, now_ns: Callable[[], int] = time.monotonic_ns):
        self.size, self.limit, self.too_large = 0, limit, False
        self.now_ns = now_ns
        self.transport = None  # type: ignore[assignment]  # not connected yet
        self.t: list[int] = []  # a list, not array("q"): an append costs ~70 ns, an array append ~180 ns
        self.data: list[bytes] = []
        self.done: asyncio.Future[None] | None = None
        self.wake_any = True   # wake the waiter on every read (head, non-chunked body), else on the end mark
        self.closed = False
        self.lost: Exception | None = None
        self.cut_events = 0        # > 0: [abandon] after_tokens: wake the waiter once this many events arrived
        self.cut_mark = b"\n\n"    # how each event ends
        self.cut_reached = False
        self.idle_since_ns = 0     # when it was last put back in the pool (RawHttpTransport._release)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # create_connection's: an asyncio.Transport

    def data_received(self, data: bytes) -> None:
        # The hot path: one clock read, two appends; the end-of-body check is one endswith per read
        # (a false end is caught by the full parse, which then keeps waiting).
        self.t.append(self.now_ns())
        self.data.append(data)
        self.size += len(data)
        if self.size > self.limit and not self.too_large:  # an endless body must not eat the memory
            self.too_large = True
            self.transport.close()
        if self.cut_events:  # only a request to abandon after N tokens counts its events
            self.cut_events -= min(self.cut_events, data.count(self.cut_mark))
            if not self.cut_events:
                # closed here, in the read that reached the count: no later read is received, however late
                # the waiting task runs (a starved loop once let a 12th token in after an 11-token cut)
                self.cut_reached = True
                self.transport.close()
        d = self.done
        if d is not None and (self.wake_any or self.cut_reached or data.endswith(_END_CHUNKED)) and not d.done():
            d.set_result(None)

    def eof_received(self) -> bool:
        self._finish(None)
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._finish(exc)

    def _finish(self, exc: Exception | None) -> None:
        self.closed = True
        self.lost = exc
        if self.done is not None and not self.done.done():
            self.done.set_result(None)


class _Parsed:
    __slots__ = ("status", "header_end", "chunked", "length", "keep_alive", "complete", "body_reads")

    def __init__(self) -> None:
        self.status = 0
        self.header_end = -1
        self.chunked = False
        self.length: int | None = None
        self.keep_alive = True
        self.complete = False
        self.body_reads: list[bytes] = []  # the body (de-chunked) of each read, aligned with the stamps


def parse_response(reads: list[bytes], closed: bool) -> _Parsed | None:
    """None while the head is incomplete. Body bytes are split back per read so each keeps its stamp."""
    p = parse_head(b"".join(reads))
    return None if p is None else parse_body(p, reads, closed)


def parse_head(raw: bytes) -> _Parsed | None:
    """The status line and headers (body fields unset); None while the head is incomplete."""
    end = raw.find(b"\r\n\r\n")
    if end < 0:
        return None
    p = _Parsed()
    status_line, _, fields = raw[:end].decode("latin-1").partition("\r\n")
    parts = status_line.split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1."):
        raise TransportError(ErrorKind.BAD_RESPONSE, f"not an HTTP/1.x status line: {status_line[:80]!r}")
    if not (parts[1].isdigit() and len(parts[1]) == 3):
        raise TransportError(ErrorKind.BAD_RESPONSE, f"not an HTTP status code: {status_line[:80]!r}")
    p.status = int(parts[1])
    p.keep_alive = parts[0] != "HTTP/1.0"
    for line in fields.lower().split("\r\n") if fields else ():  # names and values are matched in lower case
        name, _, value = line.partition(":")
        name = name.strip()
        if name == "transfer-encoding":
            p.chunked = p.chunked or "chunked" in value
        elif name == "content-length":
            value = value.strip()
            if not value.isdigit():
                raise TransportError(ErrorKind.BAD_RESPONSE, f"bad Content-Length {value[:40]!r}")
            p.length = int(value)
        elif name == "connection":
            value = value.strip()
            p.keep_alive = value != "close" if parts[0] != "HTTP/1.0" else value == "keep-alive"
    p.header_end = end + 4
    return p


def parse_body(p: _Parsed, reads: list[bytes], closed: bool) -> _Parsed:
    """Fills p.body_reads and p.complete from all the reads so far (head included), given p's head.
    Returns p. Called again as more reads arrive: the head is parsed once per response."""
    if p.chunked:
        fast = _dechunk_reads(reads, p.header_end)
        if fast is not None:
            p.body_reads, p.complete = fast
            return p
    raw = b"".join(reads)
    # Per-read body slices of the raw (still framed) body.
    offsets: Offsets = []
    pos = 0
    for r in reads:
        offsets.append((pos, pos + len(r)))
        pos += len(r)
    owner: list[tuple[int, int]] | None
    if p.chunked:
        body, owner, p.complete = _dechunk(raw, p.header_end, offsets)
    else:
        body = raw[p.header_end:]
        if p.length is not None:
            body = body[:p.length]
            p.complete = len(body) == p.length
        else:
            p.complete = closed
            p.keep_alive = False
        owner = None
    p.body_reads = _split_by_read(body, owner, offsets, p.header_end) if owner is not None else \
        _split_plain(raw, p.header_end, len(body), offsets)
    return p


def _dechunk_reads(reads: list[bytes], header_end: int) -> tuple[list[bytes], bool] | None:
    """De-chunks read by read, without joining: the common case (every chunk-size line inside one read,
    the stream ended by its zero chunk and the CRLF after it). Same result as _dechunk + _split_by_read;
    None for anything else (unfinished stream, a size line split across reads), which takes that path."""
    out = [b""] * len(reads)
    start, skip = 0, header_end
    while start < len(reads) and skip >= len(reads[start]):  # the read where the body starts
        skip -= len(reads[start])
        start += 1
    need = 0   # data bytes of the current chunk still to come
    gap = 0    # bytes of the CRLF after a chunk's data still to skip (not checked, as in _dechunk)
    sizes = _SIZES
    for i in range(start, len(reads)):
        r = reads[i]
        n = len(r)
        if not (need or gap or skip):
            # The usual read: exactly one whole non-empty chunk, its size line a known bare size.
            nl = r.find(b"\r\n")
            size = sizes.get(r[:nl]) if nl > 0 else None
            if size and nl + size + 4 == n:
                out[i] = r[nl + 2:n - 2]
                continue
        pos, pieces = skip, []
        skip = 0
        while pos < n:
            if need:
                take = min(need, n - pos)
                pieces.append(r[pos:pos + take])
                pos += take
                need -= take
                if not need:
                    gap = 2
            elif gap:
                take = min(gap, n - pos)
                pos += take
                gap -= take
            else:
                nl = r.find(b"\r\n", pos)
                if nl < 0:
                    return None
                line = r[pos:nl]
                need = sizes.get(line, -1)
                if need < 0:
                    if _HEX.fullmatch(line):  # a bare size: no extension, no blanks
                        need = int(line, 16)
                        if len(sizes) < _SIZES_MAX:
                            sizes[line] = need
                    else:
                        size_text = line.split(b";", 1)[0].strip()
                        if not _HEX.fullmatch(size_text):
                            raise TransportError(ErrorKind.BAD_RESPONSE, f"bad chunk size line {line[:40]!r}")
                        need = int(size_text, 16)
                if need == 0:
                    if r.find(b"\r\n", nl + 2) < 0:
                        return None
                    if pieces:
                        out[i] = pieces[0] if len(pieces) == 1 else b"".join(pieces)
                    return out, True
                pos = nl + 2
                end = pos + need
                if end + 2 <= n:  # the whole chunk and its CRLF in this read: one step
                    pieces.append(r[pos:end])
                    pos, need = end + 2, 0
        if pieces:
            out[i] = pieces[0] if len(pieces) == 1 else b"".join(pieces)
    return None


def _dechunk(raw: bytes, start: int, offsets: Offsets) -> tuple[bytes, list[tuple[int, int]], bool]:
    # Returns the payload, and for each payload piece its (raw start, length) to map it back to reads.
    pieces: list[bytes] = []
    owner: list[tuple[int, int]] = []
    pos = start
    while True:
        nl = raw.find(b"\r\n", pos)
        if nl < 0:
            return b"".join(pieces), owner, False
        size_text = raw[pos:nl].split(b";", 1)[0].strip()
        if not _HEX.fullmatch(size_text):
            raise TransportError(ErrorKind.BAD_RESPONSE, f"bad chunk size line {raw[pos:nl][:40]!r}")
        size = int(size_text, 16)
        if size == 0:
            return b"".join(pieces), owner, raw.find(b"\r\n", nl + 2) >= 0
        data_start = nl + 2
        if data_start + size + 2 > len(raw):
            got = raw[data_start:]
            pieces.append(got)
            owner.append((data_start, len(got)))
            return b"".join(pieces), owner, False
        pieces.append(raw[data_start:data_start + size])
        owner.append((data_start, size))
        pos = data_start + size + 2


def _split_by_read(body: bytes, owner: list[tuple[int, int]], offsets: Offsets, header_end: int) -> list[bytes]:
    # Payload bytes belong to the read whose raw byte range holds them.
    out = [bytearray() for _ in offsets]
    bpos = 0
    i = 0
    for raw_start, n in owner:
        while n:
            while offsets[i][1] <= raw_start:
                i += 1
            take = min(n, offsets[i][1] - raw_start)
            out[i] += body[bpos:bpos + take]
            bpos += take
            raw_start += take
            n -= take
    return [bytes(b) for b in out]


def _split_plain(raw: bytes, header_end: int, body_len: int, offsets: Offsets) -> list[bytes]:
    end = header_end + body_len
    return [raw[max(a, header_end):min(b, end)] if b > header_end and a < end else b"" for a, b in offsets]


class _Response:
    def __init__(self, conn: _Conn, parsed: _Parsed):
        self.status = parsed.status
        self._conn, self._parsed = conn, parsed
        self.error: TransportError | None = None  # set when the body was cut short (received() keeps the part)
        conn.wake_any = not parsed.chunked

    async def _complete(self) -> _Parsed:
        # The head is parsed once (in request()); the body is parsed again only after a wake-up, i.e.
        # (chunked) on a read that ends with the end mark, or when the connection closed.
        conn, p = self._conn, self._parsed
        while not p.complete:
            if conn.too_large:
                raise TransportError(ErrorKind.RESPONSE_TOO_LARGE, f"the response exceeded {conn.limit} bytes")
            if conn.cut_reached:  # checked before a complete parse: the stream ends exactly at its point
                raise TransportError(ErrorKind.ABANDONED, "closed by the client after its planned number of "
                                                          "tokens, as planned")
            if conn.closed:
                p = parse_body(p, conn.data, True)
                if not p.complete and (p.chunked or p.length is not None):
                    raise TransportError(ErrorKind.RESET, f"connection closed mid-body ({conn.lost!r})")
                break
            conn.done = asyncio.get_running_loop().create_future()
            await conn.done
            if len(conn.data) > OFFLOAD_READS:  # a long body: parsed off the loop (runner.in_worker)
                p = await in_worker(parse_body, p, list(conn.data), conn.closed)
            else:
                p = parse_body(p, conn.data, conn.closed)
        return p

    async def stamped(self) -> tuple[array[int], list[bytes]]:
        # The reads were stamped in the protocol callback (the hot path); here they are only parsed.
        try:
            p = await self._complete()
        except TransportError as e:
            self.error = e
            raise
        body = p.body_reads  # one per read, b"" for a read without payload (the head, framing only)
        return array("q", compress(self._conn.t, body)), list(compress(body, body))

    def received(self) -> tuple[array[int], list[bytes]]:
        """The body read so far with its stamps, without waiting: what a request cut off by its timeout
        or by SIGINT/SIGTERM had already received (its tokens and first-token time are kept)."""
        try:
            p = parse_response(self._conn.data, True) or self._parsed
        except TransportError:
            p = self._parsed
        body = p.body_reads[:len(self._conn.t)]
        return array("q", compress(self._conn.t, body)), list(compress(body, body))

    async def read(self) -> bytes:
        return b"".join((await self.stamped())[1])


# connect(protocol_factory, host, port) -> (transport, protocol): the loop's create_connection, or a test's
Connect = Callable[[Callable[[], _Conn], str, int], Awaitable[tuple[asyncio.BaseTransport, _Conn]]]


class RawHttpTransport:
    """now_ns: the clock every stamp is read from (the run's clock); connect(protocol_factory, host, port)
    opens a connection (default: the loop's create_connection; tests script the network instead)."""
    max_response_bytes = MAX_RESPONSE_BYTES

    def __init__(self, base_url: str, headers: dict[str, str] | None = None, *,
                 now_ns: Callable[[], int] = time.monotonic_ns, connect: Connect | None = None):
        self.now_ns = now_ns
        self._connect = connect
        u = urlsplit(base_url.rstrip("/").removesuffix("/v1"))
        if u.scheme != "http":
            raise ValueError("RawHttpTransport speaks plain http:// only")
        self.host, self.port = u.hostname or "127.0.0.1", u.port or 80
        self.prefix = u.path.rstrip("/")
        self.base_url = f"http://{self.host}:{self.port}{self.prefix}"
        hdrs = {"Host": f"{self.host}:{self.port}", **(headers or {})}
        self._fixed = "".join(f"{k}: {v}\r\n" for k, v in hdrs.items())
        self._idle: list[_Conn] = []
        self._all: set[_Conn] = set()

    async def __aenter__(self) -> "RawHttpTransport":
        return self

    async def __aexit__(self, *exc: object) -> None:
        for c in list(self._all):
            if c.transport is not None:
                c.transport.close()
        self._idle.clear()

    async def warm(self, timeout_s: float = 2.0) -> None:
        try:
            async with asyncio.timeout(timeout_s):
                async with self.request("GET", "/v1/models", {}, b"", None) as resp:
                    await resp.read()
        except (TransportError, OSError, TimeoutError, ValueError):
            pass

    def post(self, path: str, headers: dict[str, str], body: bytes, row: Row) -> _Exchange:
        return _Exchange(self, "POST", path, headers, body, row)

    def request(self, method: str, path: str, headers: dict[str, str], body: bytes, row: Row | None) -> _Exchange:
        return _Exchange(self, method, path, headers, body, row)

    def _ready(self) -> _Conn | None:
        """An idle connection the server has not closed yet, or None."""
        idle = self._idle
        while idle:
            c = idle.pop()   # the most recently used first: the pool keeps its freshest connections busy
            if c.closed:
                continue
            if self.now_ns() - c.idle_since_ns >= IDLE_EXPIRY_NS:
                for old in (c, *idle):  # expired, and every connection under it in the pool is older
                    self._release(old, False)
                idle.clear()
                break
            if _unread(c):
                self._release(c, False)
                continue
            return c
        return None

    async def _connection(self) -> _Conn:
        if (c := self._ready()) is not None:
            return c
        try:
            connect: Connect = self._connect or asyncio.get_running_loop().create_connection
            _, conn = await connect(lambda: _Conn(self.max_response_bytes, self.now_ns), self.host, self.port)
        except OSError as e:
            raise TransportError(ErrorKind.CONNECT_FAILED, f"{type(e).__name__}: {e}") from None
        self._all.add(conn)
        return conn

    def _release(self, conn: _Conn, reusable: bool) -> None:
        conn.done = None
        if reusable:
            conn.idle_since_ns = self.now_ns()
            self._idle.append(conn)
        else:
            self._all.discard(conn)
            if conn.transport is not None:
                conn.transport.close()


def _unread(conn: _Conn) -> bool:
    """Whether the kernel holds something unread on an idle connection: the server's FIN (or stray bytes).
    A starved loop runs the dispatch (the clock's callback) before it reads the FIN that closed a kept-alive
    connection, and its idle time, counted from when the loop got to the last response, can be seconds short
    of the server's: a request written then is lost before its head (beside two CPU burners, once, against
    vLLM). One poll(2) with no wait, per reuse; a scripted transport has no socket."""
    sock = conn.transport.get_extra_info("socket")
    if sock is None:
        return False
    p = select.poll()
    p.register(sock.fileno(), select.POLLIN)
    return bool(p.poll(0))


class _Exchange:
    """One request and its response on one connection. `async with` yields the _Response once its head
    is in; on exit the connection is kept for reuse when the response was read to its end and may be kept
    alive, else closed (also on any exception). A class rather than an @asynccontextmanager generator:
    it runs once per request, and the generator's machinery cost more than the rest of this."""
    __slots__ = ("tr", "method", "path", "headers", "body", "row", "conn", "resp")
    conn: _Conn        # set by __aenter__; __aexit__ runs only after it succeeded
    resp: _Response

    def __init__(self, tr: RawHttpTransport, method: str, path: str, headers: dict[str, str], body: bytes,
                 row: Row | None):
        self.tr, self.method, self.path, self.headers, self.body, self.row = tr, method, path, headers, body, row
        self.conn = None  # type: ignore[assignment]  # until __aenter__
        self.resp = None  # type: ignore[assignment]

    def start(self) -> None:
        # At the request's due time (the runner's clock callback): written now on a ready connection, in the
        # loop pass the clock fired in; with none ready, __aenter__ connects and writes
        conn = self.tr._ready()
        if conn is None:
            return
        self.conn = conn
        try:
            self._write(conn)
        except BaseException:   # (an unencodable header: refused up front) raised again by __aenter__
            self.conn = None  # type: ignore[assignment]
            self.tr._release(conn, False)

    def _write(self, conn: _Conn) -> None:
        tr, row = self.tr, self.row
        if row is not None:
            row.connected_ns = tr.now_ns()
        conn.t, conn.data, conn.wake_any, conn.size = [], [], True, 0
        cut = row.cut if row is not None else None
        conn.cut_reached = False
        conn.cut_events, conn.cut_mark = cut if cut is not None else (0, b"\n\n")
        extra = "".join([f"{k}: {v}\r\n" for k, v in self.headers.items()])
        conn.transport.write(f"{self.method} {tr.prefix}{self.path} HTTP/1.1\r\n{tr._fixed}{extra}"
                             f"Content-Length: {len(self.body)}\r\n\r\n".encode("latin-1") + self.body)
        if row is not None:
            row.sent_ns = tr.now_ns()

    async def __aenter__(self) -> _Response:
        tr, row = self.tr, self.row
        conn = self.conn
        written = conn is not None   # by start()
        if not written:
            conn = self.conn = await tr._connection()
        try:
            if not written:
                self._write(conn)
            parsed = None
            while parsed is None:
                raw = b"".join(conn.data)  # usually one read: the same bytes object, no copy
                if conn.size > MAX_HEAD_BYTES and b"\r\n\r\n" not in raw:
                    raise TransportError(ErrorKind.BAD_RESPONSE, f"response head longer than {MAX_HEAD_BYTES} bytes")
                if conn.closed:
                    raise TransportError(ErrorKind.RESET, f"connection closed before the response head ({conn.lost!r})")
                conn.done = asyncio.get_running_loop().create_future()
                if not raw or b"\r\n\r\n" not in raw:
                    await conn.done
                    raw = b"".join(conn.data)
                parsed = parse_head(raw)
            # The body that came with the head: a short response may be complete already. A chunked one
            # is complete only once a read ends with the end mark (the waiter wakes on nothing else but a
            # close), so until then its body is left unparsed (body_reads empty, complete False).
            if not parsed.chunked or conn.closed or conn.data[-1].endswith(_END_CHUNKED):
                parsed = parse_body(parsed, conn.data, conn.closed)
            if row is not None:
                row.response_ns = conn.t[0] if len(conn.t) else tr.now_ns()
        except BaseException:
            tr._release(conn, False)
            raise
        self.resp = _Response(conn, parsed)
        return self.resp

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        conn, resp, reusable = self.conn, self.resp, False
        try:
            if exc_type is None and resp.error is None:
                p = await resp._complete()
                reusable = p.complete and p.keep_alive and not conn.closed
        finally:
            self.tr._release(conn, reusable)


if TYPE_CHECKING:  # the type checker holds RawHttpTransport to the contract (no runtime cost)
    def _is_transport(t: RawHttpTransport) -> Transport:
        return t
