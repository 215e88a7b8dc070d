"""The results folder: the contract between `loadgen run` and everything that reads a run.

    manifest.json      schema version, tool version, resolved config (no secrets), seed, target,
                       t0 as monotonic ns and wall-clock time, host, status and reasons
    requests.parquet   one row per scheduled request; times int64 ns from t0, null = did not happen
    tokens.parquet     one row per token-bearing chunk: request_id, idx, t_ns, n_tokens
    <metric>.hlog      HdrHistogram interval logs (hdr.py), a line per second
    calibration.json, server_metrics.parquet   optional (Run.calibration(), Run.server_metrics())
    _parts/            flushed as the run goes; merged into the files above at the end (a run killed
                       with SIGKILL leaves its parts, which read_run() still reads)
The same files in every mode: a run split over worker processes or Ray actors keeps each share under
_parts/ while it goes and its driver merges them at the end (merge.py); manifest.json `workers` holds
the per-worker detail. Folders of older --workers runs (requests.<w>.parquet, tokens.<w>.parquet,
<metric>.<w>.hlog beside manifest.json) are still read as one run.

Every file is written to a temporary name and renamed, so a reader never sees half a file.
"""
from __future__ import annotations

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

from loadgen.config.kinds import is_file
from loadgen.errors import ResultsError as ResultsError  # raised here; importable from here too
from loadgen.client.recorder import TIME_FIELDS, Row

SCHEMA_VERSION = 1
PARTS = "_parts"

REQUEST_SCHEMA = {
    "request_id": pl.String, "idx": pl.Int64, "worker": pl.Int32, "warmup": pl.Boolean,
    **{f: pl.Int64 for f in TIME_FIELDS}, "slot_wait_ns": pl.Int64,
    "outcome": pl.String, "http_status": pl.Int32, "error_kind": pl.String, "error_detail": pl.String,
    "planned_prompt_tokens": pl.Int64, "prompt_tokens": pl.Int64, "cached_tokens": pl.Int64, "max_tokens": pl.Int64,
    "output_tokens": pl.Int64, "n_chunks": pl.Int64,
    "server_queue_ms": pl.Float64, "server_prefill_ms": pl.Float64, "server_decode_ms": pl.Float64,
    "prefix_group": pl.Int64, "session": pl.Int64, "turn": pl.Int64,  # null = not applicable
}
TOKEN_SCHEMA = {"request_id": pl.String, "idx": pl.Int32, "t_ns": pl.Int64, "n_tokens": pl.Int32}


Json = dict[str, Any]  # a JSON object (its keys: docs/results.md)


class _ManifestRequired(TypedDict):
    # the keys every manifest.json holds (Manifest lists the others)
    schema_version: int
    run_id: str
    status: str                         # running | complete | invalid | interrupted
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
    prefix_cache: Json      # the server's prefix-cache counters over the run (probe/prefix_cache.py)
    generator: Json         # the self-check (run/selfcheck.py), end of run
    finished: Json          # monotonic_ns, unix_ns at the end of the run
    workers: list[Json]     # --workers: one entry per worker (run/workers.py)
    ray: Json               # --ray: address, start_unix_ns, nodes, max_skew_ms, skew_limit_ms
    worker: int             # a worker's own manifest (under _parts/ while the run goes): its index
    pid: int                # a worker's own manifest: its process id


class RunSummary(TypedDict):
    """What analysis/summary.summarize derives from the files of one run. All latencies in ms."""
    run: Json                                      # path, name, status, target (url)
    requests: dict[str, int]                       # scheduled, ok, failed, dropped
    outcomes: dict[str, int]                       # {outcome: rows}
    errors: Json                                   # analysis/failures.summarize: rate, counts, top texts
    rate: dict[str, float | None]                  # offered_per_s, achieved_per_s
    throughput: dict[str, float | None]            # output_tokens_per_s, requests_per_s
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
        p = self.path / "server_metrics.parquet" if self.path else None
        if p is None or not p.is_file():
            return None
        try:
            return pl.read_parquet(p)
        except (pl.exceptions.PolarsError, OSError) as e:
            raise ResultsError(f"{p}: unreadable: {e}") from None


_GET = {k: attrgetter(k) for k in REQUEST_SCHEMA}


def requests_frame(rows: list[Row], t0_ns: int) -> pl.DataFrame:
    # Column by column (one C-level pass over the rows each); times made relative to t0 by Polars (null
    # stays null). Runs in the flush thread every FLUSH_EVERY_TICKS: its Python work is the loop's too (GIL).
    frame = pl.DataFrame({k: list(map(get, rows)) for k, get in _GET.items()}, schema=REQUEST_SCHEMA)
    return frame.with_columns(pl.col(f) - t0_ns for f in TIME_FIELDS)


_CHUNK_T, _CHUNK_TOKENS = attrgetter("chunk_t_ns"), attrgetter("chunk_tokens")
_LONG = np.dtype("l")  # array("l") items: a C long, as numpy's "l"


def chunk_columns(rows: list[Row]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The rows' chunk buffers end to end: chunks per row, stamps (int64 ns, as on the rows) and tokens
    (int64). Each buffer is joined as bytes in one C pass: no Python object per chunk or per row."""
    counts = np.fromiter(map(len, map(_CHUNK_T, rows)), np.int64, len(rows))
    t = np.frombuffer(b"".join(map(_CHUNK_T, rows)), dtype=np.int64)
    k = np.frombuffer(b"".join(map(_CHUNK_TOKENS, rows)), dtype=_LONG).astype(np.int64)
    return counts, t, k


def tokens_frame(rows: list[Row], t0_ns: int) -> pl.DataFrame:
    with_chunks = [r for r in rows if len(r.chunk_t_ns)]
    if not with_chunks:
        return pl.DataFrame(schema=TOKEN_SCHEMA)
    counts, t, n = chunk_columns(with_chunks)
    t, n = t - t0_ns, n.astype(np.int32)
    starts = np.repeat(np.cumsum(counts) - counts, counts)
    idx = (np.arange(t.size, dtype=np.int64) - starts).astype(np.int32)
    ids = pl.Series("request_id", [r.request_id for r in with_chunks], pl.String)
    owner = pl.Series("o", np.repeat(np.arange(len(with_chunks), dtype=np.uint32), counts))
    return pl.DataFrame({"request_id": ids.gather(owner), "idx": idx, "t_ns": t, "n_tokens": n},
                        schema=TOKEN_SCHEMA)


def _atomic_write(path: Path, write: Callable[[Path], object]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    write(tmp)
    os.replace(tmp, path)


def write_json(path: Path, obj: Mapping[str, Any]) -> None:
    _atomic_write(Path(path), lambda p: p.write_bytes(orjson.dumps(obj, option=orjson.OPT_INDENT_2
                                                                   | orjson.OPT_SERIALIZE_NUMPY)))


def write_parquet(path: Path, df: pl.DataFrame) -> None:
    _atomic_write(Path(path), lambda p: df.write_parquet(p))


class RunWriter:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._part = 0

    def prepare(self, overwrite: bool = False) -> None:
        """Create the folder. A non-empty folder is refused unless `overwrite` and it holds a loadgen run;
        that run is set aside (renamed), deleted only once the new run has started (its first manifest),
        and put back by abandon() if the new run fails before that. Nothing is deleted here."""
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
                if not ((p / "manifest.json").exists() or (p / PARTS).is_dir()):
                    raise ResultsError(f"--out {p}: folder is not empty and holds no loadgen run; "
                                       f"--overwrite replaces only a results folder; choose another --out")
                self._previous = p.with_name(f".{p.name}.previous-{os.getpid()}")
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
            raise ResultsError(f"--out {p}: cannot create the results folder: {e.strerror or e}") from None

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
        write_json(self.path / "manifest.json", manifest)
        if not getattr(self, "_started", True):  # the first manifest: the new run has started
            self._started = True
            if self._previous is not None:
                shutil.rmtree(self._previous, ignore_errors=True)
                self._previous = None

    @property
    def hlog_dir(self) -> Path:
        """Where the run's interval logs go (run/intervals.py): the folder itself."""
        return self.path

    def flush(self, rows: list[Row], t0_ns: int, name: str = "") -> None:
        """Write rows finished since the last flush as a part (may run in a worker thread). The part is then
        their only copy (Recorder.release drops them: a long run's memory stays flat); finalize() reads
        them back. Should the tokens part fail, the requests part goes too and the error is raised: the
        rows are then not flushed (finalize counts a row flushed by its requests part)."""
        if not rows:
            return
        self._part += 1
        requests = self.path / PARTS / f"requests-{name}{self._part:05d}.parquet"
        write_parquet(requests, requests_frame(rows, t0_ns))
        try:
            write_parquet(self.path / PARTS / f"tokens-{name}{self._part:05d}.parquet", tokens_frame(rows, t0_ns))
        except BaseException:
            requests.unlink(missing_ok=True)
            raise

    def finalize(self, rows: list[Row], t0_ns: int) -> pl.DataFrame:
        """Write requests.parquet and tokens.parquet from the flushed parts plus `rows`, the rows no flush()
        wrote (Recorder.unflushed()). Returns the run's requests frame as written (every row, sorted by
        idx, times ns from t0): the end-of-run checks read it, not the rows."""
        parts = sorted((self.path / PARTS).glob("requests-[0-9]*.parquet"))
        requests = pl.concat([*(pl.read_parquet(f) for f in parts), requests_frame(rows, t0_ns)]).sort("idx")
        write_parquet(self.path / "requests.parquet", requests)
        parts = sorted((self.path / PARTS).glob("tokens-[0-9]*.parquet"))
        tokens = pl.concat([*(pl.read_parquet(f) for f in parts), tokens_frame(rows, t0_ns)])
        write_parquet(self.path / "tokens.parquet", tokens)
        shutil.rmtree(self.path / PARTS, ignore_errors=True)
        return requests


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
        elif (p / PARTS).is_dir() or any(p.glob("requests.*.parquet")):
            # the flushed parts of a run that was killed before it could finish its files (in a --workers
            # run: the workers' shares, merge.py), and the workers' files of an older --workers run
            requests = _concat(sorted([*p.glob("requests.*.parquet"), *(p / PARTS).glob("requests-*.parquet")]),
                               REQUEST_SCHEMA).sort("idx")
            tokens = _concat(sorted([*p.glob("tokens.*.parquet"), *(p / PARTS).glob("tokens-*.parquet")]),
                             TOKEN_SCHEMA)
        else:
            raise ResultsError(f"{p}: no requests.parquet")
    except (pl.exceptions.PolarsError, OSError) as e:
        raise ResultsError(f"{p}: unreadable results: {e}") from None
    if "cached_tokens" not in requests.columns:  # a folder written before the column existed: not said
        requests = requests.with_columns(pl.lit(None, pl.Int64).alias("cached_tokens"))
    missing = set(REQUEST_SCHEMA) - set(requests.columns)
    if missing:
        raise ResultsError(f"{p / 'requests.parquet'}: missing columns {sorted(missing)}")
    return Run(p, manifest, requests, tokens)


def _concat(files: list[Path], schema: Mapping[str, type[pl.DataType]]) -> pl.DataFrame:
    return pl.concat([pl.read_parquet(f) for f in files]) if files else pl.DataFrame(schema=schema)
