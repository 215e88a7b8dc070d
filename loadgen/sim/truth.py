"""The simulator's ground truth: one row per request, keyed by its X-Request-Id.

Times are `time.monotonic_ns()` (the client's clock). For every completed request
    arrival_ns + queue_ns + prefill_ns + decode_ns == finish_ns   (exactly, integers)
because queue_ns = scheduled_ns - arrival_ns, prefill_ns = first_token_ns - scheduled_ns and
decode_ns = finish_ns - first_token_ns. The `_s` columns are those integers / 1e9 (floats, so the
identity holds there only to float rounding; check it on the `_ns` columns).

  arrival_ns      the request was received (body read, before any fault or queueing)
  scheduled_ns    the engine first scheduled it (fixed mode: = arrival_ns)
  first_token_ns  send time of the first token (= token_ns[0]), reasoning or not
  first_answer_ns send time of the first answer token (= token_ns[reasoning_tokens]); null when none was
                  sent (every token sent was reasoning)
  reasoning_tokens  of the tokens sent, the reasoning ones (--reasoning-tokens; chat, responses, messages): min(R, sent)
  reply_valid     a request that sent tools or response_format: its reply was valid (sim/structured.py: a
                  declared call with JSON arguments of its schema, or JSON content of the schema, sent whole,
                  not drawn invalid by --invalid-json-share, ended ok); null for any other request
  tool_call_ids   chat: the tool_call_id of each `role: tool` message ending the request's messages (the
                  tool results it carries), joined by ","; null when it ends with none
  finish_ns       send time of the last token (= token_ns[-1]); for a failed request the time it
                  failed; null if it never finished (sim stopped)
  (the pooling endpoints, embeddings and rerank: no token is sent, token_ns is empty and output_tokens 0;
  first_token_ns is the end of the request's prefill, when its answer was ready, finish_ns when the JSON
  answer was about to be written, and lateness_ns holds the answer's one lateness: sim/pooling_apis.py)
  token_ns        send time of every output token: the clock read just before the bytes are
                  written to the transport (a chunk of K tokens stamps K equal times). For a
                  non-streaming response it is when each token was produced; the body goes out
                  at finish_ns.
  lateness_ns     per token, send time minus the time the engine/schedule made it due
  preemptions     times the request was preempted (recomputed later)
  stall_ns/stall_s  time after its first token that the request spent not decoding because of
                  others: prefill work of other requests sharing its steps, being preempted, and
                  engine stalls (faults)
  speed           the --speed factor (profile time = real time * speed)
  fault           the fault injected into this request ("" if none)
  image_tokens    of prompt_tokens, the tokens its images cost (sim/images.py's rule; 0 without images)
  model           the body's model (the simulator's --model when the body names none)
  priority        the body's `priority` (0 when not sent, vLLM's default; OpenAI surfaces only)
  outcome         ok | http_error (400 refused, 404 a model --lora-modules does not list, or an injected
                  5xx/429) | reset (injected) |
                  client_gone | interrupted (the simulator stopped first)

File type by extension: .jsonl (a line per request, flushed at once) or .parquet. A parquet file
cannot be appended to, and rewriting it while the engine runs would stall the event loop for a time
that grows with the run (the emit times it records would show it). So a .parquet truth is journaled
as it goes, a flushed line per request in `<name>.parquet.partial.jsonl`, and written (atomically)
from the journal at exit, which then removes the journal. read_truth() reads the journal while it
exists (a live or killed simulator), else the parquet file.

A truth that cannot be written (disk full, quota, read-only) is said once on stderr and stops there:
the simulator goes on serving, the journal keeps the rows written before (read_truth reads it), and no
temporary file is left behind.
"""
from __future__ import annotations

import io
import os
import sys
from pathlib import Path
from typing import Any

import orjson

FLUSH_EVERY_S = 1.0   # app.py flushes the journal and the step log this often, so a killed simulator leaves them
COLUMNS = {  # name -> polars dtype name
    "request_id": "str", "arrival_ns": "i64", "scheduled_ns": "i64", "first_token_ns": "i64",
    "finish_ns": "i64", "queue_s": "f64", "prefill_s": "f64", "decode_s": "f64",
    "preemptions": "i64", "stall_s": "f64", "token_ns": "list_i64",
    "queue_ns": "i64", "prefill_ns": "i64", "decode_ns": "i64", "stall_ns": "i64",
    "lateness_ns": "list_i64", "speed": "f64", "mode": "str", "endpoint": "str",
    "http_status": "i64", "outcome": "str", "fault": "str", "prompt_tokens": "i64",
    "output_tokens": "i64", "cached_tokens": "i64", "sim_process": "i64",
    "first_answer_ns": "i64", "reasoning_tokens": "i64", "image_tokens": "i64", "model": "str", "priority": "i64",
    "reply_valid": "bool", "tool_call_ids": "str",
}


def make_row(*, request_id: str, arrival_ns: int, scheduled_ns: int | None,
             first_token_ns: int | None, finish_ns: int | None, preemptions: int, stall_ns: int,
             token_ns: list[int], lateness_ns: list[int], speed: float, mode: str, endpoint: str,
             http_status: int, outcome: str, fault: str, prompt_tokens: int, cached_tokens: int = 0,
             reasoning: int = 0, image_tokens: int = 0, model: str = "", priority: int = 0,
             reply_valid: bool | None = None, tool_call_ids: str | None = None) -> dict[str, Any]:
    # reasoning: the request's first `reasoning` output tokens are reasoning (0: none)
    def diff(a: int | None, b: int | None) -> int | None:
        return None if a is None or b is None else a - b

    queue_ns = diff(scheduled_ns, arrival_ns)
    prefill_ns = diff(first_token_ns, scheduled_ns)
    decode_ns = diff(finish_ns, first_token_ns)
    to_s = lambda ns: None if ns is None else ns / 1e9  # noqa: E731
    return {
        "request_id": request_id, "arrival_ns": arrival_ns, "scheduled_ns": scheduled_ns,
        "first_token_ns": first_token_ns, "finish_ns": finish_ns,
        "queue_s": to_s(queue_ns), "prefill_s": to_s(prefill_ns), "decode_s": to_s(decode_ns),
        "preemptions": preemptions, "stall_s": stall_ns / 1e9, "token_ns": token_ns,
        "queue_ns": queue_ns, "prefill_ns": prefill_ns, "decode_ns": decode_ns, "stall_ns": stall_ns,
        "lateness_ns": lateness_ns, "speed": speed, "mode": mode, "endpoint": endpoint,
        "http_status": http_status, "outcome": outcome, "fault": fault,
        "prompt_tokens": prompt_tokens, "output_tokens": len(token_ns), "cached_tokens": cached_tokens,
        "sim_process": 0,  # which simulator process served it (--processes N: 0..N-1; Sim.record sets it)
        "first_answer_ns": token_ns[reasoning] if len(token_ns) > reasoning else None,
        "reasoning_tokens": min(reasoning, len(token_ns)),
        "image_tokens": image_tokens,   # of prompt_tokens, the images' (sim/images.py)
        "model": model, "priority": priority,
        "reply_valid": reply_valid,
        "tool_call_ids": tool_call_ids,
    }


class TruthWriter:
    # shared=True (one of `--processes N`): append to the journal the parent created (start_shared) and
    # leave the parquet conversion to the parent (finish_shared). Each row is then one write(2) on an
    # O_APPEND descriptor: Linux serialises writes to a regular file, so the rows of N processes never
    # interleave, and a live reader sees every row so far exactly once.
    def __init__(self, path: str | os.PathLike, shared: bool = False):
        self.path = Path(path)
        self.kind = _kind(self.path)
        self.shared = shared
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.journal = journal_path(self.path) if self.kind == ".parquet" else self.path
        self._fh = open(self.journal, "ab", buffering=0) if shared else open(self.journal, "wb")
        self.failed = False   # a write failed: nothing more is written (said once, _give_up)

    def add(self, row: dict[str, Any]) -> None:
        if self.failed:
            return
        data = orjson.dumps(row) + b"\n"
        try:
            n = self._fh.write(data)
            while n is not None and n < len(data):  # a short write (disk full, signal): rare; finish the line
                data = data[n:]
                n = self._fh.write(data)
            self._fh.flush()
        except OSError as e:
            self._give_up(e)

    def _give_up(self, e: OSError) -> None:
        self.failed = True
        print(f"loadgen sim: --truth {self.path}: cannot write: {e.strerror or e}; the truth stops here "
              f"(requests are still served)", file=sys.stderr, flush=True)

    def flush(self) -> None:
        if self._fh is not None and not self.failed:
            try:
                self._fh.flush()
            except OSError as e:
                self._give_up(e)

    def close(self) -> None:
        if self._fh is None:
            return
        try:
            self._fh.close()
        except OSError as e:  # the buffered last lines did not fit
            self.failed or self._give_up(e)
        self._fh = None
        if self.kind == ".parquet" and not self.shared:
            try:
                _write_parquet(self.path, _read_jsonl(self.journal))
            except OSError as e:  # the journal stays: read_truth reads it
                self.failed or self._give_up(e)
                return
            self.journal.unlink()


def _kind(path: Path) -> str:
    kind = path.suffix.lower()
    if kind not in (".jsonl", ".parquet"):
        raise ValueError(f"--truth {path}: the file must end in .jsonl or .parquet")
    return kind


def start_shared(path: str | os.PathLike) -> None:
    # The parent of `--processes N`, before its children start: an empty journal they append to.
    p = Path(path)
    kind = _kind(p)
    p.parent.mkdir(parents=True, exist_ok=True)
    (journal_path(p) if kind == ".parquet" else p).write_bytes(b"")


def finish_shared(path: str | os.PathLike) -> None:
    # The parent, once every child has exited: the one truth file, as a single process leaves it.
    p = Path(path)
    if _kind(p) == ".parquet":
        _write_parquet(p, _read_jsonl(journal_path(p)))
        journal_path(p).unlink()


def journal_path(parquet_path: Path) -> Path:
    return parquet_path.with_name(parquet_path.name + ".partial.jsonl")


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    # A simulator killed mid-write leaves at most one cut last line: it is skipped.
    rows = []
    for line in path.read_bytes().splitlines():
        try:
            rows.append(orjson.loads(line))
        except orjson.JSONDecodeError:
            continue
    return rows


def _write_parquet(path: Path, rows: list[dict[str, Any]]) -> None:
    import polars as pl

    types = {"str": pl.Utf8, "i64": pl.Int64, "f64": pl.Float64, "list_i64": pl.List(pl.Int64), "bool": pl.Boolean}
    schema = {k: types[v] for k, v in COLUMNS.items()}
    df = pl.DataFrame(rows, schema=schema, orient="row") if rows else pl.DataFrame(schema=schema)
    buf = io.BytesIO()  # in memory first: a full disk is then an OSError, and no half file is left
    df.write_parquet(buf)
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_bytes(buf.getvalue())
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)
        raise


def read_truth(path: str | os.PathLike) -> list[dict[str, Any]]:
    p = Path(path)
    if p.suffix.lower() == ".jsonl":
        return _read_jsonl(p)
    if journal_path(p).exists():
        return _read_jsonl(journal_path(p))
    import polars as pl

    return pl.read_parquet(p).to_dicts()
