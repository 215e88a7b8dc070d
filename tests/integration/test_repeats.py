"""`--repeat N` end to end against the built-in simulator (fixed mode: the TTFT is the simulator's own
setting, the ground truth a comparison must find): the folder layout, repeats.json's statistics recomputed
from each repeat's own summary.json, `report` of a repeats folder, compare of two repeats folders by the
across-run variance (Welch's t, said in the reason) and of a repeated side against one run, the exit code
the worst repeat's, and a bad --repeat an input error."""
import math
import shutil

import numpy as np
import orjson
import polars as pl
import pytest

from loadgen.analysis import repeats
from loadgen.config import workload as config
from loadgen.config.workload import with_overrides
from loadgen.errors import ExitCode
from loadgen.run.launch import run_workload
from loadgen.run.repeat import run_repeated
from tests.integration.conftest import loadgen, workload

T975_2DF = 4.302652730  # Student t, 0.975 quantile, 2 degrees of freedom (tables)
FIXED = "--mode fixed --itl 5ms --ttft {}"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Three repeats at TTFT 20 ms (A), three at 80 ms (B), one run at 80 ms (S); 20 requests each."""
    tmp = tmp_path_factory.mktemp("repeats")
    w = workload(tmp, requests=20, max_tokens=16)
    out = {}
    for name, ttft, n in (("a", "20ms", "3"), ("b", "80ms", "3"), ("s", "80ms", "1")):
        p = loadgen("run", w, "--repeat", n, "--out", str(tmp / name), "--no-calibrate", "--quiet",
                    "--sim-args", FIXED.format(ttft), timeout=200)
        assert p.returncode == 0, p.stderr
        assert p.stdout.strip() == str(tmp / name)
        out[name] = tmp / name
    out["workload"] = w
    return out


def test_the_folder_holds_every_repeat_and_the_same_plan(runs):
    a = runs["a"]
    assert sorted(x.name for x in a.iterdir()) == ["repeat-1", "repeat-2", "repeat-3", "repeats.json"]
    rec = repeats.read(a)
    assert rec["repeats"] == 3 and [r["dir"] for r in rec["runs"]] == ["repeat-1", "repeat-2", "repeat-3"]
    assert all(r["status"] == "complete" and r["valid"] for r in rec["runs"])
    assert "each has its own prompt text" in rec["note"], rec["note"]   # a salt per run (plan/bodies.py)
    salts = [orjson.loads((a / r["dir"] / "manifest.json").read_bytes())["config"]["prompt_salt"] for r in rec["runs"]]
    assert len(set(salts)) == 3, salts
    plans = []
    for k in (1, 2, 3):
        d = a / f"repeat-{k}"
        for f in ("manifest.json", "requests.parquet", "tokens.parquet", "summary.json"):
            assert (d / f).is_file(), d / f
        req = pl.read_parquet(d / "requests.parquet").sort("idx")
        assert req.height == 20  # every scheduled request: one row
        plans.append(req.select("intended_ns", "planned_prompt_tokens", "max_tokens").to_dicts())
    assert plans[0] == plans[1] == plans[2]  # the same seed: the same times and lengths


def test_repeats_json_is_recomputed_from_each_summary(runs):
    rec = repeats.read(runs["a"])
    summaries = [orjson.loads((runs["a"] / f"repeat-{k}" / "summary.json").read_bytes()) for k in (1, 2, 3)]
    where = {("throughput", "value"): ("throughput", "requests_per_s"),
             ("token_throughput", "value"): ("throughput", "output_tokens_per_s")}
    names = set()
    for f in rec["figures"]:
        key = (f["metric"], f["stat"])
        names.add(key)
        path = where.get(key, ("latency_ms", f["metric"], f["stat"]))
        values = []
        for s in summaries:
            for k in path:
                s = s[k]
            values.append(s)
        v = np.array(values, dtype=float)
        assert f["values"] == pytest.approx(list(v))
        sd = float(np.std(v, ddof=1))
        assert f["mean"] == pytest.approx(float(v.mean())) and f["sd"] == pytest.approx(sd)
        half = T975_2DF * sd / math.sqrt(3)
        assert f["ci"] == [pytest.approx(v.mean() - half), pytest.approx(v.mean() + half)]
    want = {(m, s) for m in ("ttft", "tpot", "itl", "e2e") for s in ("p50", "p99")}
    assert want | {("throughput", "value"), ("token_throughput", "value")} == names


def test_report_prints_the_across_run_table(runs):
    p = loadgen("report", str(runs["a"]))
    assert p.returncode == 0, p.stderr
    assert "95% CI (t, 2 df)" in p.stdout
    rec = repeats.read(runs["a"])
    ttft = next(f for f in rec["figures"] if (f["metric"], f["stat"]) == ("ttft", "p50"))
    line = next(x for x in p.stdout.splitlines() if x.startswith("ttft") and " p50 " in x)
    assert f"{ttft['mean']:.1f}" in line and 19 < ttft["mean"] < 50  # the simulator's 20 ms, and the client
    j = loadgen("report", str(runs["a"]), "--format", "json")
    assert j.returncode == 0, j.stderr
    assert orjson.loads(j.stdout)["figures"] == rec["figures"]
    md = loadgen("report", str(runs["a"]), "--format", "md")
    assert md.returncode == 2 and "repeats folder" in md.stderr and "Traceback" not in md.stderr


def _metric(c, name, stat):
    return next(m for m in c["metrics"] if (m["metric"], m["stat"]) == (name, stat))


def test_compare_of_two_repeats_folders_uses_the_across_run_variance(runs):
    p = loadgen("compare", str(runs["a"]), str(runs["b"]), "--format", "json")
    assert p.returncode == 0, p.stderr
    c = orjson.loads(p.stdout)["comparisons"][0]
    assert c["variance"].startswith("across-run: Welch's t on the run means (A 3 runs, B 3 runs)")
    ttft = _metric(c, "ttft", "p50")
    assert ttft["verdict"] == "worse"  # 80 ms against 20 ms
    assert len(ttft["a_runs"]) == len(ttft["b_runs"]) == 3
    a, b = np.array(ttft["a_runs"]), np.array(ttft["b_runs"])
    se = math.sqrt(a.var(ddof=1) / 3 + b.var(ddof=1) / 3)
    half = (ttft["diff_ci"][1] - ttft["diff_ci"][0]) / 2
    assert ttft["diff"] == pytest.approx(b.mean() - a.mean())
    # Welch's df lies between n-1 = 2 and 2n-2 = 4: its quantile between the tables' 2.776 and 4.303
    assert 2.776445105 * se <= half * (1 + 1e-9) and half <= T975_2DF * se * (1 + 1e-9)
    for m in c["metrics"]:
        if "ci_includes_zero" in m["reasons"]:
            assert "Welch's t on the run means (across-run variance) cannot tell the runs apart" in m["why"]
    text = loadgen("compare", str(runs["a"]), str(runs["b"])).stdout
    assert "variance: across-run: Welch's t on the run means" in text


def test_compare_of_one_run_with_repeats_says_which_variance(runs):
    p = loadgen("compare", str(runs["s"]), str(runs["a"]), "--format", "json")
    assert p.returncode == 0, p.stderr
    c = orjson.loads(p.stdout)["comparisons"][0]
    assert c["variance"].startswith("across-run of B (3 runs), assumed for A's single run")
    ttft = _metric(c, "ttft", "p50")
    assert ttft["verdict"] == "better" and len(ttft["a_runs"]) == 1  # B's 20 ms against A's 80 ms
    rel = loadgen("compare", str(runs["s"]), str(runs["a"]), "--fail-if", "p50 ttft < -30%")
    assert rel.returncode == ExitCode.FAIL_IF, rel.stdout + rel.stderr


def test_the_exit_code_is_the_worst_repeat(runs, tmp_path):
    cfg = config.load(runs["workload"], {"--repeat": "3", "--no-calibrate": True,
                                        "--sim-args": FIXED.format("20ms")}, out=str(tmp_path / "r"))

    def second_invalid(c, **kw):  # repeat-2 holds an impossible send-lag limit: only it is invalid
        if c.out.endswith("repeat-2"):
            c = with_overrides(c, "test", max_send_lag_p99_ns=1)
        return run_workload(c, **kw)

    outcome = run_repeated(cfg, progress=None, run_one=second_invalid)
    assert outcome.exit_code == ExitCode.INVALID and outcome.status == "invalid"
    assert outcome.invalid_reasons and all(r.startswith("repeat-2: ") for r in outcome.invalid_reasons)
    rec = repeats.read(tmp_path / "r")
    assert [r["valid"] for r in rec["runs"]] == [True, False, True]


def test_a_bad_repeat_is_an_input_error(runs, tmp_path):
    p = loadgen("run", runs["workload"], "--repeat", "0", "--out", str(tmp_path / "x"))
    assert p.returncode == ExitCode.USAGE and "--repeat: must be >= 1" in p.stderr and "Traceback" not in p.stderr
    p = loadgen("run", runs["workload"], "--repeat", "2", "--out", str(runs["a"]))
    assert p.returncode == ExitCode.USAGE and "not empty" in p.stderr and "Traceback" not in p.stderr


def test_a_sweep_repeats_each_point_and_shows_its_spread(runs, tmp_path):
    out = tmp_path / "sweep"
    args = ("sweep", runs["workload"], "--rates", "10,20/s", "--repeat", "2", "--out", str(out), "--no-calibrate",
            "--quiet", "--sim-args", FIXED.format("20ms"))
    p = loadgen(*args, timeout=300)
    assert p.returncode == 0, p.stderr
    s = orjson.loads((out / "sweep_summary.json").read_bytes())
    assert [pt["dir"] for pt in s["points"]] == ["rate-10", "rate-20"]
    for pt in s["points"]:
        folder = out / pt["dir"]
        assert sorted(x.name for x in folder.iterdir()) == ["repeat-1", "repeat-2", "repeats.json"]
        ttft = [orjson.loads((folder / f"repeat-{k}" / "summary.json").read_bytes())["latency_ms"]["ttft"]["p50"]
                for k in (1, 2)]
        assert pt["latency_ms"]["ttft"]["p50"] == pytest.approx(sum(ttft) / 2)  # the point: its repeats' mean
        assert pt["repeats"]["n"] == 2 and pt["repeats"]["figures"] == repeats.read(folder)["figures"]
        assert pt["valid"] and pt["keeps_up"]
    assert "spread over the repeats" in (out / "sweep_summary.txt").read_text()
    md = loadgen("report", str(out), "--format", "md")
    assert md.returncode == 0 and "Spread over the repeats" in md.stdout, md.stderr
    c = orjson.loads(loadgen("compare", str(out), str(out), "--format", "json").stdout)["comparisons"][0]
    assert [pt["variance"].split(" (")[0] for pt in c["points"]] == ["across-run: Welch's t on the run means"] * 2
    before = (out / "rate-10" / "repeat-1" / "manifest.json").read_bytes()
    again = loadgen(*args, "--resume", timeout=120)  # every point finished: kept, none measured again
    assert again.returncode == 0, again.stderr
    assert (out / "rate-10" / "repeat-1" / "manifest.json").read_bytes() == before
    assert [pt["dir"] for pt in orjson.loads((out / "sweep_summary.json").read_bytes())["points"]] == \
        ["rate-10", "rate-20"]


def test_compare_refuses_a_repeats_folder_of_one_run(runs, tmp_path):
    # an interrupted series can leave one run: there is no across-run variance to judge by
    one = tmp_path / "one"
    shutil.copytree(runs["a"] / "repeat-1", one / "repeat-1")
    rec = repeats.read(runs["a"])
    (one / "repeats.json").write_bytes(orjson.dumps({**rec, "repeats": 1, "runs": rec["runs"][:1]}))
    p = loadgen("compare", str(one), str(runs["b"]))
    assert p.returncode == ExitCode.USAGE and "Traceback" not in p.stderr
    assert "a repeats folder of 1 run(s); the across-run variance needs 2 or more" in p.stderr


def test_an_interrupt_stops_the_series_and_keeps_what_finished(tmp_path):
    import signal
    import subprocess
    import sys
    import time

    w = workload(tmp_path, rate="20/s", requests=80, max_tokens=16)
    out = tmp_path / "r"
    p = subprocess.Popen([sys.executable, "-m", "loadgen", "run", w, "--repeat", "3", "--out", str(out),
                          "--no-calibrate", "--quiet", "--sim-args", FIXED.format("20ms")],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not (out / "repeat-2" / "manifest.json").is_file() and time.monotonic() < deadline and p.poll() is None:
        time.sleep(0.05)
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=120)
    assert p.returncode == ExitCode.INTERRUPTED, err
    rec = repeats.read(out)
    assert rec["runs"][0]["status"] == "complete" and 1 <= len(rec["runs"]) <= 2
    if len(rec["runs"]) == 2:
        assert rec["runs"][1]["status"] == "interrupted"
    assert not (out / "repeat-3").exists()  # the series stopped
