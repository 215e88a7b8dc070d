"""Trace readers: a file of real (or realistic) requests -> arrival times and token lengths.

Formats (sniffed from the header / first line when not given):
    azure     Azure LLM inference trace CSV: TIMESTAMP (datetime with a fraction, e.g.
              2023-11-16 18:15:46.6805900), ContextTokens, GeneratedTokens
    mooncake  Mooncake JSONL: timestamp (ms), input_length, output_length, hash_ids (one id per
              512-token block of the prompt; rows with equal leading ids share that prefix)
    burstgpt  BurstGPT CSV: Timestamp (s), Model, Request tokens, Response tokens, Total tokens, Log Type;
              rows with Response tokens = 0 are failed requests: always skipped, counted as `failed`
    jsonl     our own: one object per line, intended_ns (int ns), prompt_tokens, max_tokens, optional
              prefix_group; exactly what `loadgen schedule --out plan.jsonl` writes (so a plan replays)

Bad rows (missing or non-numeric fields, negative lengths or timestamps, a timestamp earlier than the
one before it) raise TraceError naming the file and line of each (the first 10, then a count); with
skip_bad_rows they are dropped and counted per reason in Trace.skipped (the manifest records it).
Lines are 1-based and count the CSV header. CSV readers use Polars' streaming engine over the needed
columns only, so memory stays near the three int64 output columns; the JSONL readers go line by line.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeGuard

import numpy as np
import orjson
import polars as pl
from loadgen.config.kinds import is_file
from loadgen.errors import TraceError  # noqa: F401  (raised here; importable from here too)

FORMATS = ("azure", "mooncake", "burstgpt", "jsonl")
BLOCK_TOKENS = 512  # Mooncake's hash_ids granularity
_SHOW = 10
_MAX_S = 9.2e9          # seconds that still fit int64 ns
_MAX_INT = 2**63 - 1    # lengths and timestamps must fit int64


@dataclass
class Trace:
    source: str
    format: str
    timestamps_ns: np.ndarray            # int64, sorted, from the trace's own origin
    prompt_tokens: np.ndarray            # int64
    output_tokens: np.ndarray            # int64
    hash_ids: list[list[int]] | None = None   # mooncake only: prefix blocks per row
    prefix_group: np.ndarray | None = None    # jsonl only (-1 = none)
    skipped: dict[str, int] = field(default_factory=dict)  # reason -> rows dropped
    lines: np.ndarray | None = None           # int64: each row's 1-based line in the file (messages name it)

    def __len__(self) -> int:
        return len(self.timestamps_ns)

    def summary(self) -> dict:
        return {"file": self.source, "format": self.format, "rows": len(self), "skipped": dict(self.skipped)}


def sniff(path: str | Path) -> str:
    p = Path(path)
    try:
        with open(p, "rb") as f:
            first = f.readline(65536).decode("utf-8", "replace").strip()
    except OSError as e:
        raise TraceError([f"{p}: cannot read: {e.strerror}"]) from None
    if first.startswith("{"):
        keys = set()
        try:
            keys = set(orjson.loads(first))
        except orjson.JSONDecodeError:
            pass
        if "input_length" in keys:
            return "mooncake"
        if "intended_ns" in keys:
            return "jsonl"
    cols = {c.strip().strip('"') for c in first.split(",")}
    if "ContextTokens" in cols:
        return "azure"
    if "Request tokens" in cols:
        return "burstgpt"
    raise TraceError([(f"{p}:1: cannot tell the trace format from this line; pass --trace-format "
                       f"({', '.join(FORMATS)})")])


def read(path: str | Path, fmt: str = "", *, skip_bad_rows: bool = False) -> Trace:
    p = Path(path)
    if not is_file(p):  # False, not OSError, for a name the system refuses (too long, a NUL byte)
        raise TraceError([f"{p}: no such trace file"])
    fmt = fmt or sniff(p)
    if fmt == "azure":
        return _csv(p, fmt, "TIMESTAMP", "ContextTokens", "GeneratedTokens", skip_bad_rows)
    if fmt == "burstgpt":
        return _csv(p, fmt, "Timestamp", "Request tokens", "Response tokens", skip_bad_rows)
    if fmt in ("mooncake", "jsonl"):
        return _jsonl(p, fmt, skip_bad_rows)
    raise TraceError([f"{p}: unknown trace format {fmt!r} (one of {', '.join(FORMATS)})"])


def _csv(p: Path, fmt: str, t_col: str, in_col: str, out_col: str, skip: bool) -> Trace:
    try:
        lf = pl.scan_csv(p, infer_schema=False)
        names = lf.collect_schema().names()
    except (pl.exceptions.PolarsError, OSError) as e:
        raise TraceError([f"{p}: not a readable CSV file: {e}"]) from None
    missing = [c for c in (t_col, in_col, out_col) if c not in names]
    if missing:
        raise TraceError([(f"{p}:1: missing column(s) {', '.join(map(repr, missing))} for the {fmt} format "
                           f"(found {', '.join(map(repr, names))})")])
    if fmt == "azure":
        ts = (pl.col(t_col).str.strip_chars()
              .str.to_datetime("%Y-%m-%d %H:%M:%S%.f", time_unit="ns", strict=False)
              .fill_null(pl.col(t_col).str.strip_chars()
                         .str.to_datetime("%Y-%m-%d %H:%M:%S", time_unit="ns", strict=False))
              .dt.epoch("ns"))
    else:
        # NaN, inf and seconds beyond int64 ns (~292 years) are not timestamps: null, reported by line.
        sec = pl.col(t_col).str.strip_chars().cast(pl.Float64, strict=False)
        ts = pl.when(sec.is_finite() & (sec.abs() < _MAX_S)).then((sec * 1e9).round()).cast(pl.Int64)

    def length(c: str) -> pl.Expr:
        return pl.col(c).str.strip_chars().cast(pl.Int64, strict=False)

    def select(frame: pl.LazyFrame) -> pl.LazyFrame:
        return frame.select("line", ts.alias("t"), length(in_col).alias("p"), length(out_col).alias("o"))

    # Ragged rows: Polars refuses some (with no line number) and silently accepts others, so the field
    # counts are checked first; a file with any is read line by line (its good rows keep their lines).
    frame, ragged = _csv_by_line(p, (t_col, in_col, out_col))
    try:
        df = select(lf.with_row_index("line", offset=2) if frame is None else frame.lazy()).collect(engine="streaming")
    except pl.exceptions.PolarsError as e:
        raise TraceError([f"{p}: unreadable CSV: {e}"]) from None
    # A cheap boolean pass first; line numbers and reasons only for the (usually zero) bad rows.
    t, pp, o = pl.col("t"), pl.col("p"), pl.col("o")
    unsorted = t < t.cum_max().forward_fill().shift(1)  # a bad (null) timestamp does not reset the order
    bad_mask = df.select((t.is_null() | (t < 0) | pp.is_null() | (pp < 0) | o.is_null() | (o < 0)
                          | unsorted.fill_null(False)).alias("bad"))["bad"]
    skipped: dict[str, int] = {}
    n_bad = int(bad_mask.sum()) + len(ragged)
    if n_bad:
        if not skip:
            reason = (pl.when(t.is_null()).then(pl.lit(f"{t_col} is not a valid timestamp"))
                      .when(t < 0).then(pl.lit(f"{t_col} is negative"))
                      .when(pp.is_null() | (pp < 0)).then(pl.lit(f"{in_col} is not an integer >= 0 (64-bit)"))
                      .when(o.is_null() | (o < 0)).then(pl.lit(f"{out_col} is not an integer >= 0 (64-bit)"))
                      .otherwise(pl.lit(f"{t_col} is earlier than the row before (the trace must be sorted)")))
            bad = df.filter(bad_mask).head(_SHOW).select("line", reason.alias("why")).rows()
            shown = sorted(ragged + bad)[:_SHOW]
            lines = [ln for ln, _ in shown] + [0] * (n_bad - len(shown))
            raise _bad_rows(p, lines, [w for _, w in shown] + [""] * (n_bad - len(shown)))
        skipped = {"bad_rows": n_bad}
        df = df.filter(~bad_mask)
    if fmt == "burstgpt":
        failed = df.filter(pl.col("o") == 0).height
        if failed:
            skipped["failed"] = failed
            df = df.filter(pl.col("o") != 0)
    stamps = df["t"].to_numpy().astype(np.int64)
    if fmt == "azure" and len(stamps):
        stamps = stamps - stamps[0]
    return _nonempty(Trace(str(p), fmt, stamps, df["p"].to_numpy().astype(np.int64),
                           df["o"].to_numpy().astype(np.int64), skipped=skipped,
                           lines=df["line"].to_numpy().astype(np.int64)))


def _csv_by_line(p: Path, cols: tuple[str, ...]) -> tuple[pl.DataFrame | None, list[tuple[int, str]]]:
    """No ragged row: (None, []) (Polars reads the file). Else the needed columns of the good rows as
    strings with each row's line, and (line, why) of every row whose field count differs from the header's."""
    import csv

    # surrogateescape: a byte that is not UTF-8 reads as a lone surrogate, which no UTF-8 text holds
    with open(p, newline="", encoding="utf-8", errors="surrogateescape") as f:
        reader = csv.reader(f)
        width = len(next(reader, []))
        if all(len(row) in (0, width) and not _undecodable(row) for row in reader):
            return None, []
        f.seek(0)
        reader = csv.reader(f)
        header = next(reader)
        where = [header.index(c) for c in cols]
        ragged: list[tuple[int, str]] = []
        out: dict[str, list] = {c: [] for c in ("line", *cols)}
        line = reader.line_num
        for row in reader:
            first, line = line + 1, reader.line_num
            if not row:
                continue
            if len(row) != width:
                ragged.append((first, f"has {len(row)} fields; the header has {width}"))
                continue
            if _undecodable(row):
                ragged.append((first, f"is not UTF-8 text ({_undecodable(row)})"))
                continue
            out["line"].append(first)
            for c, i in zip(cols, where):
                out[c].append(row[i])
    return pl.DataFrame(out, schema={"line": pl.UInt32, **{c: pl.String for c in cols}}), ragged


_SURROGATE = re.compile("[\udc80-\udcff]")


def _undecodable(row: list[str]) -> str:
    """'byte 0xff in field 2' for the first byte of a row (read with surrogateescape) that is not UTF-8,
    '' when there is none."""
    for i, text in enumerate(row, 1):
        m = _SURROGATE.search(text)
        if m:
            return f"byte 0x{ord(m.group()) - 0xdc00:02x} in field {i}"
    return ""


def _not_utf8(line: bytes) -> str:
    """'is not UTF-8 text (byte 0xff at column 7)' for a line that does not decode, else ''."""
    try:
        line.decode("utf-8")
    except UnicodeDecodeError as e:
        return f"is not UTF-8 text (byte 0x{line[e.start]:02x} at column {e.start + 1})"
    return ""


def _nonempty(trace: Trace) -> Trace:
    if not len(trace):
        dropped = sum(trace.skipped.values())
        counts = ", ".join(f"{n} {k.replace('_', ' ')}" for k, n in trace.skipped.items())
        why = f"every row was dropped ({counts})" if dropped else "it holds no rows"
        raise TraceError([f"{trace.source}: no requests to replay: {why}"])
    return trace


def _bad_rows(p: Path, lines: list[int], reasons: list[str]) -> TraceError:
    problems = [f"{p}:{ln}: {r}" for ln, r in zip(lines[:_SHOW], reasons[:_SHOW])]
    if len(lines) > _SHOW:
        problems.append(f"{p}: ... and {len(lines) - _SHOW} more bad rows")
    problems.append(f"{p}: {len(lines)} bad row(s); fix them, or pass --skip-bad-rows (trace.skip_bad_rows) "
                    f"to drop them and count them in the manifest")
    return TraceError(problems)


_JSONL_FIELDS = {"mooncake": ("timestamp", "input_length", "output_length", 1_000_000),
                 "jsonl": ("intended_ns", "prompt_tokens", "max_tokens", 1)}


def _jsonl(p: Path, fmt: str, skip: bool) -> Trace:
    t_key, in_key, out_key, ns_per_unit = _JSONL_FIELDS[fmt]
    ts, pin, pout, hashes, groups, lines = [], [], [], [], [], []
    bad_lines, bad_reasons = [], []
    last = None
    with open(p, "rb") as f:
        for ln, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = orjson.loads(line)
            except orjson.JSONDecodeError as e:
                bad_lines.append(ln)
                bad_reasons.append(_not_utf8(line) or f"not a JSON object ({e})")
                continue
            if not isinstance(obj, dict):
                bad_lines.append(ln)
                bad_reasons.append("not a JSON object")
                continue
            t, a, b = obj.get(t_key), obj.get(in_key), obj.get(out_key)
            why = None
            if not _num(t) or t != t:
                why = f"{t_key} is missing or not a number"
            elif t < 0:
                why = f"{t_key} is negative"
            elif t * ns_per_unit > _MAX_INT:
                why = f"{t_key} is beyond what 64-bit nanoseconds hold"
            elif not _int(a):
                why = f"{in_key} is missing or not an integer >= 0 (64-bit)"
            elif not _int(b):
                why = f"{out_key} is missing or not an integer >= 0 (64-bit)"
            elif last is not None and t * ns_per_unit < last:
                why = f"{t_key} is earlier than the row before (the trace must be sorted)"
            elif fmt == "mooncake" and not (isinstance(obj.get("hash_ids", []), list)
                                             and all(_int(h) for h in obj.get("hash_ids", []))):
                why = "hash_ids must be a list of integers"
            if why:
                bad_lines.append(ln)
                bad_reasons.append(why)
                continue
            assert _num(t)  # no `why` means t passed the checks above
            last = round(t * ns_per_unit)
            ts.append(last)
            lines.append(ln)
            pin.append(a)
            pout.append(b)
            if fmt == "mooncake":
                hashes.append(obj.get("hash_ids", []))
            else:
                g = obj.get("prefix_group")
                groups.append(g if _int(g) else -1)
    skipped = {}
    if bad_lines:
        if not skip:
            raise _bad_rows(p, bad_lines, bad_reasons)
        skipped["bad_rows"] = len(bad_lines)
    return _nonempty(Trace(str(p), fmt, np.array(ts, dtype=np.int64), np.array(pin, dtype=np.int64),
                           np.array(pout, dtype=np.int64), hash_ids=hashes if fmt == "mooncake" else None,
                           prefix_group=np.array(groups, dtype=np.int64) if fmt == "jsonl" else None,
                           skipped=skipped, lines=np.array(lines, dtype=np.int64)))


def _num(v: object) -> TypeGuard[int | float]:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _int(v: object) -> TypeGuard[int]:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= _MAX_INT
