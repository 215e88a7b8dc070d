"""The results folder: the contract between `loadgen run` and everything that reads a run.

    manifest.json      schema version, tool version, resolved config (no secrets), seed, target,
                       t0 as monotonic ns and wall-clock time, host, status and reasons
    requests.parquet   one row per scheduled request; times int64 ns from t0, null = did not happen
    tokens.parquet     one row per token-bearing chunk: request_id, idx, t_ns, n_tokens
    <metric>.hlog      HdrHistogram interval logs (hdr.py), a line per second
    calibration.json, server_metrics.parquet, telemetry.parquet   optional (Run.calibration(),
                       Run.server_metrics(), Run.telemetry())
    _parts/            flushed as the run goes; merged into the files above at the end (a run killed
                       with SIGKILL leaves its parts, which read_run() still reads)
The same files in every mode: a run split over worker processes or Ray actors keeps each share under
_parts/ while it goes and its driver merges them at the end (merge.py); manifest.json `workers` holds
the per-worker detail. Folders of older --workers runs (requests.<w>.parquet, tokens.<w>.parquet,
<metric>.<w>.hlog beside manifest.json) are still read as one run.

Every file is written to a temporary name, synced, and renamed (and its folder synced), so a reader
never sees half a file and a crash, a power cut or `kill -9` keeps every file already written (a run
loses at most its last flush interval). A write that fails (disk full, quota, read-only) raises
StorageError naming the file and the error, and leaves no temporary file behind. RunWriter keeps a small
reserve file in _parts/ from the start: on such a failure it is deleted, so that the final manifest
(status `write_failed`, the error in `write_error`) still fits on a full disk.
"""
from __future__ import annotations

import errno
import io
import os
import shutil
from dataclasses import dataclass
from collections.abc import Callable, Mapping
from operator import attrgetter
from pathlib import Path
from typing import Any, TypedDict, get_origin, get_type_hints

import numpy as np
import orjson
import polars as pl

from loadgen.config.credentials import REDACTED, scrub, sent_secrets
from loadgen.config.kinds import is_file
from loadgen.errors import ResultsError as ResultsError  # raised here; importable from here too
from loadgen.errors import StorageError
from loadgen.client.recorder import TIME_FIELDS, Row

SCHEMA_VERSION = 1
PARTS = "_parts"
STORAGE_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS)   # a full or read-only disk, not a bad --out
RESERVE = ".reserve"              # under _parts/: freed on a write failure, for the final manifest
RESERVE_BYTES = 64 * 1024         # a manifest is ~10 KB; a --workers one grows ~1 KB per worker
# the files a results folder owns (docs/results.md): no other command may write over them (owned_by)
OWN_FILES = ("manifest.json", "requests.parquet", "tokens.parquet", "calibration.json",
             "server_metrics.parquet", "telemetry.parquet", "sim_truth.parquet", "summary.json",
             "decomposition.parquet")

REQUEST_SCHEMA = {
    "request_id": pl.String, "idx": pl.Int64, "worker": pl.Int32, "warmup": pl.Boolean,
    **{f: pl.Int64 for f in TIME_FIELDS}, "slot_wait_ns": pl.Int64,
    "outcome": pl.String, "http_status": pl.Int32, "error_kind": pl.String, "error_detail": pl.String,
    "planned_prompt_tokens": pl.Int64, "prompt_tokens": pl.Int64, "cached_tokens": pl.Int64, "max_tokens": pl.Int64,
    "output_tokens": pl.Int64, "reasoning_tokens": pl.Int64, "n_chunks": pl.Int64,
    "server_queue_ms": pl.Float64, "server_prefill_ms": pl.Float64, "server_decode_ms": pl.Float64,
    "prefix_group": pl.Int64, "session": pl.Int64, "turn": pl.Int64,  # null = not applicable
    "abandon_after_ns": pl.Int64, "abandon_after_tokens": pl.Int64,   # [abandon]'s plan; null = not abandoned
    "images": pl.Int64, "image_width": pl.Int64, "image_height": pl.Int64,  # [image]; null = none
    # the [[mix]] class's name (null: no mix), the model the body named, the priority it sent (null: none)
    "class": pl.String, "model": pl.String, "priority": pl.Int64,
    "reply_valid": pl.Boolean, "tool_calls": pl.Int64, "reply_problem": pl.String,  # null = not judged
    # agentic sessions: 0 = sends a user message, k >= 1 = the k-th request in a row carrying tool results
    # (null: not agentic, or never built); the tool latency it waited after the previous reply (tool rounds)
    "tool_round": pl.Int64, "tool_latency_ns": pl.Int64,
}
# read_run fills them (null) in an older folder
_ADDED = {"cached_tokens": pl.Int64, "first_answer_ns": pl.Int64, "reasoning_tokens": pl.Int64,
          "abandon_after_ns": pl.Int64, "abandon_after_tokens": pl.Int64,
          "images": pl.Int64, "image_width": pl.Int64, "image_height": pl.Int64,
          "class": pl.String, "model": pl.String, "priority": pl.Int64,
          "reply_valid": pl.Boolean, "tool_calls": pl.Int64, "reply_problem": pl.String,
          "tool_round": pl.Int64, "tool_latency_ns": pl.Int64}
TOKEN_SCHEMA = {"request_id": pl.String, "idx": pl.Int32, "t_ns": pl.Int64, "n_tokens": pl.Int32}


Json = dict[str, Any]  # a JSON object (its keys: docs/results.md)


class _ManifestRequired(TypedDict):
    # the keys every manifest.json holds (Manifest lists the others)
    schema_version: int
    run_id: str
    status: str                         # running | complete | invalid | interrupted | write_failed
    invalid_reasons: list[str]
    config: Json                        # config.RunConfig.to_manifest(): no secrets
    t0: Json                            # monotonic_ns, unix_ns, iso
    schedule: Json                      # requests, process, configured_rate_per_s, offered_rate_per_s, ...


class Manifest(_ManifestRequired, total=False):
    """manifest.json (docs/results.md lists every key and its content). Written before the first request
    with status `running`, rewritten at the end, by one function in every mode (run/ending.py
    run_manifest). Every key it writes is listed here; optional (total=False) where some manifest lacks
    it: the first write, a run without the option. (total=False rather than NotRequired: with postponed
    annotations only total= is seen at run time, by __required_keys__/__optional_keys__.)"""
    tool: str               # "loadgen"
    version: str            # the package version
    seed: int
    target: Json            # url (redacted), backend, api, builtin_sim, server
    host: Json              # hostname, pid, platform, python, cpus
    workload: Json          # requests_planned, tokenizer, prompt_checks, prompt_lengths, ...
    client: Json            # headers (redacted), tls (config.client.ClientOptions.manifest)
    load: Json              # open or closed loop (client.closedloop.load_model)
    slo: dict[str, float]   # run --slo: {key: ms} (config.slo.slo_keys), read by `report`
    calibration: str        # "calibration.json" or why there is none (end of run)
    scrape: Json            # --scrape-metrics: url, interval_s, scrapes, errors, last_error
    telemetry: list[Json]   # --scrape: per endpoint url (redacted), interval_s, scrapes, errors, last_error
    prefix_cache: Json      # the server's prefix-cache counters over the run (probe/prefix_cache.py)
    generator: Json         # the self-check (run/selfcheck.py), end of run
    finished: Json          # monotonic_ns, unix_ns at the end of the run
    workers: list[Json]     # --workers: one entry per worker (run/workers.py)
    write_error: Json       # status write_failed: path, errno, error (ENOSPC...), message, rows_saved
    ray: Json               # --ray: address, start_unix_ns, nodes, max_skew_ms, skew_limit_ms
    worker: int             # a worker's own manifest (under _parts/ while the run goes): its index
    pid: int                # a worker's own manifest: its process id


class RunSummary(TypedDict):
    """What analysis/summary.summarize derives from the files of one run. All latencies in ms."""
    run: Json                                      # path, name, status, target (url)
    requests: dict[str, int]                       # scheduled, ok, failed, dropped, abandoned
    outcomes: dict[str, int]                       # {outcome: rows}
    errors: Json                                   # analysis/failures.summarize: rate, counts, top texts
    rate: dict[str, float | None]                  # offered_per_s, achieved_per_s
    throughput: dict[str, float | None]            # output_tokens_per_s, requests_per_s, prompt_tokens_per_s
    latency_ms: dict[str, dict[str, float | None]]  # {metric: {stat: ms}}
    percentiles: str                               # the percentile rule in words
    histograms: dict[str, Json] | None             # {metric: HDR summary} of the .hlog files
    generator: Json | None                         # manifest.generator as is
    valid: bool
    invalid_reasons: list[str]
    lost: Json | None                              # rows a run that did not finish lacks (completeness.lost)
    server: str | None                             # manifest.target.server.kind
    prompt_lengths: Json | None                    # manifest.workload.prompt_lengths as is
    prefix_cache: Json                             # hit_rate, source, expected_hit_rate, mismatch, ...
    abandoned: Json | None                         # analysis/abandon.section: [abandon]'s cut rows, freed slots
    images: Json | None                            # analysis/summary.images: [image]'s requests, tokens charged
    replies: Json | None                           # valid JSON / valid calls (analysis/replies.py); null: none asked
    agentic: Json | None                           # tool rounds of agentic sessions (analysis/agentic.py); null: none
    telemetry: Json | None                         # --scrape: GPU figures (analysis/telemetry.py)


class Explanation(TypedDict):
    """What analysis/explain.explain adds."""
    decomposition_ms: Json
    decomposition_windows: list[Json]
    by_prompt_tokens: list[Json]
    server_histograms_ms: Json | None
    queue_split_ms: Json | None                    # analysis/server_split.queue_split
    calibration: Json | str                        # calibration.json without its probes, or why none
    roofline: Json | None
    diagnosis: list[Json]


class GoodputSection(TypedDict):
    """What analysis/goodput.section adds when an SLO is known."""
    slo: dict[str, float]                          # {key: ms} (config.slo.slo_keys)
    goodput: Json                                  # attainment, requests_per_s, met, requests, attainment_by_slo


class _WithSlo(TypedDict, total=False):
    # GoodputSection's keys, in a summary only when an SLO is known (total=False, not NotRequired: with
    # postponed annotations only total= is seen at run time, by __required_keys__/__optional_keys__)
    slo: dict[str, float]
    goodput: Json


class Summary(RunSummary, Explanation, _WithSlo):
    """summary.json, written by `loadgen report` (analysis/report_summary.build); docs/results.md lists
    every key. A key added to summary.json is added here too (tests/unit/test_summary_keys.py)."""
    load: Json                                     # open or closed loop (manifest.load, else open)
    config: Json | None                            # the run's resolved config (manifest.config)
    breakdown: Json                                # by_class, by_model (analysis/breakdown.py)


def loop_lateness_p99_ms(manifest: Mapping[str, Any]) -> float:
    """How late the run's event loop ran at p99 (ms; its lateness probe, manifest.generator): the most a
    busy host delayed the client's stamps. 0.0 for a run that has no probe."""
    return float(((manifest.get("generator") or {}).get("loop_lateness_ms") or {}).get("p99") or 0.0)


@dataclass
class Run:
    path: Path
    manifest: Manifest
    requests: pl.DataFrame
    tokens: pl.DataFrame

    def write_summary(self, summary: Summary) -> None:
        write_json(self.path / "summary.json", summary)

    def write_decomposition(self, decomposition: pl.DataFrame) -> None:
        write_parquet(self.path / "decomposition.parquet", decomposition)

    def calibration(self) -> Json | None:
        """calibration.json (the idle-server fit, calibrate.py), None when the run has none."""
        p = self.path / "calibration.json" if self.path else None
        if p is None or not p.is_file():
            return None
        try:
            calibration: Json = orjson.loads(p.read_bytes())
            return calibration
        except orjson.JSONDecodeError as e:
            raise ResultsError(f"{p}: not valid JSON: {e}") from None

    def server_metrics(self) -> pl.DataFrame | None:
        """server_metrics.parquet (the scraped /metrics, scrape.py), None when the run has none."""
        return self._parquet("server_metrics.parquet")

    def telemetry(self) -> pl.DataFrame | None:
        """telemetry.parquet (the --scrape endpoints' samples, with `source`), None when the run has none."""
        return self._parquet("telemetry.parquet")

    def _parquet(self, name: str) -> pl.DataFrame | None:
        p = self.path / name if self.path else None
        if p is None or not p.is_file():
            return None
        try:
            return pl.read_parquet(p)
        except (pl.exceptions.PolarsError, OSError) as e:
            raise ResultsError(f"{p}: unreadable: {e}") from None


_GET = {k: attrgetter("mix_class" if k == "class" else k) for k in REQUEST_SCHEMA}  # `class`: a keyword
# a row holds its drawn tool latency until the runner builds it: only a tool round (>= 1) waited it
_WAITED = pl.when(pl.col("tool_round") > 0).then(pl.col("tool_latency_ns")).alias("tool_latency_ns")


def no_pause() -> None:
    """The `pause` of work that nothing else waits for (run/pacing.py paces the flush thread's)."""


def requests_frame(rows: list[Row], t0_ns: int, pause: Callable[[], None] = no_pause) -> pl.DataFrame:
    # Column by column (one C-level pass over the rows each, then its Series); times made relative to t0 by
    # Polars (null stays null). Runs in the flush thread every FLUSH_EVERY_TICKS: its Python work holds the
    # GIL the loop needs, so `pause` (run/pacing.py) is called after each column.
    columns = []
    for k, get in _GET.items():
        columns.append(pl.Series(k, list(map(get, rows)), REQUEST_SCHEMA[k]))
        pause()
    return pl.DataFrame(columns).with_columns(*(pl.col(f) - t0_ns for f in TIME_FIELDS), _WAITED)


_CHUNK_T, _CHUNK_TOKENS = attrgetter("chunk_t_ns"), attrgetter("chunk_tokens")
_LONG = np.dtype("l")  # array("l") items: a C long, as numpy's "l"


def chunk_columns(rows: list[Row]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The rows' chunk buffers end to end: chunks per row, stamps (int64 ns, as on the rows) and tokens
    (int64). Each buffer is joined as bytes in one C pass: no Python object per chunk or per row."""
    counts = np.fromiter(map(len, map(_CHUNK_T, rows)), np.int64, len(rows))
    t = np.frombuffer(b"".join(map(_CHUNK_T, rows)), dtype=np.int64)
    k = np.frombuffer(b"".join(map(_CHUNK_TOKENS, rows)), dtype=_LONG).astype(np.int64)
    return counts, t, k


def tokens_frame(rows: list[Row], t0_ns: int, pause: Callable[[], None] = no_pause) -> pl.DataFrame:
    with_chunks = [r for r in rows if len(r.chunk_t_ns)]
    if not with_chunks:
        return pl.DataFrame(schema=TOKEN_SCHEMA)
    pause()
    counts, t, n = chunk_columns(with_chunks)
    pause()
    t, n = t - t0_ns, n.astype(np.int32)
    starts = np.repeat(np.cumsum(counts) - counts, counts)
    idx = (np.arange(t.size, dtype=np.int64) - starts).astype(np.int32)
    ids = pl.Series("request_id", [r.request_id for r in with_chunks], pl.String)
    owner = pl.Series("o", np.repeat(np.arange(len(with_chunks), dtype=np.uint32), counts))
    return pl.DataFrame({"request_id": ids.gather(owner), "idx": idx, "t_ns": t, "n_tokens": n},
                        schema=TOKEN_SCHEMA)


def is_run_folder(path: Path) -> bool:
    """Does this folder hold a loadgen run (its manifest, or the parts of one that was killed)?"""
    return (path / "manifest.json").is_file() or (path / PARTS).is_dir()


def owned_by(path: str | Path) -> Path | None:
    """The results folder whose own file `path` is (OWN_FILES, *.hlog, a worker's requests.N.parquet,
    anything under _parts/), None when it is no such file. Those are written by `run` and `report` only."""
    p = Path(path).absolute()
    if PARTS in p.parts[:-1]:
        run = p.parents[p.parts[::-1].index(PARTS)]
        if is_run_folder(run):
            return run
    if not is_run_folder(p.parent):
        return None
    name = p.name
    own = (name in OWN_FILES or name.endswith(".hlog") or (name.startswith(("requests.", "tokens.", "manifest."))
                                                          and name.endswith((".parquet", ".json"))))
    return p.parent if own else None


def write_bytes_durably(path: Path, data: bytes, sync: bool = True) -> None:
    """Write `data` to `path` whole or not at all: a temporary name, fsync, rename, fsync of the folder
    (sync=False: no fsync, still whole or not at all; for a write just before t0, which a slow disk's
    fsync must not delay). Any OSError (ENOSPC, EDQUOT, EROFS, EACCES...) is a StorageError naming
    `path`; the temporary file is removed."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            view = memoryview(data)
            while view:  # os.write may write less than asked (a signal, a nearly full disk)
                view = view[os.write(fd, view):]
            if sync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        if sync:
            _fsync_dir(path.parent)
    except OSError as e:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass
        raise StorageError(str(path), e) from None


def _fsync_dir(folder: Path) -> None:
    # the rename itself survives a crash only once the folder's entry is on disk
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_json(path: Path, obj: Mapping[str, Any], sync: bool = True) -> None:
    """obj as indented JSON, every secret this process sends scrubbed (config/credentials.scrub)."""
    data = orjson.dumps(obj, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY)
    if sent_secrets():
        data = scrub(data.decode("utf-8")).encode("utf-8")
    write_bytes_durably(Path(path), data, sync)


def parquet_bytes(df: pl.DataFrame, part: bool = False) -> bytes:
    """The frame as a Parquet file, in memory: the write itself is then ours (write_bytes_durably), and a
    full disk is an OSError with its errno, not a Polars error about thrift. A `part` (a run's _parts/,
    written while the run goes and merged at its end) is not compressed and has no statistics: less than
    half the CPU of Polars' default (zstd), taken from the run's own core, for ~3x the bytes."""
    buf = io.BytesIO()
    if part:
        df.write_parquet(buf, compression="uncompressed", statistics=False)
    else:
        df.write_parquet(buf)
    return buf.getvalue()


def write_parquet(path: Path, df: pl.DataFrame, part: bool = False) -> None:
    """df as Parquet, every secret this process sends scrubbed from its string columns."""
    write_bytes_durably(Path(path), parquet_bytes(scrub_strings(df), part))


def scrub_strings(df: pl.DataFrame) -> pl.DataFrame:
    """df with every secret this process sends (config/credentials.scrub) replaced in its String columns."""
    pieces = sent_secrets()
    text = [c for c, t in df.schema.items() if t == pl.String]
    if not pieces or not text:
        return df
    return df.with_columns(pl.col(text).str.replace_many(list(pieces), [REDACTED] * len(pieces)))


class RunWriter:
    """A run's folder while the run goes. After a write fails (StorageError) `failure` holds the error:
    nothing more is written but the final manifest (the reserve is freed for it), and the flushed parts
    stay in _parts/, where read_run() reads them."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._part = 0
        self.failure: StorageError | None = None

    def prepare(self, overwrite: bool = False) -> None:
        """Create the folder. A non-empty folder is refused unless `overwrite` and it holds a loadgen run;
        that run is set aside (renamed), deleted only once the new run has started (its first manifest),
        and put back by abandon() if the new run fails before that. Nothing is deleted here. The folder
        the command runs in (or one above it) is refused: it cannot be set aside under the user's feet."""
        p = self.path
        self._previous: Path | None = None
        self._created = not p.exists()
        self._started = False
        if p.exists():
            if not p.is_dir():
                raise ResultsError(f"--out {p}: exists and is not a folder")
            if any(p.iterdir()):
                if not overwrite:
                    raise ResultsError(f"--out {p}: folder is not empty; choose another --out, or pass "
                                       f"--overwrite to replace the run in it (kept until the new run starts)")
                if not is_run_folder(p):
                    raise ResultsError(f"--out {p}: folder is not empty and holds no loadgen run; "
                                       f"--overwrite replaces only a results folder; choose another --out")
                here = Path.cwd().resolve()
                if here == p.resolve() or p.resolve() in here.parents:
                    raise ResultsError(f"--out {p}: is the folder this command runs in (or holds it); "
                                       f"--overwrite cannot replace it: run from another folder, or choose "
                                       f"another --out")
                self._previous = p.resolve().with_name(f".{p.resolve().name}.previous-{os.getpid()}")
                try:
                    os.replace(p, self._previous)
                except OSError as e:
                    self._previous = None
                    raise ResultsError(f"--out {p}: cannot set the earlier run aside: {e.strerror}") from None
                self._created = True
        try:
            (p / PARTS).mkdir(parents=True, exist_ok=True)
        except OSError as e:
            self.abandon()
            if e.errno in STORAGE_ERRNOS:  # the disk, not the flag: exit 5 as for any failed write
                raise StorageError(str(p), e) from None
            raise ResultsError(f"--out {p}: cannot create the results folder: {e.strerror or e}") from None
        try:
            self._reserve()
        except StorageError:
            self.abandon()
            raise

    def _reserve(self) -> None:
        # RESERVE_BYTES really allocated (not a sparse file): freed by fail() for the final manifest
        reserve = self.path / PARTS / RESERVE
        try:
            fd = os.open(reserve, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                try:
                    os.posix_fallocate(fd, 0, RESERVE_BYTES)
                except OSError as e:
                    if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                        raise
                    os.write(fd, bytes(RESERVE_BYTES))
            finally:
                os.close(fd)
        except OSError as e:
            reserve.unlink(missing_ok=True)
            raise StorageError(str(reserve), e) from None

    def fail(self, error: StorageError) -> None:
        """A write failed: keep the first error, free the reserve (the final manifest must fit)."""
        if self.failure is None:
            self.failure = error
        (self.path / PARTS / RESERVE).unlink(missing_ok=True)

    def abandon(self) -> None:
        """The run failed before it started: remove what it wrote and put the earlier run back."""
        if getattr(self, "_started", True):
            return
        self._started = True
        p = self.path
        if getattr(self, "_created", False):
            shutil.rmtree(p, ignore_errors=True)
        elif p.is_dir():
            for child in p.iterdir():
                shutil.rmtree(child, ignore_errors=True) if child.is_dir() else child.unlink(missing_ok=True)
        if self._previous is not None:
            os.replace(self._previous, p)
            self._previous = None

    def manifest(self, manifest: Manifest) -> None:
        """Write manifest.json. Should that fail, the reserve is freed and it is tried once more. The
        `running` one (at t0) is not fsynced: a slow disk must not make the first requests late."""
        sync = manifest.get("status") != "running"
        try:
            write_json(self.path / "manifest.json", manifest, sync)
        except StorageError as e:
            had_reserve = (self.path / PARTS / RESERVE).exists()
            self.fail(e)
            if not had_reserve:
                raise
            write_json(self.path / "manifest.json", manifest, sync)
        if not getattr(self, "_started", True):  # the first manifest: the new run has started
            self._started = True
            if self._previous is not None:
                shutil.rmtree(self._previous, ignore_errors=True)
                self._previous = None

    @property
    def hlog_dir(self) -> Path:
        """Where the run's interval logs go (run/intervals.py): the folder itself."""
        return self.path

    def flush(self, rows: list[Row], t0_ns: int, name: str = "", pause: Callable[[], None] = no_pause) -> None:
        """Write rows finished since the last flush as a part (may run in a worker thread, which calls
        `pause` between pieces of the work: run/pacing.py). The part is then
        their only copy (Recorder.release drops them: a long run's memory stays flat); finalize() reads
        them back. Should the tokens part fail, the requests part goes too and the error is raised: the
        rows are then not flushed (finalize counts a row flushed by its requests part). A failed write
        is a StorageError, kept in `failure` (fail())."""
        if not rows:
            return
        self._part += 1
        requests = self.path / PARTS / f"requests-{name}{self._part:05d}.parquet"
        try:
            frame = requests_frame(rows, t0_ns, pause)
            pause()
            write_parquet(requests, frame, part=True)
            pause()
            try:
                frame = tokens_frame(rows, t0_ns, pause)
                pause()
                write_parquet(self.path / PARTS / f"tokens-{name}{self._part:05d}.parquet", frame, part=True)
            except BaseException:
                requests.unlink(missing_ok=True)
                raise
        except StorageError as e:
            self.fail(e)
            raise

    def finalize(self, rows: list[Row], t0_ns: int) -> pl.DataFrame:
        """Write requests.parquet and tokens.parquet from the flushed parts plus `rows`, the rows no flush()
        wrote (Recorder.unflushed()). Returns the run's requests frame (every row, sorted by idx, times ns
        from t0): the end-of-run checks read it, not the rows. After a failed write (`failure`, before or
        here) it writes nothing more: the parts stay in _parts/ as the run's record (read_run reads them),
        the merged files are removed, and the frame returned holds every row, saved or not."""
        if self.failure is None and rows:
            try:  # the last rows as a part first: should the merge not fit, every row is still saved
                self.flush(rows, t0_ns)
                rows = []
            except StorageError:
                pass
        parts = sorted((self.path / PARTS).glob("requests-[0-9]*.parquet"))
        requests = pl.concat([*(pl.read_parquet(f) for f in parts), requests_frame(rows, t0_ns)]).sort("idx")
        if self.failure is not None:
            return requests
        merged = (self.path / "requests.parquet", self.path / "tokens.parquet")
        try:
            write_parquet(merged[0], requests)
            parts = sorted((self.path / PARTS).glob("tokens-[0-9]*.parquet"))
            write_parquet(merged[1], pl.concat([pl.read_parquet(f) for f in parts]) if parts
                          else pl.DataFrame(schema=TOKEN_SCHEMA))
        except StorageError as e:
            for f in merged:  # read_run prefers requests.parquet to the parts: no half-merged run
                f.unlink(missing_ok=True)
            self.fail(e)
            return requests
        shutil.rmtree(self.path / PARTS, ignore_errors=True)
        return requests


def saved_row_count(path: str | Path) -> int:
    """How many rows a results folder holds on disk: requests.parquet's, else its parts' (unreadable
    parts count 0: what read_run could not read is not saved)."""
    p = Path(path)
    files = [p / "requests.parquet"] if (p / "requests.parquet").is_file() else sorted(
        (p / PARTS).glob("requests-*.parquet"))
    n = 0
    for f in files:
        try:
            n += int(pl.scan_parquet(f).select(pl.len()).collect().item())
        except (pl.exceptions.PolarsError, OSError):
            pass
    return n


def manifest_problems(manifest: Any) -> list[str]:
    """What makes a parsed manifest.json unusable: not an object, or a key of Manifest holding another JSON
    type than Manifest declares (null is allowed where the key is optional). Absent keys are not problems:
    a killed run's first manifest lacks most of them."""
    if not isinstance(manifest, dict):
        return [f"must be a JSON object, got {type(manifest).__name__}"]
    hints, required = get_type_hints(Manifest), Manifest.__required_keys__
    problems = []
    for key, value in manifest.items():
        if key not in hints or (value is None and key not in required):
            continue
        want = get_origin(hints[key]) or hints[key]
        if not isinstance(value, want) or (want is int and isinstance(value, bool)):
            problems.append(f"{key} must be a JSON {_JSON_TYPE.get(want, want.__name__)}, got {value!r:.60}")
    return problems


_JSON_TYPE = {dict: "object", list: "array", str: "string", int: "integer"}


def read_run(path: str | Path) -> Run:
    p = Path(path)
    if not is_file(p / "manifest.json"):  # also a name the system refuses (too long, a NUL byte)
        raise ResultsError(f"{p}: not a loadgen results folder (no manifest.json)")
    try:
        manifest = orjson.loads((p / "manifest.json").read_bytes())
    except orjson.JSONDecodeError as e:
        raise ResultsError(f"{p / 'manifest.json'}: not valid JSON: {e}") from None
    problems = manifest_problems(manifest)
    if problems:
        raise ResultsError(f"{p / 'manifest.json'}: not a loadgen manifest: {'; '.join(problems)}")
    try:
        if (p / "requests.parquet").is_file():
            requests = pl.read_parquet(p / "requests.parquet")
            tokens = (pl.read_parquet(p / "tokens.parquet") if (p / "tokens.parquet").is_file()
                      else pl.DataFrame(schema=TOKEN_SCHEMA))
        elif (p / PARTS).is_dir() or any(p.glob("requests.*.parquet")) or manifest.get("status") == "running":
            # the flushed parts of a run that was killed before it could finish its files (in a --workers
            # run: the workers' shares, merge.py), and the workers' files of an older --workers run; a run
            # killed before its first part (a Ray driver's parts are on its actors' nodes) has no rows
            requests = _concat(sorted([*p.glob("requests.*.parquet"), *(p / PARTS).glob("requests-*.parquet")]),
                               REQUEST_SCHEMA).sort("idx")
            tokens = _concat(sorted([*p.glob("tokens.*.parquet"), *(p / PARTS).glob("tokens-*.parquet")]),
                             TOKEN_SCHEMA)
        else:
            raise ResultsError(f"{p}: no requests.parquet")
    except (pl.exceptions.PolarsError, OSError) as e:
        raise ResultsError(f"{p}: unreadable results: {e}") from None
    # columns added after the first release, null in a folder written before they existed (not said):
    # cached_tokens; first_answer_ns and reasoning_tokens (an older run counted reasoning as output and
    # did not tell the first answer token apart, so its ttfa is unknown); class, model and priority
    requests = requests.with_columns(pl.lit(None, t).alias(c) for c, t in _ADDED.items() if c not in requests.columns)
    missing = set(REQUEST_SCHEMA) - set(requests.columns)
    if missing:
        raise ResultsError(f"{p / 'requests.parquet'}: missing columns {sorted(missing)}")
    return Run(p, manifest, requests, tokens)


def _concat(files: list[Path], schema: Mapping[str, type[pl.DataType]]) -> pl.DataFrame:
    return pl.concat([pl.read_parquet(f) for f in files]) if files else pl.DataFrame(schema=schema)
