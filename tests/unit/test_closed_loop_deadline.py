"""The closed loop bounded by a duration (client/closedloop.py, deadline_ns) under a virtual clock and a
scripted server: exact times, no sockets, no sleeps. Each scripted request takes 80 ms (50 ms to the first
of 4 tokens, 10 ms apart)."""
import asyncio

from loadgen.client.backends.openai import OpenAIBackend
from loadgen.client.clock import LoopClock
from loadgen.client.closedloop import ClosedLoopRunner
from loadgen.client.recorder import CANCELLED, INTERRUPTED, OK, TIMEOUT, Recorder, Row
from tests.scripted import ScriptedTransport, completion_stream, run_virtual

MS = 1_000_000
SECOND = 1_000 * MS


def run(pool: int, *, users: int, deadline_ns: int, think_ns: int = 0, script=None, stop_after_s=None, **kw):
    rows = [Row(i, f"r{i}", 0, 8, 4) for i in range(pool)]

    async def main():
        stop = asyncio.Event()
        if stop_after_s is not None:
            asyncio.get_running_loop().call_later(stop_after_s, stop.set)
        transport = ScriptedTransport(script or (lambda rid: completion_stream(4, 0.05, 0.01)))
        runner = ClosedLoopRunner(rows, [b"{}"] * pool, OpenAIBackend("completions", "m", {}), transport,
                                  LoopClock(), Recorder(rows), users=users, think_ns=think_ns,
                                  deadline_ns=deadline_ns, **kw)
        return await runner.run(stop), runner
    status, runner = run_virtual(main())
    reached = [r for r in rows if r.outcome is not None]
    return status, runner, reached


def test_users_send_until_the_deadline_and_the_rest_of_the_pool_is_not_the_runs():
    status, runner, reached = run(100, users=2, deadline_ns=SECOND)
    assert status == "complete"
    # each user sends at 0, 80, ..., 960 ms: 13 requests; the one due at 1040 ms is never taken
    assert len(reached) == 26 and all(r.outcome == OK for r in reached)
    assert max(r.dispatched_ns for r in reached) == 960 * MS <= SECOND
    # the users took rows in plan order: the run's are the first 26, the other 74 yield no row
    assert [r.idx for r in reached] == list(range(26))
    assert [r.idx for r in runner.unreached()] == list(range(26, 100))
    assert all(r.outcome is None and r.dispatched_ns is None for r in runner.unreached())
    assert runner.exhausted_ns is None


def test_a_think_time_that_ends_past_the_deadline_stops_the_user():
    # 80 ms of service + 150 ms of thinking: sends at 0, 230, 460, 690, 920; the next would be due at 1150
    status, runner, reached = run(50, users=1, deadline_ns=SECOND, think_ns=150 * MS)
    assert status == "complete"
    assert [r.intended_ns // MS for r in reached] == [0, 230, 460, 690, 920]
    assert all(r.dispatched_ns == r.intended_ns for r in reached)
    assert len(runner.unreached()) == 45


def test_a_pool_used_up_before_the_deadline_is_recorded():
    status, runner, reached = run(6, users=2, deadline_ns=10 * SECOND)
    assert status == "complete" and len(reached) == 6 and runner.unreached() == []
    # the third request of each user ends at 240 ms: the pool is empty, far before the deadline
    assert runner.exhausted_ns == 240 * MS


def test_requests_in_flight_at_the_deadline_finish_within_the_drain_timeout():
    # the second request (sent at 80 ms) hangs: the deadline at 500 ms starts the 300 ms drain
    def script(rid):
        return completion_stream(4, 30.0 if rid == "r1" else 0.05, 0.01)
    status, runner, reached = run(100, users=1, deadline_ns=500 * MS, drain_timeout_ns=300 * MS, script=script)
    assert status == "complete"
    assert [r.outcome for r in reached] == [OK, TIMEOUT] and reached[1].error_kind == "drain_timeout"
    assert reached[1].done_ns == 800 * MS


def test_a_stop_cancels_rows_waiting_for_their_think_time_and_leaves_the_pool_out():
    # stopped at 100 ms: user 0's second row is taken (due at 80 + 200 ms) but not sent: cancelled
    status, runner, reached = run(100, users=2, deadline_ns=SECOND, think_ns=200 * MS, stop_after_s=0.1,
                                  script=lambda rid: completion_stream(4, 0.05 if rid == "r0" else 1.0, 0.01))
    assert status == "interrupted"
    assert [(r.idx, r.outcome) for r in reached] == [(0, OK), (1, INTERRUPTED), (2, CANCELLED)]
    assert [r.idx for r in runner.unreached()] == list(range(3, 100))


def test_a_killed_duration_loop_says_it_does_not_know_how_many_it_scheduled():
    # its manifest, written at t0, has schedule.requests null: the count is known only at the end
    from loadgen.analysis.completeness import reason
    text = reason({"status": "running", "planned": None, "found": 12, "missing": None, "last_recorded_s": 1.5,
                   "alive": False, "write_error": None, "workers": None})
    assert "12 requests have a row" in text and "not known" in text and "None" not in text
