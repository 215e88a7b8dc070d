"""HTTP transports. The runner talks to a Transport; aiohttp's is the real one, tests script their own.

Transport.post(path, headers, body, row) is an async context manager yielding a Response with
`status`, `read()` (the whole body) and `reads()` (an async iterator of raw byte reads, as they arrive).
While it runs, the transport stamps `row.connected_ns` (a connection was ready, new or reused) and
`row.sent_ns` (request fully written). Failures raise TransportError(kind, detail).
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiohttp

from loadgen.errors import TransportError  # noqa: F401  (raised here; importable from here too)
from loadgen.recorder import Row


class _Response:
    __slots__ = ("_resp", "status")

    def __init__(self, resp: aiohttp.ClientResponse):
        self.status, self._resp = resp.status, resp

    async def read(self) -> bytes:
        return await self._resp.read()

    def reads(self) -> AsyncIterator[bytes]:
        return self._resp.content.iter_any()


# aiohttp trace hooks; trace_request_ctx is the Row of the request.
async def _stamp_connected(_session, ctx, _params) -> None:
    if ctx.trace_request_ctx is not None:
        ctx.trace_request_ctx.connected_ns = time.monotonic_ns()


async def _stamp_sent(_session, ctx, _params) -> None:
    # Fired for the headers and then for each body chunk: the last one is "fully written".
    if ctx.trace_request_ctx is not None:
        ctx.trace_request_ctx.sent_ns = time.monotonic_ns()


class AiohttpTransport:
    """One session for the whole run. The connector has NO connection limit (aiohttp's default of 100
    would queue requests silently inside the client) and keeps connections alive."""

    def __init__(self, base_url: str, headers: dict[str, str] | None = None, tls=True):
        self.base_url = base_url.rstrip("/").removesuffix("/v1")
        self._headers = headers or {}
        self._tls = tls  # aiohttp's ssl=: True verifies, False does not, or an SSLContext (--ca-bundle)
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> AiohttpTransport:
        if self._session is not None:  # already open (execute.py opens it early to warm it)
            return self
        trace = aiohttp.TraceConfig()
        trace.on_connection_create_end.append(_stamp_connected)
        trace.on_connection_reuseconn.append(_stamp_connected)
        trace.on_request_headers_sent.append(_stamp_sent)
        trace.on_request_chunk_sent.append(_stamp_sent)
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, limit_per_host=0, ssl=self._tls),
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

    async def __aexit__(self, *exc) -> None:
        if self._session is not None:
            await self._session.close()

    @asynccontextmanager
    async def post(self, path: str, headers: dict[str, str], body: bytes, row: Row):
        assert self._session is not None
        try:
            async with self._session.post(self.base_url + path, data=body, headers=headers,
                                          trace_request_ctx=row) as resp:
                yield _Response(resp)
        except aiohttp.ClientConnectorError as e:
            raise TransportError("connect_failed", str(e)) from None
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError,
                aiohttp.ClientOSError, ConnectionResetError) as e:
            raise TransportError("reset", f"{type(e).__name__}: {e}") from None
        except aiohttp.ClientResponseError as e:
            raise TransportError("bad_response", str(e)) from None
        except aiohttp.ClientError as e:
            raise TransportError("client_error", f"{type(e).__name__}: {e}") from None
        except asyncio.IncompleteReadError as e:
            raise TransportError("reset", str(e)) from None
