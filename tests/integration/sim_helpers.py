"""Shared helpers for the simulator's integration tests: an aiohttp client that stamps every
SSE event with time.monotonic_ns() (the simulator's clock) as it is read."""
from __future__ import annotations

import asyncio
import time

import aiohttp
import orjson


async def stream_completion(session: aiohttp.ClientSession, url: str, body: dict, *,
                            path: str = "/v1/completions", request_id: str | None = None) -> dict:
    headers = {"X-Request-Id": request_id} if request_id else {}
    sent_ns = time.monotonic_ns()
    events: list[tuple[int, bytes]] = []
    async with session.post(url + path, json=body, headers=headers) as resp:
        status, rid = resp.status, resp.headers.get("X-Request-Id")
        buf = b""
        async for data in resp.content.iter_any():
            t = time.monotonic_ns()
            buf += data
            while b"\n\n" in buf:
                ev, buf = buf.split(b"\n\n", 1)
                events.append((t, ev))
    payloads = []
    for t, ev in events:
        assert ev.startswith(b"data: "), ev
        raw = ev[6:]
        payloads.append((t, raw if raw == b"[DONE]" else orjson.loads(raw)))
    return {"status": status, "request_id": rid, "sent_ns": sent_ns, "events": payloads}


def token_events(result: dict) -> list[tuple[int, str]]:
    # (arrival stamp, text) of each event carrying output text
    out = []
    for t, p in result["events"]:
        if p == b"[DONE]" or not p.get("choices"):
            continue
        c = p["choices"][0]
        text = c.get("text") if "text" in c else c.get("delta", {}).get("content")
        if text:
            out.append((t, text))
    return out


async def worst_timer_lateness_ns(stop) -> int:
    # the most a 1 ms timer of this event loop fired late until `stop` (an asyncio.Event): how late the host
    # let this process (the tests' client) run, as the simulator's lateness_ns says it of the simulator
    worst = 0
    while not stop.is_set():
        due = time.monotonic_ns() + 1_000_000
        await asyncio.sleep(0.001)
        worst = max(worst, time.monotonic_ns() - due)
    return worst
