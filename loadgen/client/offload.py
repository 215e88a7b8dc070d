"""End-of-stream work that is too long for the event loop.

Parsing a long stream after it ends (rawhttp's de-chunking, a backend's interpretation) costs ~0.3 s of
CPU for a 32k-token reply. On the loop that time would hold every other stream's reads back, so their
stamps, and their TTFT and ITL, would be late (measured: up to 180 ms, tests/integration/
test_long_context.py). Streams with more than OFFLOAD_READS reads are therefore parsed in the default
thread pool: the worker holds the GIL one switch interval at a time (run/inprocess.py lowers it for the run),
so the loop keeps stamping reads meanwhile.
"""
from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TypeVar

_T = TypeVar("_T")

OFFLOAD_READS = 2048


async def in_worker(fn: Callable[..., _T], *args: object) -> _T:
    """fn(*args) in the default thread pool. A cancel waits for fn to finish (never a half-filled row),
    then goes on."""
    work = asyncio.get_running_loop().run_in_executor(None, fn, *args)
    try:
        return await asyncio.shield(work)
    except asyncio.CancelledError:
        await work
        raise
