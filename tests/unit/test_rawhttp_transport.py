"""The raw HTTP transport end to end on a scripted network (no sockets) and a virtual clock: each read is
stamped when it lands, the body is split back per read, connections are reused or not as HTTP says, and
a body cut short keeps what arrived. One test on a loopback socket: a FIN the loop has not read yet."""
import asyncio
import socket
import threading
import time

import pytest

from loadgen.client.rawhttp import RawHttpTransport
from loadgen.errors import TransportError
from loadgen.client.recorder import Row
from tests.scripted import ScriptedNetwork, run_virtual

HEAD = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"


def chunk(payload: bytes) -> bytes:
    return f"{len(payload):x}\r\n".encode() + payload + b"\r\n"


EV = [b"data: a\n\n", b"data: bb\n\n", b"data: [DONE]\n\n"]


def exchange(answer, requests=1):
    """Posts `requests` requests one after the other; returns per request (row, status, stamps in ms from
    the loop's start, reads, error kind) and the network."""
    net = ScriptedNetwork(answer)

    async def go():
        loop = asyncio.get_running_loop()
        now_ns = lambda: round(loop.time() * 1e9)  # noqa: E731
        out = []
        async with RawHttpTransport("http://127.0.0.1:9", {}, now_ns=now_ns, connect=net.connect) as t:
            for i in range(requests):
                row = Row(i, f"r{i}", 0, 1, 1)
                async with t.post("/v1/completions", {"X-Request-Id": row.request_id}, b"{}", row) as resp:
                    try:
                        stamps, reads = await resp.stamped()
                        kind = None
                    except TransportError as e:
                        (stamps, reads), kind = resp.received(), e.kind
                    out.append((row, resp.status, [s / 1e6 for s in stamps], reads, kind))
        return out

    return run_virtual(go()), net


@pytest.mark.parametrize("answer, want_reads, want_ms, head_ms, connections", [
    # a chunked stream in three reads (50, 60, 70 ms after the request): each read keeps its own stamp and
    # its de-chunked bytes; keep-alive: the second request reuses the connection
    (lambda req: [(0.05, HEAD + chunk(EV[0])), (0.06, chunk(EV[1])), (0.07, chunk(EV[2]) + b"0\r\n\r\n")],
     EV, [50.0, 60.0, 70.0], 50.0, 1),
    # the head alone first: its read carries no body and is not a read of the body
    (lambda req: [(0.01, HEAD), (0.02, chunk(EV[0]) + chunk(EV[1])), (0.03, chunk(EV[2]) + b"0\r\n\r\n")],
     [EV[0] + EV[1], EV[2]], [20.0, 30.0], 10.0, 1),
    # Content-Length and Connection: close: the connection is not reused
    (lambda req: [(0.01, b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\nConnection: close\r\n\r\ndata"),
                  (0.02, b": a\n\n"), (0.03, None)],
     [b"data", b": a\n\n"], [10.0, 20.0], 10.0, 2),
])
def test_reads_are_stamped_where_they_land(answer, want_reads, want_ms, head_ms, connections):
    results, net = exchange(answer, requests=2)
    for row, status, stamps_ms, reads, kind in results:
        assert status == 200 and kind is None
        assert reads == want_reads
        start_ms = row.sent_ns / 1e6
        assert [round(s - start_ms, 6) for s in stamps_ms] == want_ms
        assert round(row.response_ns / 1e6 - start_ms, 6) == head_ms   # the read that completed the head
    assert net.connections == connections
    assert all(r.startswith(b"POST /v1/completions HTTP/1.1\r\n") for r in net.requests)


def test_a_body_cut_short_is_a_reset_that_keeps_what_arrived():
    # two events arrive, then the peer closes mid-body: stamped() raises a typed error and received()
    # still holds both reads, with their stamps
    results, _ = exchange(lambda req: [(0.05, HEAD + chunk(EV[0])), (0.06, chunk(EV[1])), (0.08, None)])
    row, status, stamps_ms, reads, kind = results[0]
    assert status == 200 and kind == "reset"
    assert reads == EV[:2] and [round(s - row.sent_ns / 1e6, 6) for s in stamps_ms] == [50.0, 60.0]


def test_a_stream_cut_after_n_events_receives_nothing_after_the_read_that_reached_n():
    # [abandon] after_tokens: the read that completes the 2nd event reaches the count. The 3rd event lands in
    # the same loop pass, before the request's task runs (a starved loop): it must not be received (once, an
    # 11-token cut kept a 12th token). The connection is closed in that read's callback.
    events = [b"data: a\n\n", b"data: b\n\n", b"data: c\n\n", b"data: d\n\n"]
    net = ScriptedNetwork(lambda req: [(0.010, HEAD + chunk(events[0])), (0.020, chunk(events[1])),
                                       (0.0200000005, chunk(events[2])), (0.030, chunk(events[3]))])

    async def go():
        loop = asyncio.get_running_loop()
        now_ns = lambda: round(loop.time() * 1e9)  # noqa: E731
        async with RawHttpTransport("http://127.0.0.1:9", {}, now_ns=now_ns, connect=net.connect) as t:
            row = Row(0, "r0", 0, 1, 4)
            row.cut = (2, b"\n\n")
            async with t.post("/v1/completions", {}, b"{}", row) as resp:
                try:
                    await resp.stamped()
                    kind = None
                except TransportError as e:
                    kind = e.kind
                return kind, resp.received()[1], resp._conn.transport.closed

    kind, reads, closed = run_virtual(go())
    assert kind == "abandoned" and reads == events[:2] and closed


@pytest.mark.parametrize("gap_s, connections", [(3.9, 1), (4.1, 2)])
def test_an_idle_connection_is_reused_only_before_servers_close_theirs(gap_s, connections):
    # vLLM (uvicorn) and llama-server (cpp-httplib) close a connection idle for 5 s; a request written on
    # one as it closes fails before the response head. The pool closes its own first, after
    # IDLE_EXPIRY_NS (4 s): the next request then opens a fresh connection, and the stale one is closed.
    net = ScriptedNetwork(lambda req: [(0.01, HEAD + chunk(EV[2]) + b"0\r\n\r\n")])

    async def go():
        loop = asyncio.get_running_loop()
        now_ns = lambda: round(loop.time() * 1e9)  # noqa: E731
        async with RawHttpTransport("http://127.0.0.1:9", {}, now_ns=now_ns, connect=net.connect) as t:
            sockets = []
            for i in range(2):
                if i:
                    await asyncio.sleep(gap_s)
                async with t.post("/v1/completions", {}, b"{}", Row(i, f"r{i}", 0, 1, 1)) as resp:
                    assert (await resp.read()) == EV[2]
                sockets.append(resp._conn.transport)
            return sockets, sockets[0].closed   # before the pool's exit closes every connection

    (first, second), first_closed = run_virtual(go())
    assert net.connections == connections
    assert (first is second) == (connections == 1)
    assert first_closed == (connections == 2)   # the expired one was closed by the client, not left open


def test_start_writes_at_once_on_a_ready_connection_and_entering_waits_for_the_response():
    # The runner calls start() in the clock's own callback, at the request's due time: on a kept-alive
    # connection the request is on the wire before start() returns (no loop pass between); with none ready,
    # start() writes nothing and entering the exchange connects and writes, as before.
    net = ScriptedNetwork(lambda req: [(0.01, HEAD + chunk(EV[2]) + b"0\r\n\r\n")])

    async def go():
        loop = asyncio.get_running_loop()
        now_ns = lambda: round(loop.time() * 1e9)  # noqa: E731
        seen = []
        async with RawHttpTransport("http://127.0.0.1:9", {}, now_ns=now_ns, connect=net.connect) as t:
            for i in range(2):
                row = Row(i, f"r{i}", 0, 1, 1)
                ex = t.post("/v1/completions", {"X-Request-Id": row.request_id}, b"{}", row)
                ex.start()
                seen.append((len(net.requests), row.sent_ns))   # written synchronously, or not at all
                async with ex as resp:
                    assert (await resp.read()) == EV[2]
                assert len(net.requests) == i + 1 and row.sent_ns is not None
        return seen

    seen = run_virtual(go())
    assert seen[0] == (0, None)                    # no connection yet: __aenter__ connected and wrote
    assert seen[1][0] == 2 and seen[1][1] is not None  # the kept-alive one: written inside start()
    assert net.connections == 1 and b"X-Request-Id: r1" in net.requests[1]


def test_a_kept_alive_connection_the_server_closed_unread_is_not_reused():
    # A starved loop runs the dispatch before it reads the FIN of a server that closed an idle kept-alive
    # connection (its idle clock started when it sent the response; the client's when its loop got to it):
    # start() must not write on that connection, but open another. A real loopback socket: the FIN lands in
    # the kernel while the loop is blocked (time.sleep), unread, as on a host that does not run the loop.
    srv = socket.create_server(("127.0.0.1", 0))
    accepted: list[socket.socket] = []
    close_now = threading.Event()

    def serve():
        for _ in range(2):
            c, _ = srv.accept()
            accepted.append(c)
            c.recv(65536)
            c.sendall(HEAD + chunk(EV[2]) + b"0\r\n\r\n")
            if len(accepted) == 1:
                close_now.wait(5)
                c.close()

    threading.Thread(target=serve, daemon=True).start()

    async def go():
        async with RawHttpTransport(f"http://127.0.0.1:{srv.getsockname()[1]}", {}) as t:
            answers = []
            for i in range(2):
                row = Row(i, f"r{i}", 0, 1, 1)
                ex = t.post("/v1/completions", {"X-Request-Id": row.request_id}, b"{}", row)
                ex.start()   # as the runner's _due: in the same callback as what came before
                async with ex as resp:
                    answers.append(await resp.read())
                close_now.set()
                time.sleep(0.2)   # the loop does not run: the server's FIN arrives, unread
            return answers

    try:
        assert asyncio.run(go()) == [EV[2], EV[2]]
        assert len(accepted) == 2   # the second request on a new connection
    finally:
        srv.close()
        for c in accepted:
            c.close()
