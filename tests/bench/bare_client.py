"""The bare reference client: the least a streaming client can do, so loadgen's cost is a ratio to it.

    python -m tests.bench.bare_client URL RATE_PER_S DURATION_S TOKENS OUT.json [SEED]

Raw uvloop asyncio.Protocol over kept-alive HTTP/1.1 connections (a free one is reused, else a new one
is opened: no pool limit), the same Poisson schedule as loadgen (numpy seed), the same timerfd dispatch.
Per read: one clock read and two appends; the only other per-read work is an `endswith` to find the end
of the chunked body. Everything else (counting chunks) happens after the run. Before t0 it grows the
descriptor table as loadgen does (client/transport.grow_fd_table): a stall every client can avoid.
Writes per request: id, intended/sent ns, read stamps and per-read token-chunk counts, plus the process
CPU over the run.
"""
from __future__ import annotations

import asyncio
import os
import sys
import time
from urllib.parse import urlsplit

import numpy as np
import orjson
import uvloop

from loadgen.client.clock import TimerfdClock
from loadgen.client.transport import grow_fd_table

END = b"0\r\n\r\n"


class Conn(asyncio.Protocol):
    def __init__(self, pool: list):
        self.pool, self.transport, self.req = pool, None, None

    def connection_made(self, transport):
        self.transport = transport

    def data_received(self, data: bytes):
        req = self.req
        req[2].append(time.monotonic_ns())
        req[3].append(data)
        if data.endswith(END):
            self.req = None
            req[4].set_result(None)
            self.pool.append(self)

    def connection_lost(self, exc):
        if self in self.pool:
            self.pool.remove(self)
        if self.req is not None and not self.req[4].done():
            self.req[4].set_result(None)


async def prepare(url: str, rate: float, duration_s: float, tokens: int, seed: int):
    """What every variant of the bare client sets up before t0: (loop, host, port, Poisson offsets in ns, the
    request body, a pool warmed with a few connections)."""
    u = urlsplit(url)
    host, port = u.hostname, u.port
    loop = asyncio.get_running_loop()
    n = int(rate * duration_s)
    offsets = np.cumsum(np.random.default_rng(seed).exponential(1e9 / rate, n)).astype(np.int64)
    body = orjson.dumps({"model": "m", "prompt": "tok " * 16, "max_tokens": tokens, "stream": True,
                         "stream_options": {"include_usage": True}})
    pool: list[Conn] = []
    grow_fd_table()  # as loadgen does before t0: the kernel's table growth past 256, 512, ... fds stalls a client
    for _ in range(4):  # warm: a few connections before t0
        _, c = await loop.create_connection(lambda: Conn(pool), host, port)
        pool.append(c)
    return loop, host, port, offsets, body, pool


def write_out(out: str, reqs: list, cpu0: os.times_result, cpu1: os.times_result) -> None:
    """The output every variant writes: the process CPU over the run and, per request, its stamps."""
    rows = []
    for rid, intended, stamps, reads, _, sent in reqs:
        rows.append({"request_id": rid, "intended_ns": intended, "sent_ns": sent, "read_ns": stamps,
                     "chunks": [d.count(b'"text":') for d in reads]})
    cpu_s = (cpu1.user - cpu0.user) + (cpu1.system - cpu0.system)
    with open(out, "wb") as f:
        f.write(orjson.dumps({"cpu_s": cpu_s, "requests": rows}))


async def main(url: str, rate: float, duration_s: float, tokens: int, out: str, seed: int = 1) -> None:
    loop, host, port, offsets, body, pool = await prepare(url, rate, duration_s, tokens, seed)
    clock = TimerfdClock()
    reqs = []
    tasks = []

    async def one(i: int, intended: int):
        rid = f"bare-{i:06d}"
        conn = pool.pop() if pool else (await loop.create_connection(lambda: Conn(pool), host, port))[1]
        req = [rid, intended, [], [], loop.create_future(), 0]
        conn.req = req
        req[5] = time.monotonic_ns()
        conn.transport.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                             b"X-Request-Id: " + rid.encode() + b"\r\nContent-Length: "
                             + str(len(body)).encode() + b"\r\n\r\n" + body)
        reqs.append(req)
        await req[4]

    t0 = time.monotonic_ns() + 100_000_000
    cpu0 = os.times()
    for i, off in enumerate(offsets.tolist()):
        await clock.sleep_until(t0 + off)
        tasks.append(asyncio.create_task(one(i, t0 + off)))
    await asyncio.wait(tasks, timeout=30)
    cpu1 = os.times()
    clock.close()
    write_out(out, reqs, cpu0, cpu1)


def cli(main) -> None:
    """`python -m` entry of a bare client: URL RATE_PER_S DURATION_S TOKENS OUT.json [SEED] -> main(...) on uvloop."""
    a = sys.argv[1:]
    asyncio.Runner(loop_factory=uvloop.new_event_loop).run(
        main(a[0], float(a[1]), float(a[2]), int(a[3]), a[4], int(a[5]) if len(a) > 5 else 1))


if __name__ == "__main__":
    cli(main)
