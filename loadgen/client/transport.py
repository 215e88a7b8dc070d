"""HTTP transports: the contract the runner talks to (Transport, Response) and the aiohttp one (for https;
rawhttp.RawHttpTransport is the default for http://; tests script their own).

Transport.post(path, headers, body, row) is an Exchange: an async context manager yielding a Response,
with start(), which the runner calls at the request's due time, in the clock's own callback: a transport
that can writes the request there and then (rawhttp, on a ready connection), before the loop handles
another socket; the others write when the exchange is entered, from the request's task. While it runs,
the transport stamps, on the clock it was given (now_ns), `row.connected_ns` (a connection was ready,
new or reused), `row.sent_ns` (request fully written) and `row.response_ns` (the response head arrived).
Failures raise TransportError(kind, detail).
"""
from __future__ import annotations

import asyncio
import os
import time
from array import array
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from ssl import SSLContext
from types import SimpleNamespace, TracebackType
from typing import TYPE_CHECKING, Protocol, Self

import aiohttp

from loadgen.errors import TransportError as TransportError  # raised here; importable from here too
from loadgen.client.recorder import ErrorKind, Row


FD_TABLE_MAX = 65536  # descriptors grow_fd_table reserves at most (the kernel's table: ~8 bytes each)


def grow_fd_table(fds: int | None = None) -> int:
    """Grow this process's descriptor table now to hold `fds` descriptors (default: the soft RLIMIT_NOFILE, at
    most FD_TABLE_MAX); returns the size asked, 0 where it could not.

    Why: Linux grows the table when a new descriptor passes its size (64, then powers of two: 256, 512, ...),
    and in a process with threads it then waits an RCU grace period inside that socket() or accept()
    (fs/file.c expand_fdtable: synchronize_rcu), with the GIL held. Measured at 800 req/s on this 2-core VM:
    the whole client stalled 13-17 ms when the 256th descriptor opened, ~0.28 s after t0, in every run and in
    the bare client too. The table never shrinks: grown once before t0, the wait is out of the measured
    window. Descriptors are not opened: F_DUPFD takes the lowest free one at or above the size and it is
    closed at once (dup2 would close a descriptor in use there)."""
    try:
        import fcntl
        import resource
    except ImportError:  # not a POSIX host
        return 0
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    limit = FD_TABLE_MAX if soft == resource.RLIM_INFINITY else min(soft, FD_TABLE_MAX)
    size = min(fds or limit, limit)
    if size < 2:
        return 0
    try:
        probe = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return 0
    try:
        os.close(fcntl.fcntl(probe, fcntl.F_DUPFD_CLOEXEC, size - 1))
    except OSError:   # every descriptor up to the limit in use, or a limit lowered meanwhile: nothing grown
        return 0
    finally:
        os.close(probe)
    return size


class Response(Protocol):
    status: int

    async def read(self) -> bytes:
        """The whole body (error responses)."""

    async def stamped(self) -> tuple[array[int], list[bytes]]:
        """The whole body as it arrived: each read, and the clock reading taken when it landed (the
        transport's hot path: one clock read and two appends per read; parsing comes later). Raises
        TransportError when the body is cut short; received() still holds what arrived."""

    def received(self) -> tuple[array[int], list[bytes]]:
        """What arrived so far, stamped, without waiting: a request cut off by its timeout or by
        SIGINT/SIGTERM keeps its tokens and first-token time."""


class Exchange(Protocol):
    async def __aenter__(self) -> Response: ...

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> bool | None: ...

    def start(self) -> None:
        """Write the request now if a connection is ready, else leave it to __aenter__ (which connects); never
        raises: a failure is raised by __aenter__, in the request's task."""


class SendsWhenEntered:
    """An Exchange over any async context manager: it writes when entered (start() does nothing)."""
    __slots__ = ("_cm",)

    def __init__(self, cm: AbstractAsyncContextManager[Response]):
        self._cm = cm

    def start(self) -> None:
        pass

    async def __aenter__(self) -> Response:
        return await self._cm.__aenter__()

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> bool | None:
        return await self._cm.__aexit__(exc_type, exc, tb)


class Transport(Protocol):
    def post(self, path: str, headers: dict[str, str], body: bytes, row: Row) -> Exchange: ...

    async def warm(self, timeout_s: float = 2.0) -> None:
        """Before t0: open a connection and run first-request code paths; failures are ignored."""

    async def __aenter__(self) -> Self: ...

    async def __aexit__(self, *exc: object) -> None: ...


class _Response:
    __slots__ = ("_resp", "status", "_now", "_t", "_data", "_cut")

    def __init__(self, resp: aiohttp.ClientResponse, now_ns: Callable[[], int], cut: tuple[int, bytes] | None):
        self.status, self._resp, self._now = resp.status, resp, now_ns
        self._t: array[int] = array("q")
        self._data: list[bytes] = []
        self._cut = cut  # Row.cut: (events, their end mark) after which the client closes the stream

    async def read(self) -> bytes:
        return await self._resp.read()

    async def stamped(self) -> tuple[array[int], list[bytes]]:
        # aiohttp stamps a read when this task resumes (after the loop dispatched every other ready
        # socket), not in the protocol callback as rawhttp does: see rawhttp.py.
        now, t, data = self._now, self._t, self._data
        if self._cut is None:
            async for chunk in self._resp.content.iter_any():
                t.append(now())
                data.append(chunk)
            return t, data
        left, mark = self._cut
        async for chunk in self._resp.content.iter_any():
            t.append(now())
            data.append(chunk)
            left -= chunk.count(mark)
            if left <= 0:
                raise TransportError(ErrorKind.ABANDONED, "closed by the client after its planned number of tokens, "
                                                          "as planned")
        return t, data

    def received(self) -> tuple[array[int], list[bytes]]:
        return array("q", self._t), list(self._data)


# An idle connection is reused only this soon after its last response. Servers close idle keep-alive
# connections (vLLM and SGLang through uvicorn, llama-server through cpp-httplib: 5 s); one the server is
# closing while a request is written on it fails that request (reset before the response head), a client
# artifact a report would blame on the server. Below their 5 s, that race needs a FIN over a second late.
IDLE_EXPIRY_NS = 4_000_000_000


class AiohttpTransport:
    """One session for the whole run. The connector has NO connection limit (aiohttp's default of 100
    would queue requests silently inside the client) and keeps connections alive, for IDLE_EXPIRY_NS at most."""

    def __init__(self, base_url: str, headers: dict[str, str] | None = None, tls: bool | SSLContext = True, *,
                 now_ns: Callable[[], int] = time.monotonic_ns):
        self.now_ns = now_ns
        self.base_url = base_url.rstrip("/").removesuffix("/v1")
        self._headers = headers or {}
        self._tls = tls  # aiohttp's ssl=: True verifies, False does not, or an SSLContext (--ca-bundle)
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> AiohttpTransport:
        if self._session is not None:  # already open (run/inprocess.py opens it early to warm it)
            return self
        now = self.now_ns

        # aiohttp trace hooks; trace_request_ctx is the Row of the request.
        async def connected(_session: aiohttp.ClientSession, ctx: SimpleNamespace, _params: object) -> None:
            if ctx.trace_request_ctx is not None:
                ctx.trace_request_ctx.connected_ns = now()

        async def sent(_session: aiohttp.ClientSession, ctx: SimpleNamespace, _params: object) -> None:
            # Fired for the headers and then for each body chunk: the last one is "fully written".
            if ctx.trace_request_ctx is not None:
                ctx.trace_request_ctx.sent_ns = now()

        trace = aiohttp.TraceConfig()
        trace.on_connection_create_end.append(connected)
        trace.on_connection_reuseconn.append(connected)
        trace.on_request_headers_sent.append(sent)
        trace.on_request_chunk_sent.append(sent)
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, limit_per_host=0, ssl=self._tls,
                                           keepalive_timeout=IDLE_EXPIRY_NS / 1e9),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=None, sock_read=None),
            trace_configs=[trace],
            headers=self._headers,
            auto_decompress=False,
        )
        return self

    async def warm(self, timeout_s: float = 2.0) -> None:
        """One GET /v1/models before the run: resolves the host, runs aiohttp's first-request code paths
        (lazy imports, DNS cache) and leaves one kept-alive connection. Failures are ignored: the run's
        own rows will say what is wrong with the server."""
        assert self._session is not None
        try:
            async with asyncio.timeout(timeout_s):
                async with self._session.get(self.base_url + "/v1/models") as resp:
                    await resp.read()
        except (aiohttp.ClientError, OSError, TimeoutError, ValueError):
            pass

    async def __aexit__(self, *exc: object) -> None:
        if self._session is not None:
            await self._session.close()

    def post(self, path: str, headers: dict[str, str], body: bytes, row: Row) -> Exchange:
        return SendsWhenEntered(self._post(path, headers, body, row))  # aiohttp writes from the request's task

    @asynccontextmanager
    async def _post(self, path: str, headers: dict[str, str], body: bytes, row: Row) -> AsyncIterator[_Response]:
        assert self._session is not None
        try:
            async with self._session.post(self.base_url + path, data=body, headers=headers,
                                          trace_request_ctx=row) as resp:
                if row is not None:
                    row.response_ns = self.now_ns()
                yield _Response(resp, self.now_ns, row.cut if row is not None else None)
        except aiohttp.ClientConnectorError as e:
            raise TransportError(ErrorKind.CONNECT_FAILED, str(e)) from None
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError,
                aiohttp.ClientOSError, ConnectionResetError) as e:
            raise TransportError(ErrorKind.RESET, f"{type(e).__name__}: {e}") from None
        except aiohttp.ClientResponseError as e:
            raise TransportError(ErrorKind.BAD_RESPONSE, str(e)) from None
        except aiohttp.ClientError as e:
            raise TransportError(ErrorKind.CLIENT_ERROR, f"{type(e).__name__}: {e}") from None
        except asyncio.IncompleteReadError as e:
            raise TransportError(ErrorKind.RESET, str(e)) from None


if TYPE_CHECKING:  # the type checker holds AiohttpTransport to the contract (no runtime cost)
    def _is_transport(t: AiohttpTransport) -> Transport:
        return t
