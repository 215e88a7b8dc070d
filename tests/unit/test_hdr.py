import math

import numpy as np
import pytest
from hdrh.histogram import HdrHistogram
from hdrh.log import HistogramLogReader, HistogramLogWriter
from hypothesis import example, given, settings, strategies as st

from loadgen.results import hdr

S = 1_000_000_000  # ns per s
MS = 1_000_000     # ns per ms
WALL = 1_732_930_000.25  # an arbitrary t0 wall-clock time, s


def per_value(values_ns):
    # Reference: the package's record_value once per value, with the documented rules written
    # out independently of loadgen.results.hdr (half-up rounding to µs; < 0, > 1 h and NaN out of range).
    hist, out = hdr.new_histogram(), 0
    for v in values_ns:
        v = v.item() if hasattr(v, "item") else v
        if isinstance(v, float):
            if not (0 <= v < math.inf):
                out += 1
                continue
            us = math.floor((v + 500.0) / 1000.0)
        else:
            if v < 0:
                out += 1
                continue
            us = (v + 500) // 1000
        if us > hdr.HIGHEST_US:
            out += 1
            continue
        assert hist.record_value(us)
        # (v + 500) // 1000 fits easily; a False here would mean the 1 h bound is wrong
    return hist, out


PERCENTILES = (0.0, 1.0, 25.0, 50.0, 90.0, 99.0, 99.9, 99.99, 100.0)


def counts_of(h):
    return np.ctypeslib.as_array(h.counts)[:h.counts_len].copy()


def assert_same(a: HdrHistogram, b: HdrHistogram):
    # Every bucket count, total, min, max, the wire encoding and the percentiles. (The package's
    # own equals() and get_mean_value() walk all 23,552 buckets in Python: 0.2 s a call, so
    # test_package_agrees_with_numpy_percentiles_and_mean checks them on a few cases instead.)
    assert a.get_total_count() == b.get_total_count()
    assert np.array_equal(counts_of(a), counts_of(b))
    assert (a.get_min_value(), a.get_max_value()) == (b.get_min_value(), b.get_max_value())
    assert a.encode() == b.encode()
    assert hdr.percentiles_us(a, PERCENTILES) == hdr.percentiles_us(b, PERCENTILES)


def histogram_of_us(values_us):
    h = hdr.new_histogram()
    for v in values_us:
        assert h.record_value(v)
    return h


# ---------------------------------------------------------------------------------------------
# Vectorized recording

def test_counts_index_matches_package_at_bucket_edges():
    h = hdr.new_histogram()
    # every power of two up to 2**32 and its neighbours: where bucket and sub-bucket change
    values = sorted({max(0, (1 << b) + d) for b in range(33) for d in (-1, 0, 1)} | {0, 1, 2047})
    values = [v for v in values if v <= 2**32 - 1]
    got = hdr.counts_index(h, np.array(values, dtype=np.int64))
    assert got.tolist() == [h._counts_index_for(v) for v in values]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(
    st.integers(min_value=0, max_value=5_000_000),                 # the µs range, finely
    st.integers(min_value=0, max_value=4 * 3600 * S),              # up to 4 h, past the top
    st.integers(min_value=-10 * S, max_value=-1),                  # negative: out of range
    st.sampled_from([0, 499, 500, 1_499, 1_500, hdr.HIGHEST_US * 1000 + 499,
                     hdr.HIGHEST_US * 1000 + 500]),                # rounding edges
), max_size=400))
def test_vectorized_equals_per_value_ints(values):
    ref, ref_out = per_value(values)
    for fast in (True, False):  # the counts-array path and the public record_value path
        h = hdr.new_histogram()
        out = hdr.record_ns(h, np.array(values, dtype=np.int64), _fast=fast)
        assert out == ref_out
        assert_same(h, ref)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.one_of(
    st.floats(min_value=0.0, max_value=1e10, allow_nan=False),    # e.g. ITL gap / k tokens
    st.floats(min_value=-1e6, max_value=-1e-3),                    # negative: out of range
    st.just(float("nan")), st.just(float("inf")),                  # out of range
), max_size=300))
def test_vectorized_equals_per_value_floats(values):
    ref, ref_out = per_value(values)
    h = hdr.new_histogram()
    assert hdr.record_ns(h, np.array(values, dtype=np.float64)) == ref_out
    assert_same(h, ref)


@pytest.mark.parametrize("sparse_max", [0, 6000])  # the dense pass, then the sorted indices
def test_vectorized_equals_per_value_large_random_and_chunked(monkeypatch, sparse_max):
    # Several chunks of the numpy pass, and recording into a histogram that already has data.
    monkeypatch.setattr(hdr, "_CHUNK", 1000)
    monkeypatch.setattr(hdr, "_SPARSE_MAX", sparse_max)
    rng = np.random.default_rng(7)
    values = np.concatenate([rng.lognormal(17, 1.5, 5000).astype(np.int64),
                             rng.integers(-5 * S, 0, 20), rng.integers(3600 * S, 5000 * S, 30)])
    rng.shuffle(values)
    ref, ref_out = per_value(values[:3000])
    ref2, ref_out2 = per_value(values[3000:])
    ref.add(ref2)
    h = hdr.new_histogram()
    out = hdr.record_ns(h, values[:3000]) + hdr.record_ns(h, values[3000:])
    assert out == ref_out + ref_out2 == 50
    assert_same(h, ref)


@pytest.mark.parametrize("values_ns, recorded_us, out_of_range", [
    ([0], [0], 0),                                  # 0 is in range: its own bucket, exact
    ([499], [0], 0),                                # < 0.5 µs rounds to 0 µs, still recorded
    ([500, 1_499], [1, 1], 0),                      # half up
    ([-1], [], 1),                                  # negative: out of range, never clamped to 0
    ([-S, 5 * MS, -1, 7 * MS], [5000, 7000], 2),    # negatives do not disturb in-range values
    ([hdr.HIGHEST_US * 1000 + 499], [hdr.HIGHEST_US], 0),   # rounds to exactly 1 h: in range
    ([hdr.HIGHEST_US * 1000 + 500], [], 1),         # rounds past 1 h: out of range
    ([5000 * S, 20 * MS, 2**62], [20000], 2),       # far above 1 h, and near int64 max
    ([], [], 0),                                    # nothing
])
def test_out_of_range_counted_and_in_range_unaffected(values_ns, recorded_us, out_of_range):
    h = hdr.new_histogram()
    assert hdr.record_ns(h, np.array(values_ns, dtype=np.int64)) == out_of_range
    assert_same(h, histogram_of_us(recorded_us))


@pytest.mark.parametrize("values_ns, recorded_us, out_of_range", [
    ([float("nan"), 1e6], [1000], 1),               # NaN: out of range
    ([float("inf"), -float("inf")], [], 2),         # infinities: out of range
    ([-0.4, 0.4], [0], 1),                          # negative by a fraction: out of range
    ([2_500.0, 1e6 / 3], [3, 333], 0),              # ITL gap divided over k tokens
])
def test_out_of_range_floats(values_ns, recorded_us, out_of_range):
    rec = hdr.record(np.array(values_ns, dtype=np.float64))
    assert rec.out_of_range == out_of_range
    assert_same(rec.hist, histogram_of_us(recorded_us))


def test_record_rejects_non_numeric():
    with pytest.raises(TypeError):
        hdr.record_ns(hdr.new_histogram(), np.array(["1"]))


# ---------------------------------------------------------------------------------------------
# Merge

@settings(max_examples=25, deadline=None)
@given(st.lists(st.lists(st.integers(min_value=0, max_value=3600 * S), max_size=80),
                min_size=1, max_size=6))
@example(parts=[[], [500]])  # an idle worker: the package's add() would zero the minimum
def test_merge_of_workers_equals_one_histogram_of_all(parts):
    whole = hdr.record(np.array([v for p in parts for v in p], dtype=np.int64)).hist
    workers = [hdr.record(np.array(p, dtype=np.int64)).hist for p in parts]
    assert_same(hdr.merge(workers), whole)
    acc = hdr.Recorded(hdr.new_histogram())
    for w in workers:
        acc.add(hdr.Recorded(w, 1))
    assert_same(acc.hist, whole)
    assert acc.out_of_range == len(parts)


def test_merge_of_worker_logs_equals_one_histogram_of_all(tmp_path):
    rng = np.random.default_rng(3)
    t = np.sort(rng.integers(0, 10 * S, 6000))
    v = rng.lognormal(17, 1.0, 6000).astype(np.int64)
    v[::500] = -1  # 12 out of range
    worker = rng.integers(0, 3, 6000)
    paths = []
    for w in range(3):
        p = tmp_path / f"ttft.w{w}.hlog"
        hdr.write_interval_log(p, t[worker == w], v[worker == w], start_wall_s=WALL)
        paths.append(p)
    total = hdr.merge_logs(paths)
    whole = hdr.record(v)
    assert total.out_of_range == whole.out_of_range == 12
    assert_same(total.hist, whole.hist)
    # and one log merged over its intervals equals the histogram the writer returned
    rec = hdr.write_interval_log(tmp_path / "all.hlog", t, v, start_wall_s=WALL)
    assert_same(hdr.merge_log(tmp_path / "all.hlog"), rec.hist)
    assert_same(rec.hist, whole.hist)


# ---------------------------------------------------------------------------------------------
# Interval logs

@pytest.mark.parametrize("t_ns, base_ns, interval_ns, expected_interval", [
    ([0], 0, S, [0]),                               # t0 opens interval 0
    ([S - 1], 0, S, [0]),                           # last ns of the first second
    ([S], 0, S, [1]),                               # exactly 1 s: the second interval
    ([S + 1, 2 * S], 0, S, [1, 2]),                 # the next boundary likewise
    ([500 * MS, 749 * MS, 750 * MS], 500 * MS, 250 * MS, [0, 0, 1]),  # shifted, shorter grid
    ([3 * S, 0], 0, S, [3, 0]),                     # samples out of time order
])
def test_interval_boundaries(tmp_path, t_ns, base_ns, interval_ns, expected_interval):
    values = [(i + 1) * MS for i in range(len(t_ns))]  # distinct, to tell samples apart
    path = tmp_path / "x.hlog"
    hdr.write_interval_log(path, np.array(t_ns), np.array(values), start_wall_s=WALL,
                           base_ns=base_ns, interval_ns=interval_ns)
    ivs = hdr.read_interval_log(path)
    assert len(ivs) == max(expected_interval) + 1
    for j, iv in enumerate(ivs):
        assert iv.start_s == pytest.approx((base_ns + j * interval_ns) / S, abs=1e-9)
        assert iv.length_s == pytest.approx(interval_ns / S, abs=1e-9)
        mine = [v // 1000 for v, k in zip(values, expected_interval) if k == j]
        assert_same(iv.hist, histogram_of_us(mine))


@pytest.mark.parametrize("t_ns, end_ns, counts", [
    ([0, 3 * S], None, [1, 0, 0, 1]),               # a quiet gap shows as empty intervals
    ([0], 3 * S, [1, 0, 0]),                        # end_ns adds a quiet tail
    ([0], 3 * S + 1, [1, 0, 0, 0]),                 # a partial last interval still counts
    ([], 2 * S, [0, 0]),                            # no sample at all, but a run of 2 s
    ([], None, []),                                 # nothing: a header-only log
])
def test_empty_intervals(tmp_path, t_ns, end_ns, counts):
    path = tmp_path / "x.hlog"
    rec = hdr.write_interval_log(path, np.array(t_ns, dtype=np.int64),
                                 np.full(len(t_ns), 5 * MS), start_wall_s=WALL, end_ns=end_ns)
    ivs = hdr.read_interval_log(path)
    assert [iv.hist.get_total_count() for iv in ivs] == counts
    assert [iv.start_s for iv in ivs] == [float(j) for j in range(len(counts))]
    assert rec.hist.get_total_count() == len(t_ns)
    assert hdr.merge_log(path).get_total_count() == len(t_ns)
    # the package's reader agrees on the empty ones too
    reader = HistogramLogReader(str(path), hdr.new_histogram())
    got = []
    while (h := reader.get_next_interval_histogram()) is not None:
        got.append(h.get_total_count())
    reader.close()
    assert got == counts


def sample_run(seed=11, n=3000, seconds=5):
    rng = np.random.default_rng(seed)
    t = rng.integers(0, seconds * S, n)
    v = rng.lognormal(17, 1.2, n).astype(np.int64)
    v[:7] = [-5, -1, 4000 * S, 0, 1, 499, 3600 * S]  # 3 out of range, edge values in range
    return t, v


def expected_intervals(t, v, seconds):
    out = []
    for j in range(seconds):
        sel = (t >= j * S) & (t < (j + 1) * S)
        out.append(hdr.record(v[sel]))
    return out


def test_round_trip_ours_to_ours(tmp_path):
    t, v = sample_run()
    path = tmp_path / "ttft.hlog"
    rec = hdr.write_interval_log(path, t, v, start_wall_s=WALL, tag="ttft")
    ivs = hdr.read_interval_log(path)
    expect = expected_intervals(t, v, 5)
    assert len(ivs) == 5
    for j, (iv, ex) in enumerate(zip(ivs, expect)):
        assert (iv.start_s, iv.length_s, iv.tag) == (float(j), 1.0, "ttft")
        assert iv.out_of_range == ex.out_of_range
        assert_same(iv.hist, ex.hist)
    assert rec.out_of_range == 3 == sum(iv.out_of_range for iv in ivs)
    assert hdr.merge_intervals(ivs).out_of_range == 3
    assert not list(tmp_path.glob(".*tmp"))  # the temp file was renamed away


def test_round_trip_ours_to_package_reader(tmp_path):
    t, v = sample_run()
    path = tmp_path / "ttft.hlog"
    hdr.write_interval_log(path, t, v, start_wall_s=WALL, tag="ttft")
    reader = HistogramLogReader(str(path), hdr.new_histogram())
    got = []
    while (h := reader.get_next_interval_histogram()) is not None:
        got.append(h)
    assert reader.get_start_time_sec() == pytest.approx(WALL, abs=1e-3)
    reader.close()
    expect = expected_intervals(t, v, 5)
    assert len(got) == 5
    for j, (h, ex) in enumerate(zip(got, expect)):
        # the package stamps absolute times in ms: StartTime + the interval's offset
        assert h.get_start_time_stamp() == pytest.approx((round(WALL, 3) + j) * 1000, abs=1e-3)
        assert h.get_end_time_stamp() == pytest.approx((round(WALL, 3) + j + 1) * 1000, abs=1e-3)
        assert h.get_tag() == "ttft"
        assert_same(h, ex.hist)
    # the reader's own whole-run merge (add_next_interval_histogram)
    reader = HistogramLogReader(str(path), hdr.new_histogram())
    while reader.add_next_interval_histogram() is not None:
        pass
    reader.close()
    assert_same(reader.reference_histogram, hdr.merge_log(path))


@pytest.mark.parametrize("headers, first_ts", [
    (True, 100.0),          # StartTime and BaseTime, timestamps relative to BaseTime
    (False, WALL),          # no header at all, absolute timestamps: the first one is the start
])
def test_round_trip_package_writer_to_ours(tmp_path, headers, first_ts):
    t, v = sample_run()
    expect = expected_intervals(t, v, 5)
    path = tmp_path / "pkg.hlog"
    with open(path, "w") as f:
        w = HistogramLogWriter(f)
        w.output_log_format_version()
        if headers:
            # (the package's output_start_time is broken: it calls datetime.iso_format)
            w.output_comment(f"[StartTime: {WALL + 100:f} (seconds since epoch), then]")
            w.output_base_time(WALL * 1000)
        w.output_legend()
        for j, ex in enumerate(expect):
            # (a start of 0 would make the package fall back to the histogram's own stamps)
            w.output_interval_histogram(ex.hist, first_ts + j, first_ts + j + 1)
    ivs = hdr.read_interval_log(path)
    assert len(ivs) == 5
    for j, (iv, ex) in enumerate(zip(ivs, expect)):
        assert iv.start_s == pytest.approx(float(j), abs=1e-6)
        assert iv.length_s == pytest.approx(1.0, abs=1e-6)
        assert iv.tag is None and iv.out_of_range == 0
        assert_same(iv.hist, ex.hist)
    assert_same(hdr.merge_log(path), hdr.merge(ex.hist for ex in expect))


def test_incremental_writer_flushes_each_interval(tmp_path):
    path = tmp_path / "itl.hlog"
    with hdr.IntervalLogWriter(path, start_wall_s=WALL, comment="metric=itl worker=0") as w:
        assert hdr.read_interval_log(path) == []           # the header alone is a valid log
        rec = w.write_values(0, S, np.array([1 * MS, 2 * MS, -1]))
        assert rec.out_of_range == 1
        ivs = hdr.read_interval_log(path)                  # readable while still open
        assert [(iv.hist.get_total_count(), iv.out_of_range) for iv in ivs] == [(2, 1)]
        w.write_interval(S, 2 * S, hdr.new_histogram())    # an empty second
        assert len(hdr.read_interval_log(path)) == 2
    ivs = hdr.read_interval_log(path)
    assert [iv.start_s for iv in ivs] == [0.0, 1.0]
    assert_same(ivs[0].hist, histogram_of_us([1000, 2000]))


@pytest.mark.parametrize("tag", ["a,b", "a b", "", "x\n"])
def test_writer_rejects_bad_tags(tmp_path, tag):
    # the format forbids commas, spaces and line breaks in a tag
    with pytest.raises(ValueError):
        hdr.IntervalLogWriter(tmp_path / "x.hlog", start_wall_s=WALL, tag=tag)


def test_reader_skips_a_torn_last_line_and_reports_every_bad_line(tmp_path):
    path = tmp_path / "x.hlog"
    with hdr.IntervalLogWriter(path, start_wall_s=WALL) as w:
        for j in range(3):
            w.write_values(j * S, (j + 1) * S, np.array([MS]))
    text = path.read_text()
    torn = tmp_path / "torn.hlog"
    torn.write_text(text + text.splitlines()[-1][:40])    # killed mid-write: no newline
    assert len(hdr.read_interval_log(torn)) == 3
    lines = text.splitlines(keepends=True)
    lines[-1] = "0.0,1.0,1.0,HISTnotbase64\n"               # corrupt in the middle of a file
    lines.insert(-2, "1.0,2.0\n")
    bad = tmp_path / "bad.hlog"
    bad.write_text("".join(lines) + lines[-2])
    with pytest.raises(ValueError) as err:
        hdr.read_interval_log(bad)
    assert str(err.value).count("bad.hlog:") == 2


def test_write_interval_log_rejects_bad_input_and_leaves_no_file(tmp_path):
    path = tmp_path / "x.hlog"
    with pytest.raises(ValueError):   # a sample before the grid's origin
        hdr.write_interval_log(path, np.array([S - 1]), np.array([MS]), start_wall_s=WALL,
                               base_ns=S)
    with pytest.raises(ValueError):   # lengths differ
        hdr.write_interval_log(path, np.array([0, 1]), np.array([MS]), start_wall_s=WALL)
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------------------------------------
# Summary and names

@pytest.mark.parametrize("values_ns", [
    [],                                                   # empty: everything 0
    [0, 0, 0],                                            # only zeros
    [7 * MS],                                             # one value
    np.arange(1, 1001) * MS,                              # uniform, 1 ms .. 1 s
    np.random.default_rng(5).lognormal(17, 2.0, 3000),    # wide: µs .. an hour
])
def test_package_agrees_with_numpy_percentiles_and_mean(values_ns):
    # percentiles_us is HdrHistogram Java's getValueAtPercentile: the highest equivalent value of the
    # sample at the nearest rank ceil(p/100 * n) (0: the lowest equivalent value of the smallest);
    # mean_us is the package's get_mean_value; the per-value reference equals the vectorized histogram
    # by the package's own equals().
    h = hdr.record(np.asarray(values_ns)).hist
    ref, _ = per_value(list(np.asarray(values_ns)))
    assert h.equals(ref)
    us = np.sort(np.floor(np.asarray(values_ns, dtype=np.float64) / 1000 + 0.5).astype(np.int64))
    expected = {p: 0 if us.size == 0 else
                h.get_lowest_equivalent_value(int(us[0])) if p == 0 else
                h.get_highest_equivalent_value(int(us[math.ceil(round(p * 10_000) * us.size / 1_000_000) - 1]))
                for p in PERCENTILES}
    assert hdr.percentiles_us(h, PERCENTILES) == expected
    assert hdr.mean_us(h) == h.get_mean_value()


def test_hdr_percentile_is_the_nearest_rank_not_the_rounded_rank():
    # 76 samples 1..76 ms: p99 is the ceil(0.99 * 76) = 76th value. The Python hdrh package rounds the
    # rank (75.24 -> 75) and would answer 75 ms; HdrHistogram's Java implementation, and loadgen, 76 ms.
    rec = hdr.record(np.arange(1, 77, dtype=np.int64) * MS)
    assert rec.hist.get_value_at_percentile(99) < 76_000
    assert 76_000 <= hdr.percentiles_us(rec.hist, [99.0])[99.0] <= 76_000 * 1.001


def test_summary_ms():
    # 1..1000 ms, one each: below 2.048 s the resolution is 1 µs per 2**b bucket, i.e. exact
    # to 3 digits; percentiles are HdrHistogram's highest equivalent values.
    rec = hdr.record(np.arange(1, 1001, dtype=np.int64) * MS)
    rec.out_of_range = 2
    s = hdr.summary_ms(rec)
    h = rec.hist
    p = hdr.percentiles_us(h, (50.0, 90.0, 99.0, 99.9))
    assert s == {"p50": p[50.0] / 1000, "p90": p[90.0] / 1000, "p99": p[99.0] / 1000, "p999": p[99.9] / 1000,
                 "max": h.get_max_value() / 1000, "mean": h.get_mean_value() / 1000,
                 "count": 1000, "out_of_range": 2}
    for key, true_ms in (("p50", 500), ("p90", 900), ("p99", 990), ("p999", 999), ("max", 1000)):
        assert true_ms <= s[key] <= true_ms * 1.001
    assert s["mean"] == pytest.approx(500.5, rel=1e-3)


def test_summary_ms_empty_and_bare_histogram():
    s = hdr.summary_ms(hdr.new_histogram())
    assert s == {"p50": None, "p90": None, "p99": None, "p999": None, "max": None, "mean": None,
                 "count": 0, "out_of_range": None}


def test_log_path_names_one_file_per_metric(tmp_path):
    assert [hdr.log_path(tmp_path, m).name for m in hdr.METRICS] == [
        "send_lag.hlog", "ttft.hlog", "ttft_from_send.hlog", "itl.hlog", "tpot.hlog", "e2e.hlog"]
    with pytest.raises(ValueError):
        hdr.log_path(tmp_path, "latency")


def test_clear_leaves_the_state_of_a_new_histogram():
    rng = np.random.default_rng(3)
    a, b = rng.lognormal(15, 1, 500).astype(np.int64), rng.lognormal(12, 1, 300).astype(np.int64)
    reused = hdr.new_histogram()
    hdr.record_ns(reused, a)
    hdr.clear(reused)
    assert reused.get_total_count() == 0 and reused.encode() == hdr.new_histogram().encode()
    hdr.record_ns(reused, b)
    fresh = hdr.new_histogram()
    hdr.record_ns(fresh, b)
    assert_same(reused, fresh)
    assert reused.encode() == fresh.encode()
