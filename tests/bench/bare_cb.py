"""The bare client, dispatching from its timer's own callback: what a structural change to loadgen's dispatch
would gain, measured (issue 29 part 3; docs/scale-out.md).

    python -m tests.bench.bare_cb URL RATE_PER_S DURATION_S TOKENS OUT.json [SEED]   (bench_fast client bare-cb)

bare_client.py in every respect (protocol, schedule, pool, output) but one: there, a timer resolves the
dispatcher's sleep, the dispatcher resumes in the next loop pass and creates the request's task, and that
task writes in the pass after; each pass first handles every ready read. Here the timerfd's reader callback
writes every due request itself on a pooled connection, in the pass the timer fires in (a request that finds
the pool empty opens a connection in a task, as bare_client.py does).
"""
from __future__ import annotations

import asyncio
import os
import time

from loadgen.client.clock import TimerfdClock
from tests.bench.bare_client import Conn, cli, prepare, write_out


async def main(url: str, rate: float, duration_s: float, tokens: int, out: str, seed: int = 1) -> None:
    loop, host, port, offsets, body, pool = await prepare(url, rate, duration_s, tokens, seed)
    # loadgen's TimerfdClock (its timerfd, 1 µs of timer slack, its absolute arming), read by a callback of
    # our own that writes, instead of its sleep_until's futures
    clock = TimerfdClock()
    reqs = []
    tasks = []
    pending_connects = []
    head = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: "
            + str(len(body)).encode() + b"\r\nX-Request-Id: ")

    def write(conn, i, intended):
        rid = f"bare-{i:06d}"
        req = [rid, intended, [], [], loop.create_future(), 0]
        conn.req = req
        conn.transport.write(head + rid.encode() + b"\r\n\r\n" + body)
        req[5] = time.monotonic_ns()
        reqs.append(req)
        tasks.append(req[4])

    async def via_new_connection(i, intended):
        _, conn = await loop.create_connection(lambda: Conn(pool), host, port)
        write(conn, i, intended)

    t0 = time.monotonic_ns() + 100_000_000
    due = (t0 + offsets).tolist()
    state = {"k": 0}

    def fired():
        try:
            os.read(clock._fd, 8)
        except BlockingIOError:
            pass
        now = time.monotonic_ns()
        k = state["k"]
        while k < len(due) and due[k] <= now:
            if pool:
                write(pool.pop(), k, due[k])
            else:
                pending_connects.append(asyncio.ensure_future(via_new_connection(k, due[k])))
            k += 1
        state["k"] = k
        if k < len(due):
            clock._arm(due[k])
        else:
            done.set_result(None)

    done = loop.create_future()
    loop.add_reader(clock._fd, fired)
    cpu0 = os.times()
    clock._arm(due[0])
    await done
    await asyncio.gather(*pending_connects)
    await asyncio.wait(tasks, timeout=30)
    cpu1 = os.times()
    loop.remove_reader(clock._fd)
    clock.close()
    write_out(out, reqs, cpu0, cpu1)


if __name__ == "__main__":
    cli(main)
