"""Defect 1: a request cut off mid-stream keeps the tokens it had received, with the raw
transport as with aiohttp. A loopback server sends the head and 3 token events, then stalls forever."""
from __future__ import annotations

import asyncio

import pytest

from loadgen.client.backends.openai import OpenAIBackend
from loadgen.client.clock import make_clock
from loadgen.client.rawhttp import RawHttpTransport
from loadgen.client.recorder import INTERRUPTED, TIMEOUT, Recorder, Row
from loadgen.client.runner import Runner
from loadgen.client.transport import AiohttpTransport

HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


def _chunk(payload: bytes) -> bytes:
    return f"{len(payload):x}\r\n".encode() + payload + b"\r\n"


def _event(i: int) -> bytes:
    return _chunk(b'data: {"choices":[{"index":0,"text":"w%d ","finish_reason":null}]}\n\n' % i)


async def _stalling_server(sent: asyncio.Event):
    async def handle(reader, writer):
        await reader.readuntil(b"\r\n\r\n")
        writer.write(HEAD)
        for i in range(3):
            writer.write(_event(i))
            await writer.drain()
            await asyncio.sleep(0.01)
        sent.set()
        await asyncio.sleep(3600)  # stalls: never finishes the body

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


async def _one_request(make_transport, cut: str) -> Row:
    sent = asyncio.Event()
    server, port = await _stalling_server(sent)
    clock = make_clock()
    row = Row(0, "r-0", clock.now_ns(), 8, 16)
    backend = OpenAIBackend("completions", "m", {})
    stop = asyncio.Event()
    async with server:
        async with make_transport(f"http://127.0.0.1:{port}", {}) as transport:
            runner = Runner([row], [backend.body("hi", 16)], backend, transport, clock, Recorder([row]),
                            # 2 s: well after the 3 events, on a busy host too
                            request_timeout_ns=(2 * 10**9 if cut == "timeout" else 3600 * 10**9),
                            drain_timeout_ns=3600 * 10**9)
            task = asyncio.create_task(runner.run(stop))
            if cut == "interrupt":
                await sent.wait()
                await asyncio.sleep(0.05)
                stop.set()
            await task
        server.close()
    clock.close()
    return row


@pytest.mark.parametrize("make_transport", [RawHttpTransport, AiohttpTransport], ids=["raw", "aiohttp"])
@pytest.mark.parametrize("cut, outcome", [("timeout", TIMEOUT), ("interrupt", INTERRUPTED)])
def test_cut_off_request_keeps_received_tokens(make_transport, cut, outcome):
    row = asyncio.run(_one_request(make_transport, cut))
    assert row.outcome == outcome
    assert row.n_chunks == 3 and list(row.chunk_tokens) == [1, 1, 1]
    assert row.first_token_ns is not None and row.first_token_ns <= row.last_token_ns <= row.done_ns


async def _endless(head: bytes, piece: bytes, limit: int) -> Row:
    async def handle(reader, writer):
        await reader.readuntil(b"\r\n\r\n")
        writer.write(head)
        try:
            while True:  # a body (or head) that never ends
                writer.write(piece)
                await writer.drain()
        except (ConnectionError, OSError):
            pass

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    clock = make_clock()
    row = Row(0, "r-0", clock.now_ns(), 8, 16)
    backend = OpenAIBackend("completions", "m", {})
    async with server:
        transport = RawHttpTransport(f"http://127.0.0.1:{port}", {})
        transport.max_response_bytes = limit
        async with transport:
            runner = Runner([row], [backend.body("hi", 16)], backend, transport, clock, Recorder([row]),
                            request_timeout_ns=3600 * 10**9, drain_timeout_ns=3600 * 10**9)
            await runner.run(asyncio.Event())
        server.close()
    clock.close()
    return row


def test_an_endless_body_is_cut_off_with_a_named_error_and_its_tokens_kept():
    row = asyncio.run(_endless(HEAD, _event(1) * 50, 1 << 20))
    assert row.outcome == "connection_error" and row.error_kind == "response_too_large"
    assert row.n_chunks > 1000


def test_an_endless_head_is_a_bad_response():
    row = asyncio.run(_endless(b"HTTP/1.1 200 OK\r\nX-Pad: ", b"a" * 4096, 1 << 20))
    assert row.outcome == "connection_error" and row.error_kind == "bad_response"
    assert "head longer than" in row.error_detail
