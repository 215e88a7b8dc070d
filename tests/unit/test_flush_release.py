"""Flushed rows are dropped from memory (Recorder.release) and the end of the run reads them back from the
parts (RunWriter.finalize): the results folder, the self-check verdict and the reachability verdict are
the same as when every row stays in memory; the runner skips the emptied slots. No network, no clock."""
import asyncio
import os
import threading
from collections import Counter

import numpy as np
import polars as pl
import pytest

from loadgen.run import selfcheck
from loadgen.client.backends.openai import OpenAIBackend
from loadgen.client.clock import LoopClock
from loadgen.run.ending import check_generator
from loadgen.run.inprocess import tick_work
from loadgen.run.intervals import INTERVAL_NS, LiveHistograms
from loadgen.probe.reachability import unreachable_reason
from loadgen.client.recorder import (CANCELLED, CONNECTION_ERROR, DROPPED, HTTP_ERROR, OK, ErrorKind, Recorder, Row)
from loadgen.results.folder import PARTS, RunWriter
from loadgen.results.merge import merge_shares, share_requests
from loadgen.client.runner import Runner
from loadgen.run.workers import PartWriter
from tests.scripted import ScriptedTransport, completion_stream, run_virtual

MS = 1_000_000
T0 = 7_000_000_000_000  # an absolute monotonic t0 (ns), as in a run: the files hold times from it


def rows_of_a_run(n: int = 120, all_refused: bool = False) -> list[Row]:
    """Every kind of row: ok with chunk stamps and server timings, HTTP errors, refused connections,
    slot waits, warm-up, session fields, and requests never sent (dropped)."""
    rng = np.random.default_rng(3)
    rows = []
    for i in range(n):
        r = Row(i, f"run-{i:06d}", T0 + i * 10 * MS, 16 + i % 7, 64, warmup=i < 3)
        r.prefix_group, r.session, r.turn = (i % 4 or None), None, None
        if i % 11 == 10:
            r.fail(DROPPED, ErrorKind.DROPPED, "held back by max_concurrency until the run ended")
        else:
            r.slot_wait_ns = 3 * MS if i % 6 == 0 else 0
            r.dispatched_ns = r.intended_ns + r.slot_wait_ns + int(rng.integers(50_000, 900_000))
            if all_refused or i % 5 == 1:
                r.fail(CONNECTION_ERROR, ErrorKind.CONNECT_FAILED, "connection refused")
            elif i % 9 == 2:
                r.connected_ns = r.sent_ns = r.response_ns = r.dispatched_ns + 200_000
                r.http_status = 503
                r.fail(HTTP_ERROR, "http_503", '{"error":"overloaded"}')
            else:
                r.connected_ns = r.sent_ns = r.dispatched_ns + 150_000
                r.http_status, r.response_ns = 200, r.sent_ns + 20 * MS
                for k in range(1 + i % 5):
                    r.chunk_t_ns.append(r.response_ns + k * 5 * MS)
                    r.chunk_tokens.append(1 + k % 2)
                r.first_token_ns, r.last_token_ns = r.chunk_t_ns[0], r.chunk_t_ns[-1]
                r.n_chunks, r.output_tokens = len(r.chunk_t_ns), sum(r.chunk_tokens)
                r.prompt_tokens = r.planned_prompt_tokens + (1 if i == 40 else 0)
                r.server_queue_ms, r.server_prefill_ms, r.server_decode_ms = 0.5 * i, 1.25, None
                r.outcome = OK
            r.done_ns = (r.last_token_ns or r.response_ns or r.dispatched_ns) + 1_000_000
        rows.append(r)
    return rows


def check_generator_of_rows(rows: list[Row]) -> tuple[list[str], dict]:
    # the self-check as computed from the rows in memory (absolute times) before rows were released
    # (the proportional rule reads TTFT and e2e from intended time of the ok rows, NaN elsewhere)
    sent = [r for r in rows if r.dispatched_ns is not None]
    n = len(sent)

    def latency(end: str) -> np.ndarray:
        return np.fromiter((getattr(r, end) - r.intended_ns if r.outcome == OK and getattr(r, end) is not None
                            else np.nan for r in sent), np.float64, n)

    return selfcheck.check(np.fromiter((r.intended_ns for r in sent), np.int64, n),
                           np.fromiter((r.dispatched_ns for r in sent), np.int64, n),
                           np.fromiter((r.slot_wait_ns or 0 for r in sent), np.int64, n), selfcheck.Limits(),
                           measured=np.fromiter((not r.warmup for r in sent), bool, n),
                           latency_ns={"ttft": latency("first_token_ns"), "e2e": latency("last_token_ns")})


def unreachable_of_rows(rows: list[Row]) -> str | None:
    # reachability's rule as computed from the rows in memory
    sent = [r for r in rows if r.dispatched_ns is not None]
    answered = sum(1 for r in sent if r.http_status is not None)
    refused = sum(1 for r in sent if r.error_kind == ErrorKind.CONNECT_FAILED)
    if answered and refused <= 0.5 * len(sent):
        return None
    kinds = Counter(r.error_kind or r.outcome for r in sent if r.http_status is None)
    top = ", ".join(f"{n} {k}" for k, n in kinds.most_common(3))
    example = next((r.error_detail for r in sent if r.error_detail), "")
    what = "no request reached the server" if not answered else \
        f"{refused} of {len(sent)} requests failed to connect"
    return f"target unreachable: {what} ({top}){'; e.g. ' + example if example else ''}"


def end_of_run(writer, rows: list[Row], flushes: list[slice]) -> tuple[pl.DataFrame, Recorder]:
    """What inprocess.measure does with the rows: flush (and release) some as the run goes, then finalize;
    a worker's share is then merged into the run's files by its driver (workers.end_shares)."""
    writer.prepare()
    recorder = Recorder(rows)
    for s in flushes:
        done = rows[s]
        writer.flush(done, T0)
        recorder.release(done)
    frame = writer.finalize(recorder.unflushed(), T0)
    if isinstance(writer, PartWriter):
        assert not (writer.path / "requests.parquet").exists()  # the share stays under _parts/ until then
        merge_shares(writer.path, share_requests(writer.path), 1_700_000_000.0)
    return frame, recorder


@pytest.mark.parametrize("make_writer", [RunWriter, lambda p: PartWriter(p, 1)], ids=["one-process", "worker-share"])
@pytest.mark.parametrize("all_refused", [False, True], ids=["reachable", "unreachable"])
def test_flushed_and_released_rows_end_the_run_as_rows_kept_in_memory(tmp_path, make_writer, all_refused):
    kept, flushed = rows_of_a_run(all_refused=all_refused), rows_of_a_run(all_refused=all_refused)
    whole, _ = end_of_run(make_writer(tmp_path / "kept"), kept, [])
    parts, recorder = end_of_run(make_writer(tmp_path / "flushed"), flushed,
                                 [slice(0, 37), slice(37, 80)])

    # the flushed rows are gone from memory; the rest stayed
    assert recorder.rows[:80] == [None] * 80 and all(r is not None for r in recorder.rows[80:])
    assert not list((tmp_path / "flushed" / PARTS).glob("*.parquet"))
    # the folder's files and the frame handed to the checks: identical, one row per request, idx order
    for name in ("requests", "tokens"):
        a = pl.read_parquet(tmp_path / "kept" / f"{name}.parquet")
        b = pl.read_parquet(tmp_path / "flushed" / f"{name}.parquet")
        assert a.equals(b) and (a.height > 0 or name == "tokens" and all_refused)
    assert parts.equals(whole) and parts["idx"].to_list() == list(range(len(kept)))
    assert parts.equals(pl.read_parquet(tmp_path / "flushed" / "requests.parquet"))
    # the verdicts: the same as from the rows in memory (absolute times) before rows were released
    assert check_generator(parts) == check_generator(whole) == check_generator_of_rows(kept)
    assert unreachable_reason(parts) == unreachable_reason(whole) == unreachable_of_rows(kept)
    assert (unreachable_reason(parts) is None) != all_refused
    assert int(parts["n_chunks"].sum()) == sum(r.n_chunks for r in kept) > 0 or all_refused


def test_a_failed_tokens_part_leaves_the_rows_unflushed(tmp_path, monkeypatch):
    rows = rows_of_a_run(30)
    writer = RunWriter(tmp_path / "run")
    writer.prepare()
    import loadgen.results.folder as results

    def no_tokens(*a):
        raise OSError("disk full")
    monkeypatch.setattr(results, "tokens_frame", no_tokens)
    with pytest.raises(OSError):
        writer.flush(rows[:10], T0)
    assert not list((tmp_path / "run" / PARTS).glob("*.parquet"))  # no requests part without its tokens


def test_the_runner_skips_turns_already_flushed_and_released():
    # s0t1 (position 2) is sent and done, flushed and released long before the dispatch loop, waiting for
    # s1t0 (due at 5 s), walks past its slot; a stop at 3 s (position 3 still waits) cuts off the rest.
    def session_rows():
        rows = [Row(0, "s0t0", 0, 8, 4), Row(1, "s1t0", 5000 * MS, 8, 4), Row(2, "s0t1", None, 8, 4),
                Row(3, "s1t1", None, 8, 4)]
        for r, (s, t, after) in zip(rows, [(0, 0, None), (1, 0, None), (0, 1, 0), (1, 1, 1)]):
            r.session, r.turn, r.after, r.think_ns = s, t, after, (100 * MS if after is not None else 0)
        return rows

    class Releasing(Recorder):  # flushes every row at once
        def finish(self, row):
            super().finish(row)
            self.finished.append((row.request_id, row.outcome))
            self.release(self.take_finished())

    def go(stop_at_s):
        rows = session_rows()
        recorder = Releasing(rows)
        recorder.finished = []

        async def main():
            stop = asyncio.Event()
            if stop_at_s is not None:
                asyncio.get_running_loop().call_later(stop_at_s, stop.set)
            runner = Runner(rows, [b"{}"] * 4, OpenAIBackend("completions", "m", {}),
                            ScriptedTransport(lambda rid: completion_stream(4, 0.05, 0.01)), LoopClock(), recorder,
                            next_body=lambda j, prev, reads: (b"{}", 8))
            return await runner.run(stop)
        return run_virtual(main()), recorder

    status, recorder = go(None)
    assert status == "complete" and recorder.rows == [None] * 4
    assert sorted(recorder.finished) == [("s0t0", OK), ("s0t1", OK), ("s1t0", OK), ("s1t1", OK)]
    status, recorder = go(3.0)
    assert status == "interrupted" and recorder.rows == [None] * 4
    assert sorted(recorder.finished) == [("s0t0", OK), ("s0t1", OK), ("s1t0", CANCELLED), ("s1t1", CANCELLED)]


def test_a_workers_share_releases_its_rows_by_their_plan_index():
    share = [Row(i, f"r{i}", i * MS, 8, 4) for i in (1, 4, 7, 10)]  # every 3rd row of the plan
    recorder = Recorder(share)
    recorder.release([share[1], share[3]])
    assert [r and r.idx for r in recorder.rows] == [1, None, 7, None]
    assert [r.idx for r in recorder.unflushed()] == [1, 7]


def finished_run(tmp_path, n: int) -> tuple[RunWriter, Recorder, LiveHistograms]:
    """A run's writer, its recorder with n finished rows (rows_of_a_run) and its interval histograms: what a
    flush tick (inprocess.tick_work) is given."""
    writer = RunWriter(tmp_path / "run")
    writer.prepare()
    recorder = Recorder(rows_of_a_run(n))
    for r in recorder.rows:
        recorder.finish(r)
    return writer, recorder, LiveHistograms(writer.path, T0, 1_700_000_000.0)


def test_the_flush_thread_keeps_the_loops_cpu_priority(tmp_path):
    # The once-a-second work (histograms, parquet parts, release) runs in the loop's default thread pool,
    # whose threads also parse long streams (offload.py). It holds the GIL in its Python parts: a thread
    # niced below the loop is left unscheduled beside CPU-bound processes while the loop waits for the
    # GIL (it was nice 19: send-lag p99 of 160-220 ms beside a compile, 4 ms without).
    writer, recorder, hists = finished_run(tmp_path, 30)

    def flush_then_priority(finished: list) -> tuple[int, int]:
        tick_work(writer, recorder, hists, list(finished), INTERVAL_NS, finished, T0)
        tid = threading.get_native_id()
        return tid, os.getpriority(os.PRIO_PROCESS, tid)

    async def main():
        return await asyncio.get_running_loop().run_in_executor(None, flush_then_priority,
                                                                recorder.take_finished())
    tid, nice = asyncio.run(main())
    assert tid != threading.get_native_id() and recorder.rows == [None] * 30  # flushed and released there
    assert nice == os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
