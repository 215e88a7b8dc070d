"""TimerfdClock with several concurrent waiters (the dispatch loop plus session-turn timers). It only
checks order and that nobody returns early or hangs; no wall-clock thresholds."""
import asyncio
import sys
import time

import pytest

from loadgen.client.clock import TimerfdClock

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="timerfd is Linux-only")


def test_concurrent_waiters_all_wake_in_deadline_order_never_early():
    async def main():
        clock = TimerfdClock(spin_ns=50_000)
        # The deadlines start 200 ms ahead so that every waiter is registered before its deadline even on a
        # starved host (the ordering claim is about waiters that wait; `late` records any that could not).
        t0 = time.monotonic_ns() + 200_000_000
        order, early, late = [], [], []

        async def wait(i, d_ns):
            if time.monotonic_ns() >= t0 + d_ns:
                late.append(i)
            await clock.sleep_until(t0 + d_ns)
            if time.monotonic_ns() < t0 + d_ns:
                early.append(i)
            order.append(i)

        # registered out of order: a later-registered earlier deadline must re-arm the timer
        deadlines = {0: 30_000_000, 1: 10_000_000, 2: 20_000_000, 3: 5_000_000, 4: 25_000_000}
        waiter = asyncio.create_task(wait(9, 40_000_000))
        cancelled = asyncio.create_task(clock.sleep_until(t0 + 15_000_000))
        await asyncio.sleep(0)
        cancelled.cancel()
        await asyncio.wait_for(asyncio.gather(waiter, *(wait(i, d) for i, d in deadlines.items())), 10)
        clock.close()
        return order, early, late

    order, early, late = asyncio.run(main())
    assert early == []
    assert [i for i in order if i not in late] == [i for i in [3, 1, 2, 4, 0, 9] if i not in late]


def test_calls_run_from_the_timers_own_callback_in_deadline_order_never_early():
    # call_at (the runner's dispatch): each callback runs in the loop pass the timerfd fires in, at or after
    # its deadline; calls and sleeping tasks share the one timer; a cancelled call never runs; a call may
    # schedule the next (as the runner's _due does), an overdue one runs in the same pass
    async def main():
        clock = TimerfdClock(spin_ns=50_000)
        t0 = time.monotonic_ns() + 200_000_000
        ran, early = [], []
        done = asyncio.get_running_loop().create_future()

        def call(name, d_ns, then=None):
            def fn():
                if time.monotonic_ns() < t0 + d_ns:
                    early.append(name)
                ran.append(name)
                if then:
                    clock.call_at(t0 + then[1], call(*then))
                if name == "last":
                    done.set_result(None)
            return fn

        clock.call_at(t0 + 30_000_000, call("c", 30_000_000, ("last", 35_000_000)))
        clock.call_at(t0 + 10_000_000, call("a", 10_000_000, ("overdue", 0)))
        clock.call_at(t0 + 20_000_000, call("b", 20_000_000)).cancel()
        sleeper = asyncio.create_task(clock.sleep_until(t0 + 25_000_000))
        await asyncio.wait_for(asyncio.gather(done, sleeper), 10)
        clock.close()
        return ran, early

    ran, early = asyncio.run(main())
    assert early == [] and ran == ["a", "overdue", "c", "last"]
