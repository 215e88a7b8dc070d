"""The open-loop dispatcher. It executes one slice of a schedule (all of it, in a single process).

Contract:
- rows arrive with `intended_ns` absolute (t0 + the plan's offset) and sorted; `bodies[i]` is row i's body;
- the dispatch runs from the clock's own callback at each row's absolute deadline (Clock.call_at): it
  starts the request there, the transport writing it at once where it can (Exchange.start: rawhttp on a
  ready connection), and its task awaits the response; it never waits for a response, so a slow server
  cannot slow the schedule;
- overdue rows (the loop was busy past their deadline) are started at once, in plan order, never
  skipped or re-spaced: each one's lag is recorded, and selfcheck.py marks the run invalid when the
  lag or the resulting burst (dispatch-gap CV) departs from the plan;
- with max_concurrency > 0, a request whose time has come but finds no free slot waits in a FIFO; it
  starts when a slot frees (`slot_wait_ns` records how long) and is `dropped` if the run ends first.
  Without a cap there is no queue anywhere in the client (the transport has no connection limit);
- a request whose exchange (connect, send, the whole response) is not over `request_timeout_ns` after
  its dispatch is cancelled and recorded as `timeout` (error_kind request_timeout), with what it had
  received. One watchdog timer serves every request: deadlines come in dispatch order (dispatch time +
  one timeout), so it is armed for the oldest one only, instead of a loop timer started and stopped
  per request (asyncio.timeout: ~5 µs a request);
- after the last dispatch, in-flight requests get `drain_timeout_ns`, then they are cut off as
  `timeout` (error_kind drain_timeout);
- a row with an abandonment point ([abandon]) is cut off by the client there, as a user closing the tab:
  `abandon_after_ns` after its dispatch (a loop timer for that row only, armed after the request's task has
  taken its first step: a task cancelled before that never gives its row an outcome), or once the transport has seen
  `abandon_after_tokens` output events (`row.cut`, counted by the transport per read); the row is
  `abandoned` with what it had received. An exchange that ends first is what it is (ok, an error...);
- `stop` (SIGINT/SIGTERM) ends the run at once: in-flight rows become `interrupted`, rows never
  started become `cancelled`. Every row gets exactly one outcome;
- session turns: a row with `after` = the idx of an earlier row is skipped by the dispatch
  loop; when that row finishes ok, this row's body is rebuilt by `next_body(i, prev_row, prev_reads) ->
  (body, planned_prompt_tokens[, tool_round])` (the history; with next_body_blocks, when it asks the server to count
  the messages, it runs in a thread of its own, one turn at a time, never on the event loop; otherwise
  it is quick and runs on the loop), and its intended_ns becomes
  max(done_ns + think_ns, the time its body was ready) (a tool round k >= 1 of an agentic session:
  done_ns + tool_latency_ns, the tool's drawn latency, instead of think_ns; row.tool_round says which,
  row.tool_latency_ns is kept only for a tool round): the client's preparation is never counted in the
  turn's latency, and delays the turn only when it takes longer than the think time (`prepare_ns`
  holds how long each took). It is then dispatched like any other (same concurrency cap). If the
  earlier row failed, or its body could not be built, the rest of the conversation is `dropped`
  (error_kind session_broken). The dispatch phase (and so the drain timer) ends when every turn has
  been dispatched or dropped;
- `rows` is the recorder's list: a finished row's slot may become None once it is flushed
  (Recorder.release), so the runner reads a row from it only while that row is not finished;
- a subclass may hand in more rows than it schedules (a closed loop's pool, closedloop.py): `_in_run`
  says which are the run's, and `unreached()` lists, after the run, those that are not: they have no
  outcome and yield no row (the caller leaves them out of the results).
"""
from __future__ import annotations

import asyncio
from array import array
from concurrent.futures import ThreadPoolExecutor
from collections import deque
from collections.abc import Callable, MutableSequence, Sequence
from typing import Any

from loadgen.client.backends.base import Backend
from loadgen.client.clock import Cancellable, Clock
from loadgen.client.recorder import (ABANDONED, CANCELLED, CONNECTION_ERROR, DROPPED, HTTP_ERROR, INTERRUPTED, OK,
                                     TIMEOUT, ErrorKind, Recorder, Row, http_error_kind)
from loadgen.client.offload import OFFLOAD_READS, in_worker
from loadgen.client.transport import Exchange, Response, Transport, TransportError
from loadgen.config.options import default

# next_body(i, prev_row, prev_reads) -> (row i's body, its planned prompt tokens[, its tool round]): a
# session's next turn; a tool round k >= 1 (an agentic session's request that carries tool results) is due
# its tool_latency_ns after prev_row's end instead of its think_ns (plan/bodies.py next_turn)
NextBody = Callable[[int, Row, list[bytes]], tuple[Any, ...]]


class Runner:
    # rows: the recorder's list (a flushed row's slot may hold None: see the module docstring); bodies[i]
    # is row i's body (a session turn's is rebuilt in place)
    def __init__(self, rows: Sequence[Row], bodies: MutableSequence[bytes], backend: Backend,
                 transport: Transport, clock: Clock, recorder: Recorder, *, max_concurrency: int = 0,
                 request_timeout_ns: int = default("request_timeout_ns"),
                 drain_timeout_ns: int = default("drain_timeout_ns"),
                 headers: dict[str, str] | None = None, next_body: NextBody | None = None,
                 next_body_blocks: bool = False):
        self.rows, self.bodies = rows, bodies
        self.backend, self.transport, self.clock, self.recorder = backend, transport, clock, recorder
        self.max_concurrency = max_concurrency
        self.request_timeout_ns = request_timeout_ns
        self.request_timeout_s = request_timeout_ns / 1e9
        self._timed: dict[asyncio.Task[None], int] = {}  # task -> deadline ns, in dispatch (= deadline) order
        self._expired: set[asyncio.Task[None]] = set()   # cancelled by the watchdog, not yet finished
        self._watchdog: asyncio.TimerHandle | None = None
        self._abandon_at: dict[asyncio.Task[None], asyncio.TimerHandle] = {}  # [abandon] after_ms rows only
        self._abandoned: set[asyncio.Task[None]] = set()  # cut off by their abandonment timer, not yet finished
        self.drain_timeout_s = drain_timeout_ns / 1e9
        self.headers = {"Content-Type": "application/json", **(headers or {})}
        self.in_flight: dict[asyncio.Task[None], Row] = {}
        self.waiting: deque[tuple[int, int]] = deque()  # (row index, ns its time came)
        self.dispatched = 0
        self._dispatch_done = False
        self._next = 0                                 # the next row _due looks at
        self._next_call: Cancellable | None = None     # the clock's call for it
        self._scheduled: asyncio.Future[None] | None = None  # set by _due once every row is started or waits
        self._idle = asyncio.Event()
        self._cut_off_as: tuple[str, str] = (INTERRUPTED, ErrorKind.INTERRUPTED)  # (outcome, error_kind)
        self._sessions_init(next_body, next_body_blocks)

    async def run(self, stop: asyncio.Event) -> str:
        """Returns "complete" or "interrupted"."""
        dispatcher = asyncio.create_task(self._dispatch())
        stopped = asyncio.create_task(stop.wait())
        try:
            await asyncio.wait({dispatcher, stopped}, return_when=asyncio.FIRST_COMPLETED)
            if not stop.is_set():
                dispatcher.result()  # re-raise a bug in the dispatcher rather than hide it
                idle = asyncio.create_task(self._idle.wait())
                await asyncio.wait({idle, stopped}, timeout=self.drain_timeout_s,
                                   return_when=asyncio.FIRST_COMPLETED)
                idle.cancel()
            dispatcher.cancel()
            await asyncio.gather(dispatcher, return_exceptions=True)
            if stop.is_set():
                await self._cut_off(INTERRUPTED, ErrorKind.INTERRUPTED, CANCELLED)
                return "interrupted"
            await self._cut_off(TIMEOUT, ErrorKind.DRAIN_TIMEOUT, DROPPED)
            return "complete"
        finally:
            dispatcher.cancel()
            stopped.cancel()
            if self._prepare is not None:  # a turn being built is abandoned (its row was cut off)
                self._prepare.shutdown(wait=False, cancel_futures=True)
            if self._watchdog is not None:
                self._watchdog.cancel()
                self._watchdog = None
            for timer in self._abandon_at.values():
                timer.cancel()

    async def _dispatch(self) -> None:
        # The rows are started by _due, from the clock's own callback (see there); this task waits for the last
        scheduled = self._scheduled = asyncio.get_running_loop().create_future()
        self._due()
        try:
            await scheduled
        finally:
            if self._next_call is not None:  # cut off: the next row is not started
                self._next_call.cancel()
        await self._turns_dispatched.wait()
        self._dispatch_done = True
        self._check_idle()

    def _due(self) -> None:
        # Starts every row due by now and asks the clock to call again at the next row's time. It runs in the
        # loop pass the clock's timer fired in, so start() writes each request before the loop handles any
        # other ready socket (a task resumed here would write a pass later, after every ready read:
        # docs/scale-out.md measures the difference). A bug here is raised by _dispatch, as it was found.
        self._next_call = None
        rows, clock, cap, i = self.rows, self.clock, self.max_concurrency, self._next
        try:
            now = clock.now_ns()
            while i < len(rows):
                row = rows[i]
                if row is not None and row.after is None:
                    # (row None or a later session turn: see _dispatch_turn; None: a turn already flushed)
                    if row.intended_ns > now:
                        self._next = i
                        self._next_call = clock.call_at(row.intended_ns, self._due)
                        return
                    if cap and len(self.in_flight) >= cap:
                        self.waiting.append((i, now))
                    else:
                        self._start(i, 0)
                i += 1
            self._next = i
            self._scheduled.set_result(None)  # type: ignore[union-attr]  # set by _dispatch before the first call
        except Exception as e:  # noqa: BLE001 - handed to _dispatch, which raises it
            if self._scheduled is not None and not self._scheduled.done():
                self._scheduled.set_exception(e)

    def _start(self, i: int, slot_wait_ns: int, now_ns: int | None = None) -> None:
        # now_ns: the caller's own reading of the clock, which it judged the start by (closedloop.py's deadline)
        row = self.rows[i]
        row.dispatched_ns = self.clock.now_ns() if now_ns is None else now_ns
        row.slot_wait_ns = slot_wait_ns
        self.dispatched += 1
        if row.abandon_after_ns is None and row.abandon_after_tokens is not None:  # read by start()'s write
            row.cut = (row.abandon_after_tokens + self.backend.preamble_events, self.backend.event_end)
        exchange = self.transport.post(self.backend.path, {**self.headers, "X-Request-Id": row.request_id},
                                       self.bodies[i], row)
        exchange.start()  # written now where the transport can (rawhttp, on a ready connection)
        task = asyncio.create_task(self._execute(row, exchange))
        self.in_flight[task] = row
        task.add_done_callback(self._on_done)
        self._timed[task] = row.dispatched_ns + self.request_timeout_ns
        if self._watchdog is None:
            self._arm(row.dispatched_ns + self.request_timeout_ns)
        if row.abandon_after_ns is not None:
            # from the loop, after the task's first step: a task cancelled before it has run a line never runs
            # the body that gives its row an outcome (a write slower than the abandonment made it due already)
            asyncio.get_running_loop().call_soon(self._abandon, task, row.dispatched_ns + row.abandon_after_ns)

    def _abandon(self, task: asyncio.Task[None], due_ns: int) -> None:
        # Cut the request off at due_ns (the run's clock), or wait for it: the loop's timers keep its own
        # coarser time and may fire up to a millisecond early, so an early one waits the rest.
        self._abandon_at.pop(task, None)
        left_ns = due_ns - self.clock.now_ns()
        if left_ns > 0:
            self._abandon_at[task] = asyncio.get_running_loop().call_later(left_ns / 1e9, self._abandon, task, due_ns)
        elif not task.done():
            self._abandoned.add(task)
            task.cancel()

    def _exchange_over(self, task: asyncio.Task[None]) -> None:
        # The watchdog and an abandonment timer leave the request alone from here (its response is in).
        self._timed.pop(task, None)
        if self._abandon_at:
            timer = self._abandon_at.pop(task, None)
            if timer is not None:
                timer.cancel()

    def _arm(self, deadline_ns: int) -> None:
        self._watchdog = asyncio.get_running_loop().call_later(
            max(0, deadline_ns - self.clock.now_ns()) / 1e9, self._watch)

    def _watch(self) -> None:
        # Cancels every request past its deadline (the oldest first), then waits for the next deadline.
        self._watchdog = None
        now = self.clock.now_ns()
        expired: list[asyncio.Task[None]] = []
        for task, deadline_ns in self._timed.items():
            if deadline_ns > now:
                self._arm(deadline_ns)
                break
            expired.append(task)
        for task in expired:
            del self._timed[task]
            self._expired.add(task)
            task.cancel()

    def _on_done(self, task: asyncio.Task[None]) -> None:
        del self.in_flight[task]
        if self.waiting and not self._idle.is_set():
            i, came_ns = self.waiting.popleft()
            self._start(i, self.clock.now_ns() - came_ns)
        self._check_idle()

    def _check_idle(self) -> None:
        if self._dispatch_done and not self.in_flight and not self.waiting:
            self._idle.set()

    async def _cut_off(self, in_flight_outcome: str, kind: str, unstarted_outcome: str) -> None:
        self._cut_off_as = (in_flight_outcome, kind)
        self._idle.set()  # no more starts from the waiting queue
        for timer in list(self._turn_timers):
            timer.cancel()
        await asyncio.sleep(0)  # every request task takes its first step (see _start) before it is cancelled
        tasks = list(self.in_flight)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        detail = ("held back by max_concurrency until the run ended" if unstarted_outcome == DROPPED
                  else "the run was stopped before this request started")
        for i, row in enumerate(self.rows):
            if row is not None and row.outcome is None and row.dispatched_ns is None and self._in_run(i):
                row.fail(unstarted_outcome, unstarted_outcome, detail)  # (row None: flushed)
                self.recorder.finish(row)
        self.waiting.clear()

    def _in_run(self, i: int) -> bool:
        """Row i is one of the run's requests (a closed loop's pool holds rows that are not: closedloop.py)."""
        return True

    def unreached(self) -> list[Row]:
        """After run(): the rows that are not part of the run (never scheduled), which yield no row."""
        return []

    async def _execute(self, row: Row, exchange: Exchange) -> None:
        now = self.clock.now_ns
        task: asyncio.Task[None] = asyncio.current_task()  # type: ignore[assignment]  # always in its task
        read_t: array[int] = array("q")
        reads: list[bytes] = []
        streamed = interpreted = False
        resp: Response | None = None
        end_ns: int | None = None
        try:
            async with exchange as resp:
                row.http_status = resp.status
                if resp.status != 200:
                    detail = (await resp.read()).decode("utf-8", "replace")
                    row.fail(HTTP_ERROR, http_error_kind(resp.status), detail)
                else:
                    streamed = True
                    read_t, reads = await resp.stamped()  # stamped by the transport as reads land
            end_ns = now()
            self._exchange_over(task)
            if streamed and len(reads) > OFFLOAD_READS:
                # A long stream is interpreted in a worker thread (loadgen/client/offload.py says why).
                interpreted = True
                await in_worker(self.backend.interpret, row, read_t, reads)
        except TimeoutError:  # a transport's own (aiohttp's)
            row.fail(TIMEOUT, ErrorKind.REQUEST_TIMEOUT, f"no complete response within {self.request_timeout_s:g}s")
        except TransportError as e:
            if e.kind == ErrorKind.ABANDONED:  # the transport cut the stream at row.cut
                row.fail(ABANDONED, ErrorKind.ABANDONED, e.detail)
            else:
                row.fail(CONNECTION_ERROR, e.kind, e.detail)
        except asyncio.CancelledError:
            if task in self._expired:  # the watchdog's
                row.fail(TIMEOUT, ErrorKind.REQUEST_TIMEOUT,
                         f"no complete response within {self.request_timeout_s:g}s")
            elif task in self._abandoned:
                row.fail(ABANDONED, ErrorKind.ABANDONED,
                         f"closed by the client {row.abandon_after_ns / 1e9:g}s after dispatch, as planned")  # type: ignore[operator]
            else:
                row.fail(*self._cut_off_as)
        except Exception as e:  # an unexpected client-side failure still yields the row
            row.fail(CONNECTION_ERROR, ErrorKind.CLIENT_ERROR, f"{type(e).__name__}: {e}")
        finally:
            self._exchange_over(task)
            self._expired.discard(task)
            self._abandoned.discard(task)
            row.done_ns = end_ns or now()
            if streamed and not reads:
                read_t, reads = resp.received()  # type: ignore[union-attr]  # streamed: resp is set; cut off mid-stream: keep what had already arrived
            if streamed and not interpreted:
                self.backend.interpret(row, read_t, reads)
            self.recorder.finish(row)
            if self._next_turn:
                self._release_next(row, reads)

    # --- session turns ---------------------------------------------------------------------------
    def _sessions_init(self, next_body: NextBody | None, blocks: bool) -> None:
        self.next_body = next_body
        pos = {r.idx: i for i, r in enumerate(self.rows)}
        self._next_turn = {r.after: i for i, r in enumerate(self.rows) if r.after is not None}
        self._next_turn = {pos[a]: i for a, i in self._next_turn.items()}  # row position -> next position
        self._pos = pos
        self._turns_left = len(self._next_turn)
        self._turns_dispatched = asyncio.Event()
        self._turn_timers: set[asyncio.Task[None]] = set()
        self.prepare_ns: array[int] = array("q")  # per built turn: ns from its request to its body ready
        # next_body's thread: one, so the bodies' builder (and its tokenizer's connection) is never shared
        self._prepare = (ThreadPoolExecutor(1, thread_name_prefix="loadgen-turns")
                         if next_body is not None and blocks and self._turns_left else None)
        if not self._turns_left:
            self._turns_dispatched.set()

    def _turn_settled(self) -> None:
        self._turns_left -= 1
        if self._turns_left == 0:
            self._turns_dispatched.set()

    def _release_next(self, row: Row, reads: list[bytes]) -> None:
        j = self._next_turn.get(self._pos[row.idx])
        if j is None or self._idle.is_set():
            return  # no next turn, or the run is being cut off (rows left unstarted get their outcome there)
        if row.outcome != OK:
            self._drop_from(j, f"turn {row.turn} of this conversation ended {row.outcome}")
            return
        timer = asyncio.create_task(self._dispatch_turn(j, row, reads))
        self._turn_timers.add(timer)
        timer.add_done_callback(self._turn_timers.discard)

    def _drop_from(self, j: int | None, detail: str) -> None:
        while j is not None:  # the conversation ends here: this turn and every later one are dropped
            nxt = self.rows[j]
            nxt.fail(DROPPED, ErrorKind.SESSION_BROKEN, detail)
            self.recorder.finish(nxt)
            self._turn_settled()
            j = self._next_turn.get(j)

    async def _dispatch_turn(self, j: int, prev: Row, reads: list[bytes]) -> None:
        nxt = self.rows[j]
        built: tuple[Any, ...] | None = None
        ready_ns: int | None = None
        if self.next_body is not None and self._prepare is not None:
            begin_ns = self.clock.now_ns()
            try:
                built = await asyncio.get_running_loop().run_in_executor(self._prepare, self.next_body, j, prev, reads)
            except Exception as e:  # noqa: BLE001 - any failure to build the body still yields the rows
                self._drop_from(j, f"the body of turn {nxt.turn} could not be built: {type(e).__name__}: {e}")
                return
            ready_ns = self.clock.now_ns()
            self.prepare_ns.append(ready_ns - begin_ns)
        elif self.next_body is not None:
            try:
                built = self.next_body(j, prev, reads)
            except Exception as e:  # noqa: BLE001 - as above
                self._drop_from(j, f"the body of turn {nxt.turn} could not be built: {type(e).__name__}: {e}")
                return
        if built is not None:
            self.bodies[j], nxt.planned_prompt_tokens = built[0], built[1]
            nxt.tool_round = built[2] if len(built) > 2 else None
        wait_ns = nxt.think_ns
        if nxt.tool_round:  # a tool round: the tool's latency, from the reply's end
            wait_ns = nxt.tool_latency_ns or 0
        else:
            nxt.tool_latency_ns = None  # waited only by a tool round
        due_ns = prev.done_ns + wait_ns  # type: ignore[operator]  # a finished row has done_ns
        nxt.intended_ns = due_ns if ready_ns is None else max(due_ns, ready_ns)
        await self.clock.sleep_until(self.rows[j].intended_ns)
        if self.max_concurrency and len(self.in_flight) >= self.max_concurrency:
            self.waiting.append((j, self.clock.now_ns()))
        else:
            self._start(j, 0)
        self._turn_settled()
