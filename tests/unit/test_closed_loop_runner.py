"""ClosedLoopRunner (loadgen/client/closedloop.py) under the virtual clock and a byte-scripted server: exact
timing of N users, think time, failures freeing their user, and the stop signal."""
import asyncio

from loadgen.client.backends.openai import OpenAIBackend
from loadgen.client.clock import LoopClock
from loadgen.client.closedloop import ClosedLoopRunner
from loadgen.client.recorder import CANCELLED, HTTP_ERROR, OK, Recorder, Row
from tests.scripted import Script, ScriptedTransport, completion_stream, run_virtual

MS = 1_000_000


def run(n_rows, users, script_for, think_ns=0, stop_after_s=None):
    rows = [Row(i, f"r{i}", 0, 8, 4) for i in range(n_rows)]  # all due at t0 in the plan

    async def main():
        stop = asyncio.Event()
        if stop_after_s is not None:
            asyncio.get_running_loop().call_later(stop_after_s, stop.set)
        runner = ClosedLoopRunner(rows, [b"{}"] * n_rows, OpenAIBackend("completions", "m", {}),
                                  ScriptedTransport(script_for), LoopClock(), Recorder(rows),
                                  users=users, think_ns=think_ns)
        return await runner.run(stop)
    return run_virtual(main()), rows


def each_takes(first_s=0.05, gap_s=0.01):
    return lambda rid: completion_stream(4, first_s, gap_s)  # 50 ms to the first token, 3 gaps of 10 ms


def test_n_users_each_send_when_their_previous_reply_ends():
    status, rows = run(9, 3, each_takes())
    assert status == "complete" and all(r.outcome == OK for r in rows)
    # 3 waves of 3: each request takes 80 ms, so wave k is due at k * 80 ms (to the clock's resolution)
    waves = [[round(r.intended_ns / MS) for r in rows[k:k + 3]] for k in (0, 3, 6)]
    assert waves == [[0, 0, 0], [80, 80, 80], [160, 160, 160]], waves
    # the generator was never late, and no request waited for a slot
    assert all(r.dispatched_ns == r.intended_ns and r.slot_wait_ns == 0 for r in rows)


def test_think_time_delays_each_users_next_request():
    status, rows = run(4, 2, each_takes(), think_ns=500 * MS)
    assert status == "complete"
    assert [round(r.intended_ns / MS) for r in rows] == [0, 0, 580, 580]
    assert rows[2].intended_ns - rows[0].done_ns == 500 * MS


def test_a_failed_request_frees_its_user_too():
    def script(rid):
        return Script([(0.0, b"oops")], status=500) if rid == "r0" else completion_stream(4, 0.05, 0.01)
    status, rows = run(3, 1, script)
    assert [r.outcome for r in rows] == [HTTP_ERROR, OK, OK]
    assert rows[1].intended_ns == rows[0].done_ns


def test_stop_cancels_the_requests_no_user_has_taken():
    status, rows = run(10, 2, each_takes(), stop_after_s=0.1)
    assert status == "interrupted"
    assert [r.outcome for r in rows[4:]] == [CANCELLED] * 6  # every row still gets exactly one outcome
    assert all(r.outcome is not None for r in rows)
