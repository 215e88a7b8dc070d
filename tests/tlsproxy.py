"""A TLS-terminating reverse proxy for tests: loadgen -> https://127.0.0.1:PORT (a self-signed
certificate for 127.0.0.1) -> an upstream http:// server (the simulator).

`self_signed(folder)` makes the certificate and key with the openssl command line (cert.pem, key.pem;
subjectAltName IP:127.0.0.1, so a client that verifies against cert.pem as its CA accepts it).
`TlsProxy(upstream_url, cert, key, required_header=("X-Check", "1"))` answers 403 to any request that
lacks the header, forwards the others (streamed: each upstream read is written on at once), and records
every request as (method, path, had the header) in `seen`. Its own event loop runs in a daemon thread;
`close()` stops it. Nothing leaves loopback.
"""
from __future__ import annotations

import asyncio
import ssl
import subprocess
import threading
from pathlib import Path

import aiohttp
from aiohttp import web

_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "host", "content-encoding"}


def self_signed(folder: Path) -> tuple[Path, Path]:
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key),
                    "-out", str(cert), "-days", "2", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1"], check=True, capture_output=True)
    return cert, key


class TlsProxy:
    def __init__(self, upstream_url: str, cert: Path, key: Path,
                 required_header: tuple[str, str] | None = ("X-Check", "1")):
        self.upstream = upstream_url.rstrip("/")
        self.required = required_header
        self.seen: list[tuple[str, str, bool]] = []
        self._ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self._ctx.load_cert_chain(cert, key)
        self.loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._main, daemon=True)
        self._thread.start()
        if not self._ready.wait(20):
            raise RuntimeError("the TLS proxy did not start")
        self.url = f"https://127.0.0.1:{self.port}"

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_until_complete(self._start())
        self._ready.set()
        self.loop.run_forever()

    async def _start(self) -> None:
        self.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120))
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0, ssl_context=self._ctx)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        ok = self.required is None or request.headers.get(self.required[0]) == self.required[1]
        self.seen.append((request.method, request.path, ok))
        if not ok:
            return web.Response(status=403, text=f"missing header {self.required[0]}")
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP}
        async with self.session.request(request.method, self.upstream + request.path_qs, data=body or None,
                                        headers=headers, auto_decompress=False) as up:
            resp = web.StreamResponse(status=up.status, headers={k: v for k, v in up.headers.items()
                                                                 if k.lower() not in _HOP})
            await resp.prepare(request)
            async for chunk in up.content.iter_any():
                await resp.write(chunk)
            await resp.write_eof()
            return resp

    def paths(self, ok: bool | None = None) -> set[str]:
        return {p for _, p, had in list(self.seen) if ok is None or had == ok}

    def close(self) -> None:
        async def stop() -> None:
            await self.runner.cleanup()
            await self.session.close()
        asyncio.run_coroutine_threadsafe(stop(), self.loop).result(20)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(20)

    def __enter__(self) -> TlsProxy:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
