"""One process's measured run (inprocess.measure) on a fresh uvloop event loop, to its end, from any caller:
from the main thread of a command as it always ran, or from inside a running event loop (a Jupyter kernel
runs each cell inside its own, where a second loop cannot run on the same thread) on a thread of its own.

On the caller's thread the run's loop handles SIGINT and SIGTERM (inprocess.measure); the handlers the
process had before are put back after it (uvloop leaves its own, bound to the closed loop: a Ctrl-C after
a run of a script or between a sweep's points would be swallowed). On its own thread the run has no
signal handlers (Python allows them only on the main thread): a
KeyboardInterrupt of the waiting caller (Ctrl-C, the notebook's "interrupt kernel") stops it as SIGINT
does, and the run ends `interrupted` with a complete folder; a second one while it ends is raised.
"""
from __future__ import annotations

import asyncio
import signal
import threading

import uvloop

from loadgen.run.inprocess import Job, Measured, measure

JOIN_STEP_S = 0.1   # how soon the waiting caller sees a KeyboardInterrupt


def run_job(job: Job) -> Measured:
    try:
        asyncio.get_running_loop()
    except RuntimeError:  # no loop on this thread: the run's own loop here, as a command runs
        return _here(job)
    return _on_a_thread(job)


def _here(job: Job) -> Measured:
    main = threading.current_thread() is threading.main_thread()
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)} if main else {}
    try:
        return asyncio.Runner(loop_factory=uvloop.new_event_loop).run(measure(job))
    finally:
        for sig, handler in before.items():
            if handler is not None:  # None: set outside Python, not ours to put back
                signal.signal(sig, handler)


class _Stop:
    """Sets the run's stop event from another thread, also when asked before the run's loop exists."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._asked = False
        self._bound: tuple[asyncio.AbstractEventLoop, asyncio.Event] | None = None

    def bind(self, loop: asyncio.AbstractEventLoop, event: asyncio.Event) -> None:
        with self._lock:
            self._bound = (loop, event)
            if self._asked:
                event.set()

    def ask(self) -> None:
        with self._lock:
            self._asked = True
            if self._bound is not None:
                loop, event = self._bound
                loop.call_soon_threadsafe(event.set)


def _on_a_thread(job: Job) -> Measured:
    stop = _Stop()
    job.on_loop = stop.bind
    done: dict[str, Measured | BaseException] = {}
    finished = threading.Event()

    def target() -> None:
        try:
            done["measured"] = asyncio.Runner(loop_factory=uvloop.new_event_loop).run(measure(job))
        except BaseException as e:  # raised in the caller's thread below
            done["error"] = e
        finally:
            finished.set()

    thread = threading.Thread(target=target, name="loadgen-run")
    thread.start()
    try:
        # An Event, in steps: the kernel may deliver SIGINT to the run's thread, and a blocked wait would not
        # see it until the run ended (woken every step, this thread runs Python's handler); and not
        # Thread.join, which an interrupt can leave believing the thread ended (Python 3.11's
        # _wait_for_tstate_lock releases the lock the running thread holds).
        while not finished.wait(JOIN_STEP_S):
            pass
    except KeyboardInterrupt:
        stop.ask()
        finished.wait()
    thread.join()
    error = done.get("error")
    if isinstance(error, BaseException):
        raise error
    measured = done["measured"]
    assert isinstance(measured, Measured)
    return measured
