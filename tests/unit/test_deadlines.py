"""The deadline heap shared by the client's timerfd clock and the simulator's ticker (no clock here)."""
import asyncio

from loadgen.deadlines import DeadlineHeap


def test_waiters_are_released_in_deadline_order_and_cancelled_ones_dropped():
    loop = asyncio.new_event_loop()
    try:
        h = DeadlineHeap()
        late, first = h.add(loop, 300)
        assert first                                  # the only waiter is the earliest
        early, first = h.add(loop, 100)
        assert first                                  # a new earliest: the clock re-arms for it
        mid, first = h.add(loop, 200)
        assert not first
        gone, _ = h.add(loop, 50)
        gone.cancel()
        assert h.earliest() == 100                    # the cancelled waiter at the top is dropped
        assert h.release(199) == 200                  # due by 199: only the 100 ns waiter
        assert early.done() and not mid.done() and not late.done()
        assert h.release(300) is None and mid.done() and late.done()
    finally:
        loop.close()
