"""One launcher, one ending (loadgen/run/): a single process and `--workers 2` leave the same results folder.

For each case (open loop, closed loop, --slo, --scrape-metrics, --header) the same workload runs in one
process and in two workers; both must give the same manifest keys, the same `report --format json` keys,
the same files in the folder and the same verdict by the same rules. Small runs against the built-in
simulator (or, for --header, a server that answers only requests carrying the header).
"""
import base64
import re

import numpy as np
import orjson
import polars as pl
import pytest

from loadgen.results.folder import read_run
from tests.integration.conftest import loadgen, report_json, workload
from tests.misbehaving import BasicAuthServer

FIXED = "--mode fixed --ttft 20ms --itl 5ms"
# rules that bite at once: any departure from the offered rate or the planned gap CV makes an open loop
# invalid; the send-lag rule is left to the relaxed workload (a busy host must not decide the verdict)
STRICT = ("--max-rate-deviation", "1e-9", "--max-cv-deviation", "1e-9")
MODES = {"one process": (), "two workers": ("--workers", "2")}
CASES = {
    "open loop": STRICT,  # calibrated (worker 0 alone, with workers)
    "closed loop": ("--no-calibrate", "--concurrency", "3", *STRICT),
    "slo": ("--no-calibrate", "--slo", "ttft=200ms,tpot=50ms"),
    "scrape": ("--no-calibrate", "--scrape-metrics", "--scrape-interval", "200ms"),
    "header": ("--no-calibrate", "--model", "m"),  # the model BasicAuthServer lists (checked before the run)
}
BASIC = "Basic " + base64.b64encode(b"matrix:pw").decode()


def keys(d: dict, depth: int = 2) -> dict:
    """The tree of keys of a JSON object, `depth` levels down (values left out)."""
    return {k: keys(v, depth - 1) if isinstance(v, dict) and depth > 1 else None for k, v in d.items()}


def files(run_dir) -> set[str]:
    return {str(f.relative_to(run_dir)) for f in run_dir.rglob("*") if f.is_file()}


def rules(reasons: list[str]) -> list[str]:
    """The invalid reasons without their figures, nor the self-check's cause and remedy (the kernel's counts
    of one process or of the worst worker, which a busy host moves from run to run): which rules fired."""
    return [re.sub(r"[-+]?\d[\d.]*", "#", re.sub(r"; (the client was|neither starved|add --workers).*", "", r))
            for r in reasons]


def max_in_flight(requests: pl.DataFrame) -> int:
    sent = requests.filter(pl.col("dispatched_ns").is_not_null())
    t = np.concatenate([sent["dispatched_ns"].to_numpy(), sent["done_ns"].to_numpy()])
    step = np.concatenate([np.ones(sent.height, np.int64), -np.ones(sent.height, np.int64)])
    order = np.lexsort((step, t))  # an end before a start at the same instant
    return int(np.cumsum(step[order]).max())


def run_both(tmp_path, case: str) -> dict[str, dict]:
    w = workload(tmp_path, rate="30/s", requests=60, max_tokens=8,
                 tokenizer="approximate" if case == "header" else "auto")
    out = {}
    for mode, flags in MODES.items():
        d = tmp_path / mode.replace(" ", "-")
        args = ["run", w, *flags, *CASES[case], "--out", str(d), "--quiet"]
        if case == "header":
            with BasicAuthServer(BASIC) as server:
                p = loadgen(*args, "--url", f"http://127.0.0.1:{server.port}", "--header", f"Authorization: {BASIC}",
                            "--header", "X-Team: blue", timeout=180)
                heads, unauthorized = list(server.heads), list(server.unauthorized)
            posts = [h for h in heads if b"completions" in h.split(b"\r\n")[0]]
            # every request of every process carried the run's headers
            assert unauthorized == [] and len(posts) == 60 and all(b"X-Team: blue" in h for h in posts), mode
        else:
            p = loadgen(*args, "--sim-args", FIXED, timeout=180)
        assert p.returncode in (0, 3), (mode, p.stderr[-3000:])
        run = read_run(d)
        assert sorted(run.requests["idx"].to_list()) == list(range(60))  # one row per scheduled request
        out[mode] = {"rc": p.returncode, "dir": d, "manifest": run.manifest, "requests": run.requests,
                     "summary": report_json(str(d))}
    return out


@pytest.mark.parametrize("case", list(CASES))
def test_one_process_and_two_workers_leave_the_same_folder(tmp_path, case):
    one, two = run_both(tmp_path, case).values()
    m1, m2 = one["manifest"], two["manifest"]
    # the manifest: every section in both; the split run adds its `workers` (and counts them)
    assert [e["worker"] for e in m2.pop("workers")] == [0, 1] and "workers" not in m1
    assert m2["generator"].pop("workers") == 2
    assert keys(m1) == keys(m2)
    for section in ("client", "load", "target", "schedule", "workload", "t0", "host"):
        assert section in m1, section
    assert set(one["requests"]["worker"]) == {0} and set(two["requests"]["worker"]) == {0, 1}
    # the summary
    s1, s2 = one["summary"], two["summary"]
    s2["generator"].pop("workers")
    assert keys(s1) == keys(s2)
    assert s1["histograms"]["e2e"]["count"] == s2["histograms"]["e2e"]["count"] == s1["requests"]["ok"] > 0
    # the folder: the same files (per-worker detail lives in manifest.json)
    assert files(one["dir"]) == files(two["dir"])
    assert {"requests.parquet", "tokens.parquet", "e2e.hlog", "itl.hlog"} <= files(one["dir"])
    # the verdict: the same rules fired
    assert (one["rc"], m1["status"], rules(m1["invalid_reasons"])) == \
           (two["rc"], m2["status"], rules(m2["invalid_reasons"]))
    if case == "open loop":  # the strict rate and shape rules apply to an open loop ...
        assert m1["status"] == "invalid" and [r.split(" ")[0] for r in m1["invalid_reasons"]] == ["achieved",
                                                                                                  "arrival"]
        assert m1["calibration"] == m2["calibration"] == "calibration.json"
    if case == "closed loop":  # ... not to a closed loop, whose rate the replies set
        assert m1["status"] == "complete" and m1["load"] == m2["load"] and m1["load"]["loop"] == "closed"
        # the run's 3 users, split over the workers, not 3 per worker
        assert max_in_flight(one["requests"]) <= 3 and max_in_flight(two["requests"]) <= 3
    if case == "slo":
        assert m1["slo"] == m2["slo"] == {"ttft_ms": 200.0, "tpot_ms": 50.0}
        assert s1["slo"] == s2["slo"] and "goodput" in s1 and "goodput" in s2
    if case == "scrape":
        assert m1["scrape"]["scrapes"] > 0 and m2["scrape"]["scrapes"] > 0
        assert "server_metrics.parquet" in files(two["dir"])
    if case == "header":
        assert m1["client"] == m2["client"] and m2["client"]["headers"]["X-Team"] == "blue"
        assert orjson.dumps(m2).find(BASIC.split()[1].encode()) < 0  # the credential is written nowhere
