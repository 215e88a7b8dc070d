import subprocess
import sys
import textwrap
from pathlib import Path

import orjson
import polars as pl
import pytest

from loadgen.sim.process import SimProcess


@pytest.fixture(scope="module")
def fixed_sim(tmp_path_factory):
    """`loadgen sim --mode fixed` (TTFT 50 ms, ITL 10 ms) on a free loopback port, stopped by PID."""
    truth = tmp_path_factory.mktemp("sim") / "truth.jsonl"
    sim = SimProcess(args=["--mode", "fixed", "--ttft", "50ms", "--itl", "10ms", "--truth", str(truth)])
    sim.start()
    yield sim
    sim.stop()


def workload(tmp_path, *, rate="20/s", requests=60, max_tokens=32, api="completions", extra="",
             tokenizer="auto") -> str:
    # tokenizer "approximate" for servers without a /tokenize (test doubles): the run then asks for
    # approximate lengths, so they do not make it invalid
    p = tmp_path / "w.toml"
    p.write_text(textwrap.dedent(f"""
        model = "sim"
        api = "{api}"
        seed = 3
        [arrivals]
        process = "poisson"
        rate = "{rate}"
        [run]
        requests = {requests}
        drain_timeout = "10s"
        # functional tests on a shared 2-core machine: the self-check's rules are unit-tested
        # (test_selfcheck.py) and measured by `make bench`; here they must not turn data checks into exit 3
        max_send_lag_p99 = "10s"
        max_lag_share = 1
        max_rate_deviation = 10
        max_cv_deviation = 100
        [prompt]
        tokens = {{ dist = "uniform", min = 16, max = 64 }}
        tokenizer = "{tokenizer}"
        [output]
        tokens = {max_tokens}
        """) + extra)
    return str(p)


# The same, as flags, for runs of the shipped workload files.
RELAXED_SELFCHECK = ("--max-send-lag-p99", "10s", "--max-lag-share", "1", "--max-rate-deviation", "10",
                     "--max-cv-deviation", "100")


def loadgen(*args: str, timeout: float = 120, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "loadgen", *args], capture_output=True, text=True,
                          timeout=timeout, **kw)


def report_json(run_dir: str) -> dict:
    p = loadgen("report", run_dir, "--format", "json")
    assert p.returncode == 0, p.stderr
    return orjson.loads(p.stdout)


# A client-side estimate's accuracy (ms against the simulator's truth), or the simulator's fidelity to its
# profile, can only be judged on a run the host let keep its timings: on a quiet host the client's loop
# lateness p99 is ~0.1-2 ms and the simulator's emit lateness p99 ~1-3 ms; on two cores shared with
# CPU-bound work the host parks a process for 100-500 ms now and then, and every stamp taken meanwhile is late.
# stat "p99" for figures made of many samples; "max" where one late stamp is enough to move the figure (a
# lone 300 ms park in a 30 s run leaves the p99 of the 50 ms probe untouched: 6 late samples of 600).
HOST_STALL_LIMIT_MS = 20.0


def host_lateness_ms(run_dir, stat: str = "p99") -> dict[str, float]:
    run_dir = Path(run_dir)
    manifest = orjson.loads((run_dir / "manifest.json").read_bytes())
    late = {"client loop": manifest["generator"]["loop_lateness_ms"][stat]}
    truth = run_dir / "sim_truth.parquet"
    if truth.exists():
        emits = pl.read_parquet(truth).select(pl.col("lateness_ns").explode()).to_series().drop_nulls()
        late["simulator emits"] = ((emits.max() if stat == "max" else emits.quantile(0.99)) or 0) / 1e6
    return late


def host_starved(manifest: dict) -> bool:
    """loadgen's own self-check names the host as the cause of a late schedule (selfcheck.cause: "starved" or
    "starved and saturated"): other work had the client's CPU."""
    return (manifest["generator"].get("cause") or "").startswith("starved")


def counter_delta(sm: pl.DataFrame, name: str) -> float:
    """Last minus first scrape of a counter in server_metrics.parquet, summed over its label sets."""
    d = (sm.filter(pl.col("name") == name).group_by("labels")
         .agg((pl.col("value").sort_by("t_ns").last() - pl.col("value").sort_by("t_ns").first()).alias("d")))
    assert d.height, f"{name} not in the scrape"
    return float(d["d"].sum())


def skip_if_host_stalled(run_dir, limit_ms: float = HOST_STALL_LIMIT_MS, stat: str = "p99") -> None:
    late = host_lateness_ms(run_dir, stat)
    if max(late.values()) > limit_ms:
        pytest.skip(f"the host stalled the run (lateness {stat}, ms: "
                    f"{', '.join(f'{k} {v:.0f}' for k, v in late.items())}; limit {limit_ms:g}): "
                    f"{Path(run_dir).name} cannot judge ms-level accuracy")
