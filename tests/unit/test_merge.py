"""The shares of a split run merged into one process's files (loadgen/results/merge.py), how the plan and the
run's limits are dealt over workers (loadgen/run/workers.py), and the one verdict (loadgen/run/ending.py).
No network, no processes."""
import dataclasses

import numpy as np
import orjson
import polars as pl

from loadgen.analysis.summary import histograms
from loadgen.config import workload as config
from loadgen.plan.schedule import build
from loadgen.results import hdr
from loadgen.results.folder import PARTS, read_run
from loadgen.results.merge import merge_interval_logs, merge_shares, share_requests
from loadgen.run.ending import judge
from loadgen.run.workers import assign, count_for, worker_config
from tests.frames import make_run
from tests.integration.conftest import workload

S = 1_000_000_000
WALL = 1_700_000_000.0


def write_log(path, intervals):
    """intervals: (start ns, end ns, values ns) from t0."""
    with hdr.IntervalLogWriter(path, start_wall_s=WALL) as w:
        for start, end, values in intervals:
            w.write_values(start, end, np.asarray(values, dtype=np.int64))


def test_interval_logs_merge_exactly_interval_by_interval(tmp_path):
    rng = np.random.default_rng(1)
    a = [(k * S, (k + 1) * S, rng.integers(1_000, 90_000_000, 40)) for k in range(3)] + [(3 * S, 3 * S + 300_000_000,
                                                                                         [5_000_000, -1])]
    b = [(k * S, (k + 1) * S, rng.integers(1_000, 90_000_000, 25)) for k in range(5)] + [(5 * S, 5 * S + 10_000_000,
                                                                                         [7 * 3600 * S])]
    write_log(tmp_path / "e2e.0.hlog", a)
    write_log(tmp_path / "e2e.1.hlog", b)
    logs = [tmp_path / "e2e.0.hlog", tmp_path / "e2e.1.hlog"]
    total = merge_interval_logs(logs, tmp_path / "e2e.hlog", WALL)
    merged = hdr.read_interval_log(tmp_path / "e2e.hlog")
    # one interval per second; the shorter last one of a share is inside the merged second
    assert [(iv.start_s, iv.length_s) for iv in merged] == [(0, 1), (1, 1), (2, 1), (3, 1), (4, 1), (5, 0.01)]
    want = {}
    for v in a + b:
        ok = hdr.in_range(np.asarray(v[2]))
        n, out = want.get(v[0], (0, 0))
        want[v[0]] = (n + int(ok.sum()), out + int((~ok).sum()))
    assert [(iv.hist.get_total_count(), iv.out_of_range) for iv in merged] == [want[k] for k in sorted(want)]
    # the whole run: as merging the shares' logs directly (what report did with per-worker logs)
    direct = hdr.merge_logs(logs)
    assert hdr.summary_ms(total) == hdr.summary_ms(direct) == hdr.summary_ms(hdr.merge_logs([tmp_path / "e2e.hlog"]))
    assert total.out_of_range == 2


def shares(tmp_path):
    run = make_run([{"id": f"r-{i:06d}", "intended": 10 * i, "tokens": [10 * i + 20, 10 * i + 25]} for i in range(6)])
    return run.requests.with_columns(worker=(pl.col("idx") % 2).cast(pl.Int32)), run.tokens


def test_merged_shares_are_the_one_process_files(tmp_path):
    requests, tokens = shares(tmp_path)
    (tmp_path / PARTS).mkdir()
    for w in (0, 1):
        mine = requests.filter(pl.col("worker") == w)
        for k, part in enumerate((mine[:2], mine[2:])):
            part.write_parquet(tmp_path / PARTS / f"requests-{w}-{k + 1:05d}.parquet")
            tokens.filter(pl.col("request_id").is_in(part["request_id"].implode())).write_parquet(
                tmp_path / PARTS / f"tokens-{w}-{k + 1:05d}.parquet")
        write_log(tmp_path / PARTS / f"ttft.{w}.hlog", [(0, S, [20 * 1_000_000] * 3)])
    (tmp_path / "manifest.json").write_bytes(orjson.dumps({"status": "running"}))
    killed = read_run(tmp_path)  # a driver killed before the merge: the shares still read as one run
    assert killed.requests.equals(requests) and histograms(tmp_path)["ttft"]["count"] == 6
    merge_shares(tmp_path, share_requests(tmp_path), WALL)
    assert sorted(f.name for f in tmp_path.iterdir()) == ["manifest.json", "requests.parquet", "tokens.parquet",
                                                          "ttft.hlog"]
    run = read_run(tmp_path)
    assert run.requests.equals(requests)
    assert run.tokens.sort("request_id", "idx").equals(tokens.sort("request_id", "idx"))
    assert histograms(tmp_path)["ttft"]["count"] == 6


def test_an_older_workers_folder_is_still_read_as_one_run(tmp_path):
    requests, tokens = shares(tmp_path)
    for w in (0, 1):
        mine = requests.filter(pl.col("worker") == w)
        mine.write_parquet(tmp_path / f"requests.{w}.parquet")
        tokens.filter(pl.col("request_id").is_in(mine["request_id"].implode())).write_parquet(
            tmp_path / f"tokens.{w}.parquet")
        write_log(tmp_path / f"e2e.{w}.hlog", [(0, S, [30 * 1_000_000] * 3)])
    (tmp_path / "manifest.json").write_bytes(orjson.dumps({"status": "complete"}))
    run = read_run(tmp_path)
    assert run.requests.equals(requests) and run.tokens.height == tokens.height
    assert histograms(tmp_path)["e2e"]["count"] == 6


def test_a_closed_loops_users_are_dealt_not_repeated(tmp_path):
    c = config.load(workload(tmp_path, requests=50), {"--concurrency": "5", "--workers": "2"})
    s = build(c)
    assert count_for(c, s) == 2
    assert [worker_config(c, 2, w).concurrency for w in (0, 1)] == [3, 2]
    assert [worker_config(c, 2, w).calibrate for w in (0, 1)] == [c.calibrate, False]
    owner = assign(s, 2, [3, 2])
    assert owner[:10].tolist() == [0, 1, 0, 1, 0] * 2 and np.bincount(owner).tolist() == [30, 20]
    assert assign(s, 3).tolist() == [0, 1, 2] * 16 + [0, 1]  # equal weights: plain round-robin
    # never more workers than users
    assert count_for(dataclasses.replace(c, workers=8, concurrency=3), s) == 3


def test_the_verdict_applies_the_rate_rules_to_an_open_loop_only(tmp_path):
    # the rate rules strict, the proportional lag rule off (lags up to 20 ms on a ~30 ms TTFT would fire it)
    strict = {"--max-rate-deviation": "1e-9", "--max-cv-deviation": "1e-9", "--max-lag-share": "1"}
    open_loop = config.load(workload(tmp_path, requests=80), strict)
    closed = config.load(workload(tmp_path, requests=80), {**strict, "--concurrency": "4"})
    rng = np.random.default_rng(2)
    intended = np.cumsum(rng.exponential(50.0, 80))
    run = make_run([{"id": f"r-{i:06d}", "intended": t, "lag": rng.uniform(0, 20), "tokens": [t + 30, t + 35]}
                    for i, t in enumerate(intended)])
    requests = run.requests.with_columns(http_status=pl.lit(200, pl.Int32))  # answered: the target was reached
    v_open = judge(open_loop, requests, "complete", None)
    v_closed = judge(closed, requests, "complete", None)
    assert v_open.status == "invalid" and [r.split()[0] for r in v_open.reasons] == ["achieved", "arrival"]
    assert v_closed.status == "complete" and v_closed.reasons == []
    assert judge(open_loop, requests, "interrupted", None).reasons == []
    assert judge(closed, requests, "complete", None, ["worker 1 died"]).reasons == ["worker 1 died"]
    assert judge(closed, run.requests, "complete", None).reasons[0].startswith("target unreachable")
