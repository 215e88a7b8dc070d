"""HdrHistograms of loadgen's latency metrics, and HdrHistogram interval logs (`*.hlog`).

Units and range: values are recorded in microseconds, 3 significant digits, 1 µs … 1 h. Inputs
are int64 (or float) nanoseconds, as every duration in a run is; they are rounded to the nearest
microsecond (half up) before recording.

Decisions:
- 0 µs is in range. The package's `lowest_trackable_value = 1` sets the resolution, not a floor:
  with it, 0 has a bucket of its own and is recorded exactly. So any duration in [0, 500 ns)
  rounds to 0 µs and is recorded as 0, visible as the histogram's minimum. (Whether a gap may be
  0 at all is the ITL rule's business, not this module's.)
- Out of range: a negative duration (a clock or ordering bug), one above 1 h after rounding
  (3_600_000_000 µs: the configured highest trackable value, although the package itself would
  accept up to 2**32 - 1 µs), and NaN. These are counted, returned and written to the log next
  to their interval; never recorded and never dropped silently.
- Recording is vectorized: bucket indices are computed with numpy, exactly as the package's
  `_counts_index_for` does, counted with `np.bincount` and added to the histogram's counts in one
  step. Counts, min, max, percentiles and the encoding equal those of per-value `record_value`
  (tests/unit/test_hdr.py checks this on random data).

Interval log: the standard HdrHistogram format written by Java's `HistogramLogWriter` (1.3):
    #[Histogram log format version 1.3]
    #[StartTime: <wall s> (seconds since epoch), <date>]
    #[BaseTime: <wall s> (seconds since epoch)]
    "StartTimestamp","Interval_Length","Interval_Max","Interval_Compressed_Histogram"
    [Tag=<tag>,]<start s>,<length s>,<max>,<base64 compressed V2 histogram>
StartTime = BaseTime = the wall-clock time of the run's t0, so interval timestamps are seconds
from t0 (the same origin as the `*_ns` columns of requests.parquet). Interval_Max is in
milliseconds (values are µs; the ratio is 1000). Every interval is written, empty ones too, so a
quiet second shows as a count of 0 rather than as a hole. An interval with out-of-range values is
preceded by a comment `#[OutOfRange: N]` that standard readers skip and ours attaches to it.
"""
from __future__ import annotations

import ctypes
import os
import re
import sys
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable

import numpy as np
from hdrh.histogram import HdrHistogram

from loadgen import metrics

METRICS = ("send_lag", "ttft", "ttft_from_send", "itl", "tpot", "e2e")

LOWEST_US = 1
HIGHEST_US = 3_600_000_000          # 1 h
SIGNIFICANT_FIGURES = 3
LOG_FORMAT_VERSION = "1.3"
MAX_VALUE_UNIT_RATIO = 1000.0       # Interval_Max column: µs / 1000 = ms

# A duration in ns is in range iff 0 <= v < _LIMIT_NS: at or above it, v rounds to > HIGHEST_US.
_LIMIT_NS = HIGHEST_US * 1000 + 500
# Values converted per numpy pass: bounds the temporaries of record_ns to ~50 MB whatever the input.
_CHUNK = 1 << 21
# Up to this many values, record_ns counts by sorting the values' bucket indices (np.unique), beyond it
# with one dense pass over all buckets: a sort of ~6000 values costs about that pass.
_SPARSE_MAX = 6000
_LEGEND = '"StartTimestamp","Interval_Length","Interval_Max","Interval_Compressed_Histogram"'
_BAD_TAG = re.compile(r"[,\s]")
_START_TIME = re.compile(r"#\[StartTime: *([-+\d.eE]+)")
_BASE_TIME = re.compile(r"#\[BaseTime: *([-+\d.eE]+)")
_OUT_OF_RANGE = re.compile(r"#\[OutOfRange: *(\d+)\]")


def new_histogram() -> HdrHistogram:
    return HdrHistogram(LOWEST_US, HIGHEST_US, SIGNIFICANT_FIGURES)


@dataclass
class Recorded:
    # A histogram (µs) and the number of values that could not go into it.
    hist: HdrHistogram
    out_of_range: int = 0

    def add(self, other: "Recorded") -> None:
        # In place, exact (bucket counts add).
        _add(self.hist, other.hist)
        self.out_of_range += other.out_of_range


@dataclass
class Interval:
    start_s: float          # seconds from the log's base time (for our logs: from the run's t0)
    length_s: float
    hist: HdrHistogram      # values in µs
    tag: str | None = None
    out_of_range: int = 0   # from our `#[OutOfRange: N]` comment; 0 in other tools' logs


# ---------------------------------------------------------------------------------------------
# Recording

def in_range(values_ns: np.ndarray) -> np.ndarray:
    # Boolean mask of the durations (ns) that round into [0, HIGHEST_US] µs; False for NaN.
    v = np.asarray(values_ns)
    return (v >= 0) & (v < _LIMIT_NS)


def ns_to_us(values_ns: np.ndarray) -> np.ndarray:
    # Nearest µs, half up, as int64. Only meaningful for in-range values (see in_range).
    v = np.asarray(values_ns)
    if v.dtype.kind in "iu":
        return (v.astype(np.int64, copy=False) + 500) // 1000
    return np.floor((v.astype(np.float64, copy=False) + 500.0) / 1000.0).astype(np.int64)


def counts_index(hist: HdrHistogram, values_us: np.ndarray) -> np.ndarray:
    # Vectorized HdrHistogram._counts_index_for, for int64 values in [0, 2**53).
    v = np.asarray(values_us, dtype=np.int64)
    # bit length of (v | sub_bucket_mask), read from the float64 exponent (exact below 2**53)
    bits = ((v | hist.sub_bucket_mask).astype(np.float64).view(np.int64) >> 52) - 1022
    bucket = bits - hist.unit_magnitude - (hist.sub_bucket_half_count_magnitude + 1)
    sub_bucket = v >> (bucket + hist.unit_magnitude)
    index: np.ndarray = ((bucket + 1) << hist.sub_bucket_half_count_magnitude) + sub_bucket \
        - hist.sub_bucket_half_count
    return index


def _add_index_counts(hist: HdrHistogram, index: np.ndarray, counts: np.ndarray,
                      fast: bool = True) -> None:
    # Adds counts[i] at counts index index[i]; index is sorted, unique and < hist.counts_len.
    if index.size == 0:
        return
    view = np.ctypeslib.as_array(hist.counts) if fast else None
    if view is None or view.dtype != np.uint64 or view.shape[0] != hist.counts_len:
        # Public API: one record_value per distinct bucket, at the bucket's lowest value.
        for i, c in zip(index.tolist(), counts.tolist()):
            hist.record_value(hist.get_value_from_index(i), c)
        return
    # Same state as record_value leaves: counts, total, and min/max at values of the same
    # buckets (get_min_value/get_max_value and encode() only look at their buckets).
    view[index] += counts.astype(np.uint64)
    hist.total_count += int(counts.sum())
    hist.min_value = min(hist.min_value, hist.get_value_from_index(int(index[0])))
    hist.max_value = max(hist.max_value, hist.get_value_from_index(int(index[-1])))


def record_ns(hist: HdrHistogram, values_ns: np.ndarray, *, _fast: bool = True) -> int:
    # Records durations given in ns into hist (µs); returns how many were out of range.
    v = np.asarray(values_ns)
    if v.dtype.kind not in "iuf":
        raise TypeError(f"durations must be an int or float array, got dtype {v.dtype}")
    v = v.ravel()
    if v.size <= _SPARSE_MAX:
        # Few values (a 1 s interval's): sort their indices rather than pass over every bucket
        # (~23 500 of them) as the dense count below does. Same counts.
        ok = in_range(v)
        index, counts = np.unique(counts_index(hist, ns_to_us(v[ok])), return_counts=True)
        _add_index_counts(hist, index, counts, fast=_fast)
        return v.size - int(np.count_nonzero(ok))
    dense = np.zeros(hist.counts_len, dtype=np.int64)
    out = 0
    for lo in range(0, v.size, _CHUNK):
        part = v[lo:lo + _CHUNK]
        ok = in_range(part)
        n_ok = int(np.count_nonzero(ok))
        out += part.size - n_ok
        if n_ok:
            us = ns_to_us(part if n_ok == part.size else part[ok])
            dense += np.bincount(counts_index(hist, us), minlength=hist.counts_len)
    index = np.flatnonzero(dense)
    _add_index_counts(hist, index, dense[index], fast=_fast)
    return out


def record(values_ns: np.ndarray) -> Recorded:
    hist = new_histogram()
    return Recorded(hist, record_ns(hist, values_ns))


def clear(hist: HdrHistogram) -> None:
    # The state of a new histogram, in place. A new one per interval would be cyclic garbage (the package's
    # histogram and its encoder refer to each other): ~180 KiB counts arrays that only a full collection
    # frees, which a long run's collector seldom makes. The package's reset() zeroes the counts one Python
    # assignment at a time (~23 500); this is one memset.
    ctypes.memset(ctypes.addressof(hist.counts), 0, ctypes.sizeof(hist.counts))
    hist.total_count = 0
    hist.min_value, hist.max_value = sys.maxsize, 0
    hist.start_time_stamp_msec, hist.end_time_stamp_msec = sys.maxsize, 0


def _add(dst: HdrHistogram, src: HdrHistogram) -> None:
    # The package's `add`, minus a quirk: adding an empty histogram sets dst's minimum to 0
    # (its get_min_value() is 0 when empty), so empty ones are skipped: they add nothing.
    if src.get_total_count():
        dst.add(src)


def merge(hists: Iterable[HdrHistogram]) -> HdrHistogram:
    # Exact: bucket counts add; the inputs are left unchanged.
    total = new_histogram()
    for h in hists:
        _add(total, h)
    return total


# ---------------------------------------------------------------------------------------------
# Summary

def _counts(hist: HdrHistogram) -> np.ndarray:
    # The histogram's bucket counts as int64 (a copy), one per counts index.
    return np.ctypeslib.as_array(hist.counts)[:hist.counts_len].astype(np.int64)


def _index_ranges(hist: HdrHistogram) -> tuple[np.ndarray, np.ndarray]:
    # For every counts index: its lowest equivalent value and the size of its value range
    # (vectorized get_value_from_index / _hdr_size_of_equiv_value_range).
    i = np.arange(hist.counts_len, dtype=np.int64)
    bucket = (i >> hist.sub_bucket_half_count_magnitude) - 1
    sub = (i & (hist.sub_bucket_half_count - 1)) + hist.sub_bucket_half_count
    first = bucket < 0
    sub[first] -= hist.sub_bucket_half_count
    bucket[first] = 0
    return sub << (bucket + hist.unit_magnitude), np.int64(1) << (bucket + hist.unit_magnitude)


def percentiles_us(hist: HdrHistogram, percentiles: Iterable[float]) -> dict[float, int]:
    # The value at the nearest rank ceil(p/100 * n) (metrics.rank), as HdrHistogram's Java and JavaScript
    # implementations take it: the highest equivalent value of the bucket holding that rank (lowest for
    # p = 0). The Python `hdrh` package rounds the rank instead (at n = 76 its p99 is the 75th value);
    # loadgen does not follow it, so that HDR and exact percentiles agree. An empty histogram gives 0.
    cum = np.cumsum(_counts(hist))
    total = hist.get_total_count()
    low, size = _index_ranges(hist)
    out = {}
    for p in percentiles:
        target = metrics.rank(min(p, 100.0) / 100, total) if total else 1
        i = int(np.searchsorted(cum, target, side="left"))
        if i >= hist.counts_len:
            out[p] = 0
        else:
            out[p] = int(low[i] + size[i] - 1) if p else int(low[i])
    return out


def mean_us(hist: HdrHistogram) -> float:
    # The package's get_mean_value (each bucket at its middle value), exact integer sum.
    counts = _counts(hist)
    nz = np.flatnonzero(counts)
    if nz.size == 0:
        return 0.0
    low, size = _index_ranges(hist)
    mid = low[nz] + (size[nz] >> 1)
    total = sum(int(c) * int(m) for c, m in zip(counts[nz].tolist(), mid.tolist()))
    count: int = hist.get_total_count()
    return float(total) / count


def summary_ms(h: HdrHistogram | Recorded) -> dict[str, Any]:
    # Milliseconds (floats); percentiles are HdrHistogram's: the highest value equivalent to the
    # bucket holding the rank, so at most 0.1 % above the sample. Empty: count 0, the rest None.
    # out_of_range: the count for a Recorded, None (unknown) for a bare histogram.
    rec = h if isinstance(h, Recorded) else Recorded(h, None)  # type: ignore[arg-type]
    hist = rec.hist
    count = hist.get_total_count()
    out = {"p50": None, "p90": None, "p99": None, "p999": None, "max": None, "mean": None,
           "count": count, "out_of_range": rec.out_of_range}
    if count:
        p = percentiles_us(hist, (50.0, 90.0, 99.0, 99.9))
        out.update(p50=p[50.0] / 1000.0, p90=p[90.0] / 1000.0, p99=p[99.0] / 1000.0,
                   p999=p[99.9] / 1000.0, max=hist.get_max_value() / 1000.0,
                   mean=mean_us(hist) / 1000.0)
    return out


# ---------------------------------------------------------------------------------------------
# Interval logs: writing

def log_path(run_dir: str | os.PathLike[str], metric: str, worker: int | None = None) -> Path:
    # One log per metric; each worker process of a --workers run writes its own, <metric>.<worker>.hlog.
    if metric not in METRICS:
        raise ValueError(f"unknown metric {metric!r}; expected one of {', '.join(METRICS)}")
    return Path(run_dir) / (f"{metric}.hlog" if worker is None else f"{metric}.{worker}.hlog")


def interval_logs(run_dir: str | os.PathLike[str], metric: str) -> list[Path]:
    # The logs of one metric in a results folder, to be merged: <metric>.hlog (and, in folders of
    # --workers runs written before the shares were merged at the end, <metric>.<worker>.hlog beside
    # it); where there is none, the shares' _parts/<metric>.<worker>.hlog of a --workers run whose driver
    # was killed before it merged them (results/merge.py).
    p = Path(run_dir)
    top = sorted({*p.glob(f"{metric}.hlog"), *p.glob(f"{metric}.*.hlog")})
    return top or sorted((p / "_parts").glob(f"{metric}.*.hlog"))


class IntervalLogWriter:
    # Appends one line per interval to `path` and flushes it, so the file is a readable log after
    # every interval, even if the run is killed (a torn last line is skipped by the reader).
    # Times are int ns from the run's t0; start_wall_s is the wall-clock time (s) of t0.

    def __init__(self, path: str | os.PathLike[str], *, start_wall_s: float, tag: str | None = None,
                 comment: str | None = None):
        if tag is not None and (not tag or _BAD_TAG.search(tag)):
            raise ValueError(f"bad tag {tag!r}: must be non-empty, without commas or whitespace")
        if comment is not None and "\n" in comment:
            raise ValueError("comment must be one line")
        self.path = Path(path)
        self.tag = tag
        self._prefix = f"Tag={tag}," if tag else ""
        self._file = open(self.path, "w", encoding="ascii", newline="\n")
        date = datetime.fromtimestamp(start_wall_s, tz=timezone.utc).isoformat(timespec="milliseconds")
        lines = [f"#[Histogram log format version {LOG_FORMAT_VERSION}]",
                 f"#[StartTime: {start_wall_s:.3f} (seconds since epoch), {date}]",
                 f"#[BaseTime: {start_wall_s:.3f} (seconds since epoch)]",
                 "#[loadgen: values in microseconds, 3 significant digits, 1 us .. 1 h; "
                 "Interval_Max in milliseconds; timestamps in seconds from the run's t0]"]
        if comment:
            lines.append(f"#{comment}")
        lines.append(_LEGEND)
        self._file.write("\n".join(lines) + "\n")
        self._file.flush()

    def write_interval(self, start_ns: int, end_ns: int, hist: HdrHistogram | Recorded) -> None:
        if end_ns < start_ns or start_ns < 0:
            raise ValueError(f"bad interval [{start_ns}, {end_ns}) ns")
        rec = hist if isinstance(hist, Recorded) else Recorded(hist)
        text = ""
        if rec.out_of_range:
            text = f"#[OutOfRange: {rec.out_of_range}]\n"
        payload = rec.hist.encode().decode("ascii")
        text += (f"{self._prefix}{start_ns / 1e9:.3f},{(end_ns - start_ns) / 1e9:.3f},"
                 f"{rec.hist.get_max_value() / MAX_VALUE_UNIT_RATIO:.3f},{payload}\n")
        self._file.write(text)   # one write per interval: lines are never interleaved half-done
        self._file.flush()

    def write_values(self, start_ns: int, end_ns: int, values_ns: np.ndarray) -> Recorded:
        rec = record(values_ns)
        self.write_interval(start_ns, end_ns, rec)
        return rec

    def close(self, fsync: bool = False) -> None:
        if self._file.closed:
            return
        self._file.flush()
        if fsync:
            os.fsync(self._file.fileno())
        self._file.close()

    def __enter__(self) -> "IntervalLogWriter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def write_interval_log(path: str | os.PathLike[str], samples_t_ns: np.ndarray, values_ns: np.ndarray,
                       *, start_wall_s: float, base_ns: int = 0,
                       interval_ns: int = 1_000_000_000, tag: str | None = None,
                       end_ns: int | None = None) -> Recorded:
    # Sample i completed at samples_t_ns[i] (ns from t0) with duration values_ns[i] (ns). Interval
    # k covers [base_ns + k*interval_ns, base_ns + (k+1)*interval_ns): a sample exactly on a
    # boundary belongs to the later interval. Intervals run from k = 0 to the last sample, or to
    # end_ns (exclusive) if that is later, empty ones included. Written atomically (temp + rename).
    # Returns the whole run: the merged histogram and the out-of-range count.
    t = np.asarray(samples_t_ns)
    v = np.asarray(values_ns)
    if t.shape != v.shape or t.ndim != 1:
        raise ValueError(f"samples_t_ns and values_ns must be 1-d of one length, got {t.shape} "
                         f"and {v.shape}")
    if t.dtype.kind not in "iu":
        raise TypeError(f"samples_t_ns must be integer ns, got dtype {t.dtype}")
    if interval_ns <= 0:
        raise ValueError(f"interval_ns must be > 0, got {interval_ns}")
    t = t.astype(np.int64, copy=False)
    if t.size and int(t.min()) < base_ns:
        raise ValueError(f"a sample at {int(t.min())} ns is before base_ns={base_ns}")
    k = (t - base_ns) // interval_ns
    n_intervals = int(k.max()) + 1 if k.size else 0
    if end_ns is not None:
        n_intervals = max(n_intervals, -(-(end_ns - base_ns) // interval_ns))

    ok = in_range(v)
    out_per_interval = np.bincount(k[~ok], minlength=n_intervals)
    k_ok = k[ok]
    total = new_histogram()
    idx = counts_index(total, ns_to_us(v[ok]))
    if k_ok.size > 1 and not bool(np.all(k_ok[1:] >= k_ok[:-1])):
        order = np.argsort(k_ok, kind="stable")  # fast when nearly sorted (completion order)
        k_ok, idx = k_ok[order], idx[order]
    bounds = np.searchsorted(k_ok, np.arange(n_intervals + 1))
    total_out = int(out_per_interval.sum())

    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with IntervalLogWriter(tmp, start_wall_s=start_wall_s, tag=tag) as w:
            for j in range(n_intervals):
                hist = new_histogram()
                part = idx[bounds[j]:bounds[j + 1]]
                if part.size:
                    dense = np.bincount(part, minlength=hist.counts_len)
                    nz = np.flatnonzero(dense)
                    _add_index_counts(hist, nz, dense[nz])
                    _add(total, hist)
                start = base_ns + j * interval_ns
                w.write_interval(start, start + interval_ns,
                                 Recorded(hist, int(out_per_interval[j])))
            w.close(fsync=True)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return Recorded(total, total_out)


# ---------------------------------------------------------------------------------------------
# Interval logs: reading

def read_interval_log(path: str | os.PathLike[str]) -> list[Interval]:
    # Reads logs of any HdrHistogram writer. Start times follow the package's HistogramLogReader:
    # timestamp + BaseTime - StartTime; without StartTime the first timestamp is the start, and
    # without BaseTime timestamps more than a year before StartTime are taken as relative.
    # Every bad line is reported at once (ValueError, path:line); a last line without its newline
    # is the torn write of a killed run and is skipped.
    path = Path(path)
    text = path.read_text(encoding="ascii", errors="replace")
    lines = text.split("\n")
    torn_tail = not text.endswith("\n")
    start_time = base_time = None
    pending_out = 0
    out: list[Interval] = []
    problems: list[str] = []
    for no, line in enumerate(lines, start=1):
        line = line.rstrip("\r")
        if not line.strip() or line.startswith('"StartTimestamp"'):
            continue
        if line.startswith("#"):
            if m := _START_TIME.match(line):
                start_time = float(m.group(1))
            elif m := _BASE_TIME.match(line):
                base_time = float(m.group(1))
            elif m := _OUT_OF_RANGE.match(line):
                pending_out += int(m.group(1))
            continue
        tag = None
        body = line
        if body.startswith("Tag="):
            tag, _, body = body[4:].partition(",")
        fields = body.split(",", 3)
        try:
            if len(fields) != 4:
                raise ValueError(f"expected 4 comma-separated fields, got {len(fields)}")
            ts, length = float(fields[0]), float(fields[1])
            hist = HdrHistogram.decode(fields[3].strip())
        except Exception as e:  # decoding raises several types (binascii, zlib, Hdr*Exception)
            if no == len(lines) and torn_tail:
                continue
            problems.append(f"{path}:{no}: bad interval line ({type(e).__name__}: {e})")
            continue
        if start_time is None:
            start_time = ts
        if base_time is None:
            base_time = start_time if ts < start_time - 365 * 24 * 3600.0 else 0.0
        out.append(Interval(ts + base_time - start_time, length, hist, tag, pending_out))
        pending_out = 0
    if problems:
        raise ValueError("\n".join(problems))
    return out


def merge_intervals(intervals: Iterable[Interval], *, tag: str | None = None) -> Recorded:
    # tag=None merges every interval; otherwise only those with that tag.
    chosen = [iv for iv in intervals if tag is None or iv.tag == tag]
    return Recorded(merge(iv.hist for iv in chosen), sum(iv.out_of_range for iv in chosen))


def merge_log(path: str | os.PathLike[str], *, tag: str | None = None) -> HdrHistogram:
    return merge_intervals(read_interval_log(path), tag=tag).hist


def merge_logs(paths: Iterable[str | os.PathLike[str]], *, tag: str | None = None) -> Recorded:
    # Several workers' logs of one metric -> the whole run, exactly.
    total = Recorded(new_histogram(), 0)
    for p in paths:
        total.add(merge_intervals(read_interval_log(p), tag=tag))
    return total


__all__ = ["METRICS", "LOWEST_US", "HIGHEST_US", "SIGNIFICANT_FIGURES", "Recorded", "Interval",
           "new_histogram", "in_range", "ns_to_us", "counts_index", "record_ns", "record",
           "merge", "percentiles_us", "mean_us", "summary_ms", "log_path", "interval_logs", "IntervalLogWriter",
           "write_interval_log",
           "read_interval_log", "merge_intervals", "merge_log", "merge_logs"]
