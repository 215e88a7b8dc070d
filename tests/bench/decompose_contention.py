"""The calibrated decomposition (no server timings) under contention, against the simulator's truth.

    python -m tests.bench.decompose_contention [--runs 5] [--keep DIR] [--only chat-mixed]
    python -m tests.bench.decompose_contention --reanalyze DIR   (re-decompose kept runs, no new run)
    python -m tests.bench.decompose_contention --fit [--runs 5]  (also with the twin's model, below)

Not part of `make bench` (~10 min). Each run: `loadgen run WORKLOAD --sim-args "--profile h100-sxm
--speed 0.2"` (no --per-request-metrics, so the method is `calibrated`), relaxed self-check flags
(tests/integration/conftest.py RELAXED_SELFCHECK: a shared 2-core host), then the decomposition is
joined with RUN_DIR/sim_truth.parquet. Workloads (issue 13 part 4):
    chat-mixed                      150 requests at 6/s (the file's 300 shortened)
    chunked-prefill-interference    120 requests at 6/s (the file's 240 shortened: 512-token outputs)
Per run it prints, errors as % of the mean client TTFT:
    queue%    mean estimated queue - mean true queue
    prefill%  mean estimated prefill - mean true prefill
    q_ok      share of requests with |queue - true queue| <= max(5 ms, 20 % of TTFT)
    unc       the method's own uncertainty (decomposition_ms.queue_uncertainty_ms, if present) as % of TTFT
Done when (issue): |queue%|, |prefill%| <= 5 and q_ok >= 0.90 in every run.
--fit (issue 27 part 5): `loadgen fit` the same simulator first (its seats and step budget told, as for a
vLLM), and decompose every run twice: with the run's idle-server probes (calibration.json) and with the
fitted profile (`loadgen report --fitted-profile`'s calibration: twin/fit_model.idle_calibration).
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import polars as pl

from loadgen.analysis.decompose import aggregate, decompose
from loadgen.results.folder import read_run
from loadgen.sim.process import SimProcess
from loadgen.sim.profiles import Profile, load_profile
from loadgen.twin.fit_model import idle_calibration

SIM = "--profile h100-sxm --speed 0.2"
RELAXED_SELFCHECK = ("--max-send-lag-p99", "10s", "--max-lag-share", "1", "--max-rate-deviation", "10",
                     "--max-cv-deviation", "100")
CASES = {"chat-mixed": ("workloads/chat-mixed.toml", 150),
         "chunked-prefill-interference": ("workloads/chunked-prefill-interference.toml", 120)}


def run_once(workload: str, requests: int, out: Path) -> None:
    p = subprocess.run([sys.executable, "-m", "loadgen", "run", workload, "--out", str(out), "--quiet",
                        "--requests", str(requests), "--sim-args", SIM, *RELAXED_SELFCHECK],
                       capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        raise RuntimeError(f"loadgen run {workload}: exit {p.returncode}\n{p.stderr[-2000:]}")


def fit_simulator(out: Path) -> Profile:
    """`loadgen fit` of the simulator the runs use (h100-sxm: 256 seats, 8,192-token steps, told as a vLLM's)."""
    with SimProcess(args=SIM.split()) as sim:
        p = subprocess.run([sys.executable, "-m", "loadgen", "fit", "--url", sim.url, "--out", str(out),
                            "--max-num-seqs", "256", "--max-batched-tokens", "8192", "--budget", "90s"],
                           capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        raise RuntimeError(f"loadgen fit: exit {p.returncode}\n{p.stderr[-2000:]}")
    print(p.stdout.splitlines()[1], flush=True)  # the form and its residuals
    return load_profile(str(out))


def truth_join(run_dir: Path, profile: Profile | None = None) -> tuple[pl.DataFrame, dict]:
    run = read_run(str(run_dir))
    calibration = (idle_calibration(profile, run.requests["planned_prompt_tokens"].drop_nulls().to_list(), "fit")
                   if profile is not None else run.calibration())
    d = decompose(run, calibration)
    t = pl.read_parquet(run_dir / "sim_truth.parquet").select(
        "request_id", "prompt_tokens", (pl.col("queue_ns") / 1e6).alias("true_queue_ms"),
        (pl.col("prefill_ns") / 1e6).alias("true_prefill_ms"))
    return d.drop("prompt_tokens").join(t, on="request_id", how="inner"), aggregate(d)


def figures(j: pl.DataFrame, agg: dict) -> dict:
    ttft = float(j["ttft_ms"].mean())
    tol = pl.max_horizontal(pl.lit(5.0), 0.2 * pl.col("ttft_ms"))
    unc = agg.get("queue_uncertainty_ms")
    return {"n": j.height, "ttft_ms": ttft,
            "true_queue_ms": float(j["true_queue_ms"].mean()), "true_prefill_ms": float(j["true_prefill_ms"].mean()),
            "queue_pct": 100 * float(j["queue_ms"].mean() - j["true_queue_ms"].mean()) / ttft,
            "prefill_pct": 100 * float(j["prefill_ms"].mean() - j["true_prefill_ms"].mean()) / ttft,
            "q_ok": float(j.select(((pl.col("queue_ms") - pl.col("true_queue_ms")).abs() <= tol).mean()).item()),
            "unc_pct": None if unc is None else 100 * unc / ttft}


def show(name: str, run_dir: Path, profile: Profile | None = None) -> dict:
    f = figures(*truth_join(run_dir, profile))
    name = f"{name} (fitted)" if profile is not None else name
    unc = "   -  " if f["unc_pct"] is None else f"{f['unc_pct']:6.1f}"
    ok = abs(f["queue_pct"]) <= 5 and abs(f["prefill_pct"]) <= 5 and f["q_ok"] >= 0.9
    print(f"{name:30s} {run_dir.name:8s} {f['n']:4d} {f['ttft_ms']:8.1f} {f['true_queue_ms']:8.1f} "
          f"{f['true_prefill_ms']:8.1f} {f['queue_pct']:7.1f} {f['prefill_pct']:8.1f} {f['q_ok']:5.2f} {unc} "
          f"{'ok' if ok else 'FAIL'}", flush=True)
    return f


HEADER = (f"{'workload':30s} {'run':8s} {'n':>4s} {'ttft':>8s} {'t_queue':>8s} {'t_prefl':>8s} {'queue%':>7s} "
          f"{'prefill%':>8s} {'q_ok':>5s} {'unc%':>6s}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--keep", help="keep the run folders here (DIR/WORKLOAD/run-N)")
    ap.add_argument("--only", choices=list(CASES))
    ap.add_argument("--reanalyze", help="decompose the runs kept in DIR again instead of running")
    ap.add_argument("--fit", action="store_true", help="also decompose with a profile `loadgen fit` fitted first")
    args = ap.parse_args()
    root = Path(args.keep or args.reanalyze or tempfile.mkdtemp(prefix="contention-"))
    root.mkdir(parents=True, exist_ok=True)
    profile = fit_simulator(root / "fitted.toml") if args.fit else None
    print(HEADER)
    if args.reanalyze:
        for run_dir in sorted(Path(args.reanalyze).glob("*/run-*")):
            if (run_dir / "sim_truth.parquet").exists():
                show(run_dir.parent.name, run_dir)
                if profile is not None:
                    show(run_dir.parent.name, run_dir, profile)
        return
    for name, (workload, requests) in CASES.items():
        if args.only and name != args.only:
            continue
        for i in range(args.runs):
            out = root / name / f"run-{i}"
            run_once(workload, requests, out)
            show(name, out)
            if profile is not None:
                show(name, out, profile)


if __name__ == "__main__":
    main()
