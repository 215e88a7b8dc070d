"""Test doubles: a virtual-time event loop and a byte-scripted HTTP transport (no sockets, no sleeps).

VirtualTimeLoop: asyncio's selector loop whose clock only moves when nothing is ready: the selector
polls real file descriptors without blocking, then jumps time to the next timer. So `asyncio.sleep(1)`
returns at once with loop.time() exactly 1 s later, and every schedule runs exactly as planned.
"""
from __future__ import annotations

import asyncio
import selectors
from array import array
from collections.abc import Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from loadgen.client.transport import SendsWhenEntered, TransportError


class _JumpingSelector(selectors.DefaultSelector):
    def __init__(self):
        super().__init__()
        self.now_ns = 0

    def select(self, timeout=None):
        ready = super().select(0)
        if not ready:
            if timeout is None:
                raise RuntimeError("virtual-time loop would wait forever: nothing scheduled")
            # Round to the nearest ns: asyncio fires timers within its clock resolution (1 ns) of due.
            self.now_ns += max(0, round(timeout * 1e9))
        return ready


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    def __init__(self):
        self._jumping = _JumpingSelector()
        super().__init__(selector=self._jumping)

    def time(self) -> float:
        return self._jumping.now_ns / 1e9


def run_virtual(coro):
    loop = VirtualTimeLoop()
    try:
        return loop.run_until_complete(coro)
    finally:
        loop.close()


@dataclass
class Script:
    """What the scripted server does for one request: wait `headers_s`, answer `status`, then send
    each (delay_s, bytes) in turn; `fail` raises a TransportError(kind) after the last step."""
    steps: list[tuple[float, bytes]] = field(default_factory=list)
    status: int = 200
    headers_s: float = 0.0
    fail: str | None = None


class _Response:
    # The transport.Response contract: reads stamped with the loop's (virtual) time as they land.
    def __init__(self, script: Script):
        self.status, self._script = script.status, script
        self._t, self._data = array("q"), []

    async def read(self) -> bytes:
        return b"".join(data for _, data in self._script.steps)

    async def stamped(self):
        loop = asyncio.get_running_loop()
        for delay_s, data in self._script.steps:
            if delay_s:
                await asyncio.sleep(delay_s)
            self._t.append(round(loop.time() * 1e9))
            self._data.append(data)
        if self._script.fail:
            raise TransportError(self._script.fail, "scripted failure")
        return self._t, self._data

    def received(self):
        return array("q", self._t), list(self._data)


class ScriptedTransport:
    def __init__(self, script_for: Callable[[str], Script]):
        self.script_for = script_for  # request_id -> Script
        self.requests: list[tuple[str, dict, bytes]] = []

    def post(self, path: str, headers: dict, body: bytes, row):
        return SendsWhenEntered(self._post(path, headers, body, row))

    @asynccontextmanager
    async def _post(self, path: str, headers: dict, body: bytes, row):
        self.requests.append((path, headers, body))
        loop = asyncio.get_running_loop()
        row.connected_ns = row.sent_ns = round(loop.time() * 1e9)
        script = self.script_for(headers["X-Request-Id"])
        if script.headers_s:
            await asyncio.sleep(script.headers_s)
        row.response_ns = round(loop.time() * 1e9)
        yield _Response(script)


def sse(*payloads: bytes | str) -> bytes:
    return b"".join(b"data: " + (p.encode() if isinstance(p, str) else p) + b"\n\n" for p in payloads)


def completion_stream(n_tokens: int, ttft_s: float, itl_s: float, *, usage: bool = True) -> Script:
    """A /v1/completions stream: first token after ttft_s, then one every itl_s, usage, [DONE]."""
    steps = [(ttft_s if i == 0 else itl_s, sse(f'{{"choices":[{{"index":0,"text":"w{i} ","finish_reason":'
                                              f'{"null" if i < n_tokens - 1 else chr(34) + "length" + chr(34)}}}]}}'))
             for i in range(n_tokens)]
    tail = b""
    if usage:
        tail += sse(f'{{"choices":[],"usage":{{"prompt_tokens":8,"completion_tokens":{n_tokens}}}}}')
    steps.append((0.0, tail + sse("[DONE]")))
    return Script(steps)


class ScriptedNetwork:
    """A socket-free network for rawhttp.RawHttpTransport (pass `connect=net.connect`): every request
    written to a connection is answered by `answer(request_bytes)`, a list of (delay_s, bytes) deliveries
    relative to the write, where bytes None closes the connection. Delays run on the (virtual-time)
    loop, so each read lands at an exact, known time."""

    def __init__(self, answer: Callable[[bytes], list[tuple[float, bytes | None]]]):
        self.answer = answer
        self.requests: list[bytes] = []
        self.connections = 0

    async def connect(self, factory, host, port):
        protocol = factory()
        transport = _ScriptedSocket(self, protocol)
        self.connections += 1
        protocol.connection_made(transport)
        return transport, protocol


class _ScriptedSocket(asyncio.Transport):
    def __init__(self, net: ScriptedNetwork, protocol: asyncio.Protocol):
        super().__init__()
        self.net, self.protocol, self.closed = net, protocol, False

    def write(self, data: bytes) -> None:
        self.net.requests.append(bytes(data))
        loop = asyncio.get_running_loop()
        for delay_s, payload in self.net.answer(bytes(data)):
            if payload is None:
                loop.call_later(delay_s, self.close)
            else:
                loop.call_later(delay_s, self._deliver, payload)

    def _deliver(self, payload: bytes) -> None:
        if not self.closed:
            self.protocol.data_received(payload)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            asyncio.get_running_loop().call_soon(self.protocol.connection_lost, None)

    def is_closing(self) -> bool:
        return self.closed
