"""The Python API (loadgen/api.py) through `import loadgen`, against the built-in simulator it starts itself:
run() with overrides, read(), compare() as `loadgen compare` computes it, sweep(), bad input as typed errors
naming every keyword at once, a run from inside a running event loop (a notebook) stopped by an interrupt."""
import signal
import subprocess
import sys

import orjson
import polars as pl
import pytest

import loadgen
from loadgen.errors import ArgError, CompareError, ConfigError, ResultsError
from tests.integration.conftest import loadgen as loadgen_cli

# a shared 2-core machine: the self-check's rules are unit-tested (test_selfcheck.py); here they must not turn
# data checks into invalid runs (conftest.RELAXED_SELFCHECK as keywords)
RELAXED = {"max_send_lag_p99": "10s", "max_lag_share": 1, "max_rate_deviation": 10, "max_cv_deviation": 100}
SHORT = {"requests": 12, "warmup_requests": 0, "prompt_tokens": "32..96", "max_tokens": 8, "quiet": True, **RELAXED}


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    """quickstart twice through loadgen.run, its own simulator each time: 128- and 1024-token prompts."""
    tmp = tmp_path_factory.mktemp("api")
    return {n: loadgen.run("quickstart", tmp / f"p{n}", rate="6/s", **{**SHORT, "prompt_tokens": n})
            for n in (128, 1024)}


def test_run_applies_the_overrides_and_reads_back_what_the_simulator_served(two_runs):
    r = two_runs[128]
    assert isinstance(r, loadgen.api.Result) and r.status == "complete" and r.valid, r.invalid_reasons
    assert r.manifest["target"]["builtin_sim"] is True   # no url: the API started the simulator
    # every scheduled request has its one row; the overrides reached the plan and the requests
    assert r.requests.height == 12 and r.requests["request_id"].n_unique() == 12
    assert (r.requests["planned_prompt_tokens"] == 128).all() and (r.requests["max_tokens"] == 8).all()
    truth = r.sim_truth
    assert truth is not None
    # the truth also holds the calibration's idle probes (calib-...): the run's own requests, each served
    served = truth.filter(pl.col("request_id").is_in(r.requests["request_id"].implode()))
    assert served.height == 12 and (served["outcome"] == "ok").all() and (r.requests["outcome"] == "ok").all()
    # the client's TTFT of each request covers the server's own (arrival -> first token, same clock)
    t0 = r.manifest["t0"]["monotonic_ns"]
    joined = r.latencies.join(served.select("request_id", "arrival_ns", "first_token_ns"), on="request_id",
                              suffix="_server")
    assert joined.height == 12
    assert (joined["first_token_ns"] + t0 >= joined["first_token_ns_server"]).all()
    # summary and latencies are the same rows: the nearest-rank p50 is one of them
    p50 = r.summary["latency_ms"]["ttft"]["p50"]
    ttft = sorted(r.latencies["ttft_ms"].to_list())
    assert p50 == pytest.approx(ttft[(len(ttft) + 1) // 2 - 1], abs=1e-6)
    assert set(r.decomposition.columns) >= {"queue_ms", "prefill_ms", "decode_ms", "e2e_ms"}
    assert r.decomposition.height == r.summary["decomposition_ms"]["n"] == 12
    # read() of the folder: the same run, the same figures
    again = loadgen.read(r.path)
    assert again.summary["latency_ms"] == r.summary["latency_ms"]
    assert again.requests.equals(r.requests)


def test_longer_prompts_take_longer_to_first_token_by_truth_and_by_the_summary(two_runs):
    true_p50 = {n: r.sim_truth.filter(pl.col("request_id").is_in(r.requests["request_id"].implode()))
                .select((pl.col("first_token_ns") - pl.col("arrival_ns")).median()).item() for n, r in two_runs.items()}
    p50 = {n: r.summary["latency_ms"]["ttft"]["p50"] for n, r in two_runs.items()}
    assert true_p50[1024] > true_p50[128] and p50[1024] > p50[128], (true_p50, p50)


def test_compare_is_what_loadgen_compare_computes(two_runs):
    a, b = two_runs[128], two_runs[1024]
    c = loadgen.compare(a, b.path, resamples=200, fail_if="p50 ttft > +10%")
    p = loadgen_cli("compare", str(a.path), str(b.path), "--resamples", "200", "--fail-if", "p50 ttft > +10%",
                    "--format", "json")
    # the rule holds (4) unless a busy host's noise floor hides the difference (0): the command's exit either way
    assert p.returncode == c.exit_code in (0, 4), p.stderr
    assert orjson.loads(p.stdout) == orjson.loads(orjson.dumps(c.result, option=orjson.OPT_SERIALIZE_NUMPY))
    assert "prompt-length distribution differs" in str(c)      # the text the command prints
    with pytest.raises(ConfigError, match="resample: not an option of compare"):
        loadgen.compare(a, b, resample=200)
    with pytest.raises(CompareError, match="^resamples: must be a whole number from 100 to 1000000, got 1000000000"):
        loadgen.compare(a, b, resamples=10**9)   # checked before any resample is drawn
    p = loadgen_cli("compare", str(a.path), str(b.path), "--resamples", "5")
    assert p.returncode == 2 and "--resamples: must be a whole number from 100 to 1000000, got 5" in p.stderr


def test_bad_overrides_raise_one_config_error_naming_every_keyword(tmp_path):
    out = tmp_path / "never"
    with pytest.raises(ConfigError) as e:
        loadgen.run("quickstart", out, rate="fast", max_tokns=8, scrape_metrics="yes", duration="-1s")
    problems = e.value.problems
    assert len(problems) == 4, problems
    text = "\n".join(problems)
    assert "max_tokns: not an option of run (did you mean max_tokens?)" in text
    assert "scrape_metrics: must be True or False, got 'yes'" in text
    assert "rate: bad rate 'fast'" in text and "duration: " in text
    assert not [p for p in problems[1:] if "--" in p]   # named as the caller wrote them, not as flags
    assert not out.exists()   # nothing started
    with pytest.raises(ConfigError, match="no such workload file"):
        loadgen.run(tmp_path / "missing.toml")


def test_read_says_what_is_not_a_results_folder(tmp_path):
    with pytest.raises(ResultsError, match=f"{tmp_path / 'nope'}: no such results folder"):
        loadgen.read(tmp_path / "nope")
    with pytest.raises(ResultsError, match="not a loadgen results folder"):
        loadgen.read(tmp_path)


def test_sweep_runs_each_rate_and_reads_its_points(tmp_path):
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    s = loadgen.sweep("quickstart", [3, "6/s"], tmp_path / "sw", **SHORT)
    # each point's run put back the handlers it found (uvloop leaves its own, bound to the closed loop,
    # which would swallow a Ctrl-C between points and after the sweep)
    assert {sig: signal.getsignal(sig) for sig in handlers} == handlers
    assert s.status == "complete"
    assert list(s.points) == [3.0, 6.0]
    assert [p["rate_per_s"] for p in s.summary["points"]] == [3.0, 6.0]
    for rate, point in s.points.items():
        assert point.requests.height == 12 and point.manifest["config"]["arrivals"]["rate_per_s"] == rate
    with pytest.raises(ArgError, match="^rates: "):
        loadgen.sweep("quickstart", "x", tmp_path / "bad", **SHORT)
    with pytest.raises(ArgError, match="^rate: a sweep sets the rate"):
        loadgen.sweep("quickstart", [3], tmp_path / "bad", rate="2/s", **SHORT)


# The cell, in a process of its own as a notebook kernel is; the child prints what the test judges. Like a
# kernel (ipykernel's pre_handler_hook), it sets Python's default SIGINT handler for the cell: a process started
# in the background by a non-interactive shell (`make test &`, nohup, some CI runners) inherits SIGINT ignored,
# and Python then installs no KeyboardInterrupt at all. Without it the interrupt was lost in every `make test`
# started that way (the run ended `complete`), and never in one started from a terminal.
CELL = """
import asyncio, os, signal, sys, threading, time
import orjson
import loadgen
signal.signal(signal.SIGINT, signal.default_int_handler)   # as a kernel does around each cell
out, relaxed = sys.argv[1], orjson.loads(sys.argv[2])
sent, returned = {}, threading.Event()

def interrupt_once_running():
    start = time.monotonic()
    try:
        while not returned.is_set():   # as long as the run goes: a busy host may start it late
            m = os.path.join(out, "manifest.json")
            if os.path.isfile(m) and orjson.loads(open(m, "rb").read()).get("status") == "running":  # t0 passed
                time.sleep(0.5)
                os.kill(os.getpid(), signal.SIGINT)
                sent["after_s"] = time.monotonic() - start
                return
            time.sleep(0.05)
        sent["not"] = f"the run ended before its manifest said running ({time.monotonic() - start:.1f} s)"
    except BaseException as e:
        sent["not"] = f"{type(e).__name__}: {e}"

async def cell():
    asyncio.get_running_loop()  # as in a notebook: this thread's loop is running
    return loadgen.run("quickstart", out, rate="4/s", duration="60s", max_tokens=8, quiet=True, **relaxed)

killer = threading.Thread(target=interrupt_once_running)
killer.start()
loop = asyncio.new_event_loop()   # run_until_complete: no SIGINT handler of asyncio's own, as a kernel's
try:
    r = loop.run_until_complete(cell())
finally:
    returned.set()
    loop.close()
    killer.join()
print(orjson.dumps({"sent": sent, "status": r.status, "exit_code": r.exit_code,
                    "planned": r.manifest["schedule"]["requests"], "rows": r.requests.height,
                    "outcomes": sorted(set(r.requests["outcome"]))}).decode())
"""


def test_a_run_inside_a_running_event_loop_ends_interrupted_on_keyboard_interrupt(tmp_path):
    # A notebook runs each cell inside its running event loop: the run then has a thread of its own, and the
    # kernel's interrupt (SIGINT -> KeyboardInterrupt in the waiting caller) stops it as Ctrl-C stops a command.
    p = subprocess.run([sys.executable, "-c", CELL, str(tmp_path / "cell"), orjson.dumps(RELAXED).decode()],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    r = orjson.loads(p.stdout.strip().splitlines()[-1])
    assert "after_s" in r["sent"], r
    assert r["status"] == "interrupted" and r["exit_code"] == 130, r
    assert r["rows"] == r["planned"] > 0, r          # every scheduled request has its one row
    assert "interrupted" in r["outcomes"] or "cancelled" in r["outcomes"], r


def test_import_is_cheap_and_run_is_the_function_whatever_was_imported_first():
    code = ("import sys, loadgen; assert 'loadgen.api' not in sys.modules and 'polars' not in sys.modules; "
            "from loadgen.run.launch import run_workload; import loadgen.run.sweep; "
            "assert callable(loadgen.run) and loadgen.run.__module__ == 'loadgen.api', loadgen.run; "
            "assert loadgen.read.__module__ == 'loadgen.api'; print(sorted(loadgen.__all__))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "['compare', 'read', 'run', 'sweep']"


def test_repeat_returns_the_repeats_and_each_run(tmp_path):
    rep = loadgen.run("quickstart", tmp_path / "rep", rate="6/s", repeat=2, **SHORT)
    assert isinstance(rep, loadgen.api.Repeats) and rep.record["repeats"] == 2
    assert [r.path.name for r in rep.runs] == ["repeat-1", "repeat-2"]
    assert all(r.requests.height == 12 for r in rep.runs)
    assert isinstance(loadgen.read(rep.path), loadgen.api.Repeats)   # read() knows the folder too
