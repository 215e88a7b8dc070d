"""Every --faults kind, seen from the client's side of the HTTP connection, and in the truth."""
from __future__ import annotations

import asyncio
import time

import aiohttp
import orjson
import pytest

from loadgen.sim.faults import parse_faults
from loadgen.sim.process import SimProcess
from loadgen.sim.truth import read_truth

SPEC = "http500=0.14,http429=0.14,http503=0.14,reset_after=3:0.14,malformed=0.14,slow_headers=300ms:0.14"
SEED = 11


def ids_by_kind() -> dict[str, str]:
    plan = parse_faults(SPEC, SEED)
    out: dict[str, str] = {}
    for i in range(1000):
        f = plan.for_request(f"f-{i}")
        out.setdefault(f.kind if f else "none", f"f-{i}")
    return out


async def raw_stream(s: aiohttp.ClientSession, url: str, rid: str, n: int = 8) -> dict:
    sent = time.monotonic_ns()
    out = {"events": [], "error": None}
    try:
        async with s.post(url + "/v1/completions", json={"prompt": "a b c", "max_tokens": n, "stream": True},
                          headers={"X-Request-Id": rid}) as r:
            out["headers_ns"] = time.monotonic_ns() - sent
            out["status"] = r.status
            out["request_id"] = r.headers.get("X-Request-Id")
            if r.status != 200:
                out["body"] = await r.json()
                return out
            buf = b""
            async for data in r.content.iter_any():
                buf += data
                while b"\n\n" in buf:
                    ev, buf = buf.split(b"\n\n", 1)
                    out["events"].append(ev[6:])
    except (aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError, aiohttp.ClientOSError,
            ConnectionResetError) as e:
        out["error"] = e
    return out


def token_texts(events: list[bytes]) -> tuple[int, int]:
    ok = bad = 0
    for raw in events:
        if raw == b"[DONE]":
            continue
        try:
            obj = orjson.loads(raw)
        except orjson.JSONDecodeError:
            bad += 1
            continue
        ok += obj["choices"][0]["text"].count("tok ")
    return ok, bad


@pytest.fixture(scope="module")
def faulty(tmp_path_factory):
    truth = tmp_path_factory.mktemp("faults") / "truth.jsonl"
    with SimProcess(args=["--profile", "tiny", "--faults", SPEC, "--seed", str(SEED), "--truth", str(truth)]) as sim:
        ids = ids_by_kind()

        async def go():
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, force_close=True)) as s:
                return dict(zip(ids, await asyncio.gather(*[raw_stream(s, sim.url, rid) for rid in ids.values()])))

        results = asyncio.run(go())
    yield ids, results, {r["request_id"]: r for r in read_truth(truth)}


@pytest.mark.parametrize("kind, status", [("http500", 500), ("http429", 429), ("http503", 503)])
def test_http_error_faults(faulty, kind, status):
    ids, res, truth = faulty
    r = res[kind]
    assert r["status"] == status and r["body"]["code"] == status and r["request_id"] == ids[kind]
    row = truth[ids[kind]]
    assert row["outcome"] == "http_error" and row["http_status"] == status and row["fault"] == kind


def test_reset_after_k_tokens(faulty):
    ids, res, truth = faulty
    r = res["reset_after"]
    assert r["status"] == 200 and r["error"] is not None
    assert token_texts(r["events"]) == (3, 0) and b"[DONE]" not in r["events"]
    row = truth[ids["reset_after"]]
    assert row["outcome"] == "reset" and row["fault"] == "reset_after=3" and len(row["token_ns"]) == 3


def test_malformed_chunk(faulty):
    ids, res, truth = faulty
    r = res["malformed"]
    assert r["status"] == 200 and r["error"] is None
    assert token_texts(r["events"]) == (8, 1) and r["events"][-1] == b"[DONE]"
    assert truth[ids["malformed"]]["fault"] == "malformed"


def test_slow_headers_and_a_clean_request(faulty):
    ids, res, truth = faulty
    assert res["slow_headers"]["headers_ns"] >= 300_000_000
    assert token_texts(res["slow_headers"]["events"]) == (8, 0)
    assert truth[ids["slow_headers"]]["fault"].startswith("slow_headers=")
    # the clean request is not held by the fault (300 ms); margin for a busy host parking the client
    assert res["none"]["headers_ns"] < 250_000_000 and token_texts(res["none"]["events"]) == (8, 0)
    assert truth[ids["none"]]["fault"] == "" and truth[ids["none"]]["outcome"] == "ok"


@pytest.mark.parametrize("mode", ["engine", "fixed"])
def test_engine_stall_is_a_gap_in_every_running_stream(tmp_path, mode):
    truth = tmp_path / "truth.jsonl"
    args = ["--mode", mode, "--faults", "stall=500ms@1s", "--truth", str(truth)]
    args += ["--profile", "tiny", "--speed", "0.5"] if mode == "engine" else ["--ttft", "5ms", "--itl", "3ms"]
    with SimProcess(args=args) as sim:
        async def go():
            async with aiohttp.ClientSession() as s:
                return await asyncio.gather(*[raw_stream(s, sim.url, f"st-{i}", n=800) for i in range(2)])

        asyncio.run(go())
    rows = read_truth(truth)
    assert len(rows) == 2
    for row in rows:
        # due times (send time - lateness): the engine made no token for >= 500 ms
        due = [t - late for t, late in zip(row["token_ns"], row["lateness_ns"])]
        gap = max(b - a for a, b in zip(due, due[1:]))
        assert 500_000_000 <= gap < 520_000_000
        # and the stream carried it: the sent gap is the due gap, moved at most by the host's lateness
        sent_gap = max(b - a for a, b in zip(row["token_ns"], row["token_ns"][1:]))
        late = max(row["lateness_ns"])
        assert gap - late <= sent_gap <= gap + late, (sent_gap, gap, late)
        # stall_ns: the stall, less the part of it the engine spent finishing its step in flight
        assert 490_000_000 <= row["stall_ns"] <= 500_000_000 + 10_000_000
        assert row["fault"] == "stall" and row["outcome"] == "ok"
