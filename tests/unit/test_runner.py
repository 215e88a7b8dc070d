"""The dispatcher under a virtual clock and a byte-scripted server: exact, no sockets, no sleeps."""
import asyncio

import numpy as np

from loadgen.client.backends.openai import OpenAIBackend
from loadgen.client.clock import LoopClock
from loadgen.client.recorder import (ABANDONED, CANCELLED, CONNECTION_ERROR, DROPPED, HTTP_ERROR, INTERRUPTED, OK,
                                     TIMEOUT, Recorder, Row)
from loadgen.client.runner import Runner
from tests.scripted import Script, ScriptedTransport, completion_stream, run_virtual

MS = 1_000_000


def make_rows(offsets_ms: list[float]) -> list[Row]:
    return [Row(i, f"r{i}", round(t * MS), 8, 4) for i, t in enumerate(offsets_ms)]


def run(rows, script_for, *, stop_after_s=None, **kw) -> tuple[str, list[Row]]:
    async def main():
        stop = asyncio.Event()
        if stop_after_s is not None:
            asyncio.get_running_loop().call_later(stop_after_s, stop.set)
        runner = Runner(rows, [b"{}"] * len(rows), OpenAIBackend("completions", "m", {}),
                        ScriptedTransport(script_for), LoopClock(), Recorder(rows), **kw)
        return await runner.run(stop)
    return run_virtual(main()), rows


def stall_first(stall_s: float):
    # Request r0 waits stall_s before its first token; every other request streams 4 tokens normally.
    return lambda rid: completion_stream(4, stall_s if rid == "r0" else 0.05, 0.01)


def ms(row: Row, a: str, b: str) -> float:
    return (getattr(row, b) - getattr(row, a)) / MS


def test_a_stalled_response_does_not_delay_later_dispatches():
    rows = make_rows([i * 100 for i in range(10)])
    status, rows = run(rows, stall_first(1.0))
    assert status == "complete"
    assert [r.dispatched_ns - r.intended_ns for r in rows] == [0] * 10  # open loop: on time, every one
    assert [r.outcome for r in rows] == [OK] * 10
    assert ms(rows[0], "intended_ns", "first_token_ns") == 1000
    assert all(ms(r, "intended_ns", "first_token_ns") == 50 for r in rows[1:])


def test_max_concurrency_makes_coordinated_omission_visible():
    # With one slot, r1..r9 queue behind r0's 1 s stall. Their TTFT from the intended time shows the
    # wait; TTFT from the actual send does not (what a closed-loop tool would report).
    rows = make_rows([i * 100 for i in range(10)])
    status, rows = run(rows, stall_first(1.0), max_concurrency=1)
    assert status == "complete" and all(r.outcome == OK for r in rows)
    r1 = rows[1]
    assert ms(r1, "intended_ns", "first_token_ns") >= 900 + 50     # r0 holds the slot until 1.03 s
    assert ms(r1, "dispatched_ns", "first_token_ns") == 50
    assert r1.slot_wait_ns == r1.dispatched_ns - r1.intended_ns
    ttft = [ms(r, "intended_ns", "first_token_ns") for r in rows[1:]]
    from_send = [ms(r, "dispatched_ns", "first_token_ns") for r in rows[1:]]
    assert min(ttft) > 100 and max(from_send) == 50


def test_requests_still_waiting_for_a_slot_at_the_end_are_dropped():
    rows = make_rows([0, 10, 20])
    status, rows = run(rows, lambda rid: completion_stream(2, 5.0, 0.01), max_concurrency=1,
                       drain_timeout_ns=1000 * MS)
    assert status == "complete"
    assert [r.outcome for r in rows] == [TIMEOUT, DROPPED, DROPPED]
    assert rows[0].error_kind == "drain_timeout"
    assert rows[1].dispatched_ns is None and rows[1].first_token_ns is None


def test_request_timeout():
    rows = make_rows([0, 10])
    status, rows = run(rows, lambda rid: completion_stream(2, 3.0 if rid == "r0" else 0.01, 0.01),
                       request_timeout_ns=1000 * MS)
    assert [r.outcome for r in rows] == [TIMEOUT, OK]
    assert rows[0].error_kind == "request_timeout" and ms(rows[0], "dispatched_ns", "done_ns") == 1000


def test_request_timeouts_of_interleaved_slow_and_fast_requests():
    # One watchdog for all: each slow request is cut off exactly its timeout after its own dispatch, in
    # dispatch order, whatever finished between; the fast ones are untouched; a stream cut off keeps the
    # tokens it had; nothing of the watchdog is left afterwards.
    rows = make_rows([0, 100, 150, 400, 1000, 1100, 2500])
    slow = {"r0": 3.0, "r2": 1.2, "r3": 0.9, "r5": 5.0}

    def script(rid):
        if rid == "r3":  # streams, then stalls: cut off mid-stream
            return Script([(0.1, b'data: {"choices":[{"text":"a"}]}\n\n'), (5.0, b"data: [DONE]\n\n")])
        return completion_stream(2, slow.get(rid, 0.01), 0.01)

    async def main():
        runner = Runner(rows, [b"{}"] * len(rows), OpenAIBackend("completions", "m", {}),
                        ScriptedTransport(script), LoopClock(), Recorder(rows), request_timeout_ns=800 * MS)
        status = await runner.run(asyncio.Event())
        return status, runner
    status, runner = run_virtual(main())
    assert status == "complete"
    assert [r.outcome for r in rows] == [TIMEOUT, OK, TIMEOUT, TIMEOUT, OK, TIMEOUT, OK]
    for r in rows:
        if r.outcome == TIMEOUT:
            assert r.error_kind == "request_timeout" and ms(r, "dispatched_ns", "done_ns") == 800
    assert rows[3].n_chunks == 1
    assert not runner._timed and not runner._expired and runner._watchdog is None


def test_http_error_and_connection_reset_are_rows():
    scripts = {"r0": Script([(0.0, b'{"error":"overloaded"}')], status=503),
               "r1": Script([(0.05, b'data: {"choices":[{"text":"a"}]}\n\n')], fail="reset")}
    status, rows = run(make_rows([0, 1]), scripts.__getitem__)
    assert (rows[0].outcome, rows[0].http_status, rows[0].error_kind) == (HTTP_ERROR, 503, "http_503")
    assert "overloaded" in rows[0].error_detail
    assert (rows[1].outcome, rows[1].error_kind, rows[1].n_chunks) == (CONNECTION_ERROR, "reset", 1)


def test_an_abandonment_already_due_at_dispatch_still_yields_an_abandoned_row():
    # Beside two CPU burners a request's write took 0.9 s inside its dispatch, past its 300-ms abandonment: the
    # runner cancelled its task before the task had run a line, so its body (which gives every row its outcome)
    # never ran, and a complete run held a row with no outcome. An abandonment due at dispatch (0 here) must
    # still end in an abandoned row.
    rows = make_rows([0, 100])
    rows[0].abandon_after_ns = 0
    status, rows = run(rows, lambda rid: completion_stream(4, 0.05, 0.01))
    assert status == "complete" and [r.outcome for r in rows] == [ABANDONED, OK]
    assert rows[0].done_ns is not None and rows[0].error_kind == "abandoned"


def test_stop_interrupts_in_flight_and_cancels_the_rest():
    rows = make_rows([0, 100, 5000, 6000])
    status, rows = run(rows, lambda rid: completion_stream(100, 0.05, 0.01), stop_after_s=0.5)
    assert status == "interrupted"
    assert [r.outcome for r in rows] == [INTERRUPTED, INTERRUPTED, CANCELLED, CANCELLED]
    assert rows[0].n_chunks > 0 and rows[2].dispatched_ns is None


def test_every_row_gets_exactly_one_outcome_and_monotone_times():
    rng = np.random.default_rng(0)
    offsets = np.cumsum(rng.exponential(20, 200))
    status, rows = run(make_rows(list(offsets)), lambda rid: completion_stream(8, 0.03, 0.004))
    for r in rows:
        assert r.outcome == OK
        assert r.intended_ns <= r.dispatched_ns <= r.first_token_ns <= r.last_token_ns <= r.done_ns
