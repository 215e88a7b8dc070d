"""`loadgen sim --processes N`: N simulator processes behind one port (SO_REUSEPORT), so that a capacity
test is not bound by one simulator core.

The parent binds the port first (SO_REUSEPORT, never listening: it only holds the port, so `--port 0`
learns its number and nothing else can take it meanwhile), then starts N children: each is `loadgen sim`
with the same flags, told its index, the port and the shared t0 in the environment (CHILD_ENV). Each
child listens on that port with SO_REUSEPORT; the kernel spreads connections over the listeners. The
parent prints the usual `listening on http://HOST:PORT` once every child has printed its own.

Fixed mode only: a request's timing there depends on nothing else, so any split is exact. Engine mode's
batch is one shared state; N processes would be N independent engines (cli.py refuses it, exit 2).

Truth: the children append rows to the one journal (truth.py TruthWriter shared=True); the parent
creates it before they start and, for .parquet, writes the parquet file once they have all exited. Each
row carries `sim_process`. /metrics is per process: a scrape reports the process its connection reached.

Stop: SIGTERM/SIGINT to the parent relays SIGTERM to each child by PID (SIGKILL after 10 s), then the
truth is finished; exit 0. A child that exits on its own is reported on stderr, the others are stopped,
the truth is finished, and the parent exits 1 (or the child's code if it never started listening).
Children run in their own sessions (a terminal's Ctrl-C reaches only the parent) and die with it
(PR_SET_PDEATHSIG).
"""
from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
import time

import orjson

from loadgen.sim.process import _die_with_parent

CHILD_ENV = "LOADGEN_SIM_CHILD"  # {"index", "port", "t0_ns"}: set for a child by the parent only
STOP_TIMEOUT_S = 10.0


def child_config() -> dict | None:
    text = os.environ.get(CHILD_ENV)
    return orjson.loads(text) if text else None


def reserve_port(host: str, port: int) -> socket.socket:
    # Bound with SO_REUSEPORT but not listening: the children's listeners join its port.
    family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind(addr)
    except OSError:
        sock.close()
        raise
    return sock


async def run_parent(argv: list[str], host: str, port: int, n: int) -> int:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    t0_ns = time.monotonic_ns()  # CLOCK_MONOTONIC is one clock for every process of the host
    procs = []
    for i in range(n):
        env = {**os.environ, CHILD_ENV: orjson.dumps({"index": i, "port": port, "t0_ns": t0_ns}).decode()}
        procs.append(await asyncio.create_subprocess_exec(
            sys.executable, "-m", "loadgen", "sim", *argv, env=env, stdout=asyncio.subprocess.PIPE,
            start_new_session=True, preexec_fn=_die_with_parent(os.getpid())))
    waits = {loop.create_task(p.wait()): i for i, p in enumerate(procs)}
    stop_wait = loop.create_task(stop.wait())
    banners = asyncio.ensure_future(asyncio.gather(*[_banner(p) for p in procs]))
    # until every child listens: a stop, a child that exits, or all banners
    done, _ = await asyncio.wait({stop_wait, banners, *waits}, return_when=asyncio.FIRST_COMPLETED)
    code = 0
    listening = banners in done and all(banners.result())
    if listening:
        print(f"listening on http://{host}:{port}", flush=True)
        done, _ = await asyncio.wait({stop_wait, *waits}, return_when=asyncio.FIRST_COMPLETED)
    if stop_wait not in done:  # a child exited on its own
        await asyncio.wait(set(waits), timeout=1.0, return_when=asyncio.FIRST_COMPLETED)
        await asyncio.sleep(0.05)  # let exits that happened together be seen, to report them all
        for task, i in waits.items():
            if task.done():
                rc = task.result()
                print(f"loadgen sim: process {i} (pid {procs[i].pid}) exited with code {rc}", file=sys.stderr)
                code = code or (rc if rc and not listening else 1)
        code = code or 1
    banners.cancel()
    stop_wait.cancel()
    for p in procs:
        if p.returncode is None:
            try:
                os.kill(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    for task, i in waits.items():
        try:
            rc = await asyncio.wait_for(asyncio.shield(task), STOP_TIMEOUT_S)
        except asyncio.TimeoutError:
            print(f"loadgen sim: process {i} (pid {procs[i].pid}) did not stop in {STOP_TIMEOUT_S:g}s: "
                  "killed", file=sys.stderr)
            os.kill(procs[i].pid, signal.SIGKILL)
            rc = await task
        if rc and code == 0:
            print(f"loadgen sim: process {i} (pid {procs[i].pid}) exited with code {rc}", file=sys.stderr)
            code = 1
    return code


async def _banner(proc) -> bool:
    # True once the child printed `listening on ...`; False if its stdout closed first (it exited).
    while True:
        line = await proc.stdout.readline()
        if not line:
            return False
        if line.startswith(b"listening on "):
            return True
