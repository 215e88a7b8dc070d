"""Session turns in the dispatcher: each later turn is sent think time after the previous reply is done,
carrying the history; a failed turn ends its conversation. Virtual clock, scripted server."""
import asyncio
import itertools

import orjson

from loadgen.client.backends.openai import OpenAIBackend
from loadgen.client.clock import LoopClock
from loadgen.client.recorder import DROPPED, HTTP_ERROR, OK, Recorder, Row
from loadgen.client.runner import Runner
from tests.scripted import Script, ScriptedTransport, completion_stream, run_virtual

MS = 1_000_000


def session_rows(starts_ms: list[float], turns: int, think_ms: float) -> list[Row]:
    rows = []
    for s, t0 in enumerate(starts_ms):
        for t in range(turns):
            i = len(rows)
            r = Row(i, f"s{s}t{t}", round(t0 * MS) if t == 0 else None, 8, 4)
            r.session, r.turn = s, t
            if t:
                r.after, r.think_ns = i - 1, round(think_ms * MS)
            rows.append(r)
    return rows


def run(rows, script_for, **kw):
    calls = []

    def next_body(j, prev, reads):
        calls.append((j, prev.request_id, b"".join(reads)))
        return orjson.dumps({"turn": rows[j].turn, "after": prev.request_id}), 100 + j

    async def main():
        runner = Runner(rows, [b"{}"] * len(rows), OpenAIBackend("completions", "m", {}), transport,
                        LoopClock(), Recorder(rows), next_body=next_body, **kw)
        return await runner.run(asyncio.Event())
    transport = ScriptedTransport(script_for)
    return run_virtual(main()), rows, calls, transport


def test_each_turn_is_sent_think_time_after_the_previous_reply():
    # 2 sessions x 3 turns; replies take 50 ms + 3 x 10 ms; think 1 s.
    status, rows, calls, transport = run(session_rows([0, 100], 3, 1000), lambda rid: completion_stream(4, 0.05, 0.01))
    assert status == "complete" and all(r.outcome == OK for r in rows)
    for prev, r in itertools.pairwise(rows):
        if r.turn:
            assert r.intended_ns == prev.done_ns + 1000 * MS
            assert r.dispatched_ns == r.intended_ns  # on time
    assert rows[1].intended_ns == 80 * MS + 1000 * MS
    # the body was rebuilt from the previous turn's reply, and planned_prompt_tokens updated
    assert [c[:2] for c in calls] == [(1, "s0t0"), (4, "s1t0"), (2, "s0t1"), (5, "s1t1")]
    assert b"w0" in calls[0][2]  # the previous reply's raw stream reached the body builder
    sent = {h["X-Request-Id"]: b for _, h, b in transport.requests}
    assert orjson.loads(sent["s0t2"]) == {"turn": 2, "after": "s0t1"} and rows[2].planned_prompt_tokens == 102


def test_a_failed_turn_drops_the_rest_of_its_conversation_only():
    def script(rid):
        if rid == "s0t1":
            return Script([(0.0, b'{"error":"overloaded"}')], status=503)
        return completion_stream(4, 0.05, 0.01)
    status, rows, _, _ = run(session_rows([0, 100], 3, 500), script)
    assert status == "complete"
    assert [r.outcome for r in rows] == [OK, HTTP_ERROR, DROPPED, OK, OK, OK]
    assert rows[2].error_kind == "session_broken" and rows[2].intended_ns is None and rows[2].dispatched_ns is None


def test_stop_during_think_time_cancels_the_later_turns():
    rows = session_rows([0], 3, 5000)

    async def main():
        stop = asyncio.Event()
        asyncio.get_running_loop().call_later(1.0, stop.set)  # s0t0 is done at 80 ms; s0t1 is due at 5.08 s
        runner = Runner(rows, [b"{}"] * 3, OpenAIBackend("completions", "m", {}),
                        ScriptedTransport(lambda rid: completion_stream(4, 0.05, 0.01)), LoopClock(), Recorder(rows),
                        next_body=lambda j, prev, reads: (b"{}", 1))
        return await runner.run(stop)
    assert run_virtual(main()) == "interrupted"
    assert [r.outcome for r in rows] == [OK, "cancelled", "cancelled"] and rows[1].dispatched_ns is None


def test_turns_share_the_concurrency_cap_and_the_drain_waits_for_all_turns():
    # Cap 1: session 1's first turn waits behind session 0's turn 0; the run still completes every turn,
    # although the last turn is dispatched long after the last timed arrival (the drain starts later).
    status, rows, _, _ = run(session_rows([0, 10], 2, 2000), lambda rid: completion_stream(4, 0.05, 0.01),
                             max_concurrency=1, drain_timeout_ns=100 * MS)
    assert status == "complete" and [r.outcome for r in rows] == [OK] * 4
    assert rows[2].slot_wait_ns == 70 * MS  # s1t0 came at 10 ms, s0t0 finished at 80 ms
