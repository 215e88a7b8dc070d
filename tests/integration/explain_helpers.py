"""Run a workload against the built-in engine simulator, report it, and join the decomposition with the
simulator's truth (RUN_DIR/sim_truth.parquet)."""
from __future__ import annotations

import textwrap

import orjson
import polars as pl

from tests.integration.conftest import RELAXED_SELFCHECK, loadgen


def workload(tmp_path, *, rate: str, requests: int, prompt: str, output: int, backend: str = "openai",
             api: str = "completions", seed: int = 7, process: str = "poisson") -> str:
    p = tmp_path / "w.toml"
    p.write_text(textwrap.dedent(f"""
        model = "sim"
        api = "{api}"
        backend = "{backend}"
        seed = {seed}
        [arrivals]
        process = "{process}"
        rate = "{rate}"
        [run]
        requests = {requests}
        drain_timeout = "30s"
        [prompt]
        tokens = {prompt}
        [output]
        tokens = {output}
        """))
    return str(p)


def run_and_report(tmp_path, workload_path: str, sim_args: str, *run_flags: str) -> tuple[dict, str]:
    out = tmp_path / "run"
    p = loadgen("run", workload_path, "--out", str(out), "--quiet", "--sim-args", sim_args, *RELAXED_SELFCHECK,
                *run_flags, timeout=240)
    assert p.returncode == 0, p.stderr
    rep = loadgen("report", str(out), "--format", "json")
    assert rep.returncode == 0, rep.stderr
    return orjson.loads(rep.stdout), str(out)


def joined(run_dir: str) -> pl.DataFrame:
    d = pl.read_parquet(f"{run_dir}/decomposition.parquet")
    t = pl.read_parquet(f"{run_dir}/sim_truth.parquet").select(
        "request_id", "scheduled_ns", "finish_ns", "preemptions",
        *((pl.col(f"{c}_ns") / 1e6).alias(f"true_{c}_ms") for c in ("queue", "prefill", "decode", "stall")))
    j = d.join(t, on="request_id", how="inner")
    assert j.height == d.height, "every decomposed request is in the truth"
    return j


def within(j: pl.DataFrame, est: str, true: str, tol: pl.Expr) -> float:
    return j.select(((pl.col(est) - pl.col(true)).abs() <= tol).mean()).item()


def seat_utilization(run_dir: str, seats: int) -> float:
    # Little's law on the engine's seats: time requests held a seat / (span x seats)
    t = pl.read_parquet(f"{run_dir}/sim_truth.parquet").filter(pl.col("outcome") == "ok")
    t = t.filter(~pl.col("request_id").str.starts_with("calib-"))
    span = t["finish_ns"].max() - t["arrival_ns"].min()
    return float((t["finish_ns"] - t["scheduled_ns"]).sum()) / (span * seats)
