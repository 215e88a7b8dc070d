"""What each per-request step of the client costs (issue 29 part 1), one step at a time, no network.

    python -m tests.bench.steps               ns of CPU per step: the least of REPEATS batches (a quiet host)
    python -m tests.bench.steps --callgrind   instructions per step under callgrind: exact, whatever else the
                                              host is doing (each step run K times and 0 times, the difference / K)

One request is a vLLM chat stream of 16 tokens in 19 reads as the simulator and vLLM send it (the head with
the role-only first event, one read per content event, the usage event, `[DONE]` with the zero chunk). The
steps are the real functions a run calls for it, in the order it calls them:

| step | what runs (per request) |
|---|---|
| write | the request's bytes written on a kept-alive connection (rawhttp._Exchange._write) |
| recv | 19 reads through the protocol callback (rawhttp._Conn.data_received: the stamp) |
| head | the response head parsed (rawhttp.parse_head) |
| body | the chunked body split back per read (rawhttp.parse_body) |
| stamps | each payload read paired with its stamp (what rawhttp._Response.stamped returns) |
| interpret | the stream interpreted into the row (OpenAIBackend.interpret: the fast path) |
| finish | the row handed to the recorder (Recorder.finish) |
| interval | the row's share of a second's interval histograms (LiveHistograms.record_interval, 800 rows) |
| part | the row's share of a Parquet part (RunWriter.flush, 1,600 rows: requests and tokens) |

What is not here: the event loop's own work per request (the task, its futures and timers), which depends on
the loop (uvloop) and is measured with the rest by bench_fast's CPU per chunk.
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from array import array
from itertools import compress

import orjson

from loadgen.client.backends.openai import OpenAIBackend
from loadgen.client.rawhttp import RawHttpTransport, _Conn, parse_body, parse_head
from loadgen.client.recorder import Recorder, Row
from loadgen.results.folder import RunWriter
from loadgen.run.intervals import LiveHistograms

TOKENS = 16
BATCH, REPEATS = 20, 300       # timing: the least of REPEATS batches (a batch shorter than a scheduler slice)
K = 2000                       # --callgrind: runs per step
INTERVAL_ROWS, PART_ROWS = 800, 1600   # 800 req/s: a second's interval, a part every 2 s
HEAD = (b"HTTP/1.1 200 OK\r\ndate: Mon, 07 Dec 2026 03:00:00 GMT\r\nserver: uvicorn\r\n"
        b"content-type: text/event-stream; charset=utf-8\r\ntransfer-encoding: chunked\r\n\r\n")


def _chunk(payload: bytes) -> bytes:
    return f"{len(payload):x}\r\n".encode() + payload + b"\r\n"


def _event(choices: list, **more: object) -> bytes:
    return b"data: " + orjson.dumps({"id": "chatcmpl-0", "object": "chat.completion.chunk", "created": 1765000000,
                                     "model": "tiny", "choices": choices, **more}) + b"\n\n"


def response_reads() -> list[bytes]:
    """The reads of one 16-token chat stream, as they arrive."""
    reads = [HEAD + _chunk(_event([{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                                    "finish_reason": None}]))]
    reads += [_chunk(_event([{"index": 0, "delta": {"content": f" w{k}"}, "logprobs": None,
                              "finish_reason": None if k < TOKENS - 1 else "length"}])) for k in range(TOKENS)]
    reads.append(_chunk(_event([], usage={"prompt_tokens": 128, "total_tokens": 128 + TOKENS,
                                          "completion_tokens": TOKENS})))
    reads.append(_chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
    return reads


class _Socket:  # the asyncio.Transport a connection writes to: takes the bytes, nothing more
    def write(self, data: bytes) -> None:
        pass


def _received(reads) -> _Conn:
    conn = _Conn()
    conn.transport = _Socket()  # type: ignore[assignment]
    for r in reads:
        conn.data_received(r)
    return conn


def steps() -> dict:
    """step name -> a function doing that step for one request (the objects it needs built once)."""
    reads = response_reads()
    backend = OpenAIBackend("chat", "tiny", {})
    body = backend.body("hello " * 100, TOKENS)
    transport = RawHttpTransport("http://127.0.0.1:9", {})
    headers = {"Content-Type": "application/json", "X-Request-Id": "req-000001"}
    conn = _received(reads)
    head = parse_head(conn.data[0])
    assert head is not None
    parsed = parse_body(head, conn.data, False)
    assert parsed.complete
    stamps, payload = array("q", compress(conn.t, parsed.body_reads)), list(compress(parsed.body_reads,
                                                                                    parsed.body_reads))
    rows = []
    for i in range(PART_ROWS):
        row = Row(i, f"req-{i:06d}", 1_000 + i * 1_250_000, 128, TOKENS)
        row.dispatched_ns = row.connected_ns = row.sent_ns = row.intended_ns + 50_000
        row.response_ns, row.http_status, row.done_ns = row.sent_ns + 20_000_000, 200, row.sent_ns + 96_000_000
        backend.interpret(row, [row.response_ns + k * 5_000_000 for k in range(len(payload))], payload)
        assert row.outcome == "ok" and row.n_chunks == TOKENS
        rows.append(row)
    recorder = Recorder(rows)
    folder = tempfile.mkdtemp(prefix="loadgen-steps-")
    writer = RunWriter(folder)
    writer.prepare()
    hists = LiveHistograms(folder, 0, time.time())

    idle = _received(())  # the kept-alive connection each request is written on (its reads reset there)

    def write() -> None:
        transport.post("/v1/chat/completions", {**headers}, body, rows[0])._write(idle)

    def interpret() -> None:
        backend.interpret(Row(0, "req-000000", 0, 128, TOKENS), stamps, payload)

    def finish() -> None:
        recorder.finish(rows[0])
        recorder.take_finished()

    return {
        "write": write,
        "recv": lambda: _received(reads),
        "head": lambda: parse_head(conn.data[0]),
        "body": lambda: parse_body(head, conn.data, False),
        "stamps": lambda: (array("q", compress(conn.t, parsed.body_reads)),
                           list(compress(parsed.body_reads, parsed.body_reads))),
        "interpret": interpret,
        "finish": finish,
        "interval": (lambda: hists.record_interval(rows[:INTERVAL_ROWS], 1_000_000_000), INTERVAL_ROWS),
        "part": (lambda: writer.flush(rows, 0), PART_ROWS),
    }


def _per_request(step) -> tuple:
    return step if isinstance(step, tuple) else (step, 1)


def timed() -> dict[str, float]:
    """ns of CPU per request of each step: the least batch of BATCH calls over REPEATS batches (the process's
    CPU time: Polars' own threads count; a part's fsync does not)."""
    out = {}
    for name, step in steps().items():
        fn, rows = _per_request(step)
        batch, repeats = (BATCH, REPEATS) if rows == 1 else (1, 15)
        best = float("inf")
        for _ in range(repeats):
            t = time.process_time_ns()
            for _ in range(batch):
                fn()
            best = min(best, (time.process_time_ns() - t) / batch)
        out[name] = best / rows
    return out


def _run_step(name: str, k: int) -> None:
    fn, _ = _per_request(steps()[name])
    for _ in range(k):
        fn()


def instructions() -> dict[str, float]:
    """Instructions per request of each step under callgrind (its run K times less its run 0 times)."""
    out = {}
    with tempfile.TemporaryDirectory() as d:
        for name, step in steps().items():
            _, rows = _per_request(step)
            k = K if rows == 1 else 10
            counts = []
            for n in (0, k):
                f = os.path.join(d, f"{name}.{n}")
                subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={f}", sys.executable, "-m",
                                "tests.bench.steps", "--run", name, str(n)], check=True, capture_output=True)
                with open(f) as fh:
                    counts.append(next(int(line.split()[1]) for line in fh if line.startswith("summary:")))
            out[name] = (counts[1] - counts[0]) / k / rows
    return out


def main(argv: list[str]) -> None:
    if argv[:1] == ["--run"]:
        _run_step(argv[1], int(argv[2]))
        return
    exact = argv[:1] == ["--callgrind"]
    figures = instructions() if exact else timed()
    unit = "instructions" if exact else "ns"
    print(f"{'step':<10} {unit + ' per request':>24}")
    for name, v in figures.items():
        print(f"{name:<10} {v:>24,.0f}")
    print(f"{'total':<10} {sum(figures.values()):>24,.0f}")


if __name__ == "__main__":
    main(sys.argv[1:])
