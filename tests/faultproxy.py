"""A fault-injecting TCP proxy for tests: loadgen -> proxy (127.0.0.1, port 0) -> upstream (the simulator).

Faults apply to the response direction (server -> client), per connection:
    latency_s, jitter_s   each read from upstream is delivered latency + U(0, jitter) after it arrived
                          (order kept)
    bytes_per_s           bandwidth cap
    trickle_s             one byte per trickle_s (a server that trickles), written TRICKLE_BYTES at a time (one
                          byte a write cost the proxy's loop 12,000 wake-ups a second for 12 streams: beside
                          two CPU burners it fell seconds behind and delivered no event at all to some)
    reset_after           after this many response bytes the connection is reset (RST, SO_LINGER 0)
    half_open             accept and read the request, never answer, never close
It runs its own event loop in a daemon thread; `close()` stops it. Nothing leaves loopback.
"""
from __future__ import annotations

import asyncio
import random
import socket
import struct
import threading
import time


TRICKLE_BYTES = 16


class FaultProxy:
    def __init__(self, upstream_port: int, *, latency_s: float = 0.0, jitter_s: float = 0.0,
                 bytes_per_s: float | None = None, trickle_s: float | None = None,
                 reset_after: int | None = None, half_open: bool = False, seed: int = 0):
        self.upstream_port = upstream_port
        self.latency_s, self.jitter_s, self.bytes_per_s = latency_s, jitter_s, bytes_per_s
        self.trickle_s, self.reset_after, self.half_open = trickle_s, reset_after, half_open
        self.rng = random.Random(seed)
        self.connections = 0
        self.loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._main, daemon=True)
        self._thread.start()
        self._ready.wait(10)
        self.url = f"http://127.0.0.1:{self.port}"

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.server = self.loop.run_until_complete(asyncio.start_server(self._handle, "127.0.0.1", 0))
        self.port = self.server.sockets[0].getsockname()[1]
        self._ready.set()
        self.loop.run_forever()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        if self.half_open:
            while await reader.read(65536):
                pass
            await asyncio.sleep(3600)
            return
        try:
            up_r, up_w = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        except OSError:
            writer.close()
            return
        up = asyncio.ensure_future(self._pump(reader, up_w))
        try:
            await self._down(up_r, writer)
        finally:
            up.cancel()
            up_w.close()

    @staticmethod
    async def _pump(reader, writer) -> None:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
        writer.close()

    async def _down(self, reader, writer) -> None:
        sent = 0
        due = 0.0
        try:
            while data := await reader.read(65536):
                arrived = time.monotonic()
                if self.latency_s or self.jitter_s:
                    due = max(due, arrived + self.latency_s + self.rng.uniform(0, self.jitter_s))
                    await asyncio.sleep(max(0.0, due - time.monotonic()))
                if self.reset_after is not None and sent + len(data) >= self.reset_after:
                    writer.write(data[:self.reset_after - sent])
                    await writer.drain()
                    sock = writer.get_extra_info("socket")
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    writer.transport.abort()  # RST
                    return
                step = (TRICKLE_BYTES if self.trickle_s else
                        max(1, int(self.bytes_per_s / 20)) if self.bytes_per_s else len(data))
                for i in range(0, len(data), step):
                    writer.write(data[i:i + step])
                    await writer.drain()
                    if self.trickle_s:
                        await asyncio.sleep(self.trickle_s * len(data[i:i + step]))
                    elif self.bytes_per_s:
                        await asyncio.sleep(step / self.bytes_per_s)
                sent += len(data)
            writer.close()
        except (ConnectionError, OSError):
            writer.transport.abort()

    def close(self) -> None:
        def stop() -> None:
            self.server.close()
            for task in asyncio.all_tasks(self.loop):
                task.cancel()
            self.loop.call_later(0.05, self.loop.stop)
        self.loop.call_soon_threadsafe(stop)
        self._thread.join(5)

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
