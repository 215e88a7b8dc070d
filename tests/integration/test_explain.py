"""The decomposition against the simulator's truth (tiny profile, time dilated x5 so a 2-core host keeps up).

Each test runs `loadgen run` on the built-in engine simulator (its truth lands in RUN_DIR/sim_truth.parquet),
then `loadgen report`, and compares decomposition.parquet with the truth by request id.
"""
import orjson
import polars as pl
import pytest

from loadgen.results.folder import read_run
from loadgen.sim.process import SimProcess
from tests.integration.conftest import counter_delta, loadgen, skip_if_host_stalled
from tests.integration.explain_helpers import joined, run_and_report, seat_utilization, within, workload

SIM = "--profile tiny --speed 0.2"
MIXED = '{ dist = "uniform", min = 64, max = 512 }'


@pytest.mark.parametrize("backend, api, flags, run_flags", [
    # vLLM's per-request metrics object
    ("openai", "completions", "--per-request-metrics", ("--no-calibrate",)),
    # the same object on /v1/responses' response.completed (vLLM's ResponsesResponse.metrics)
    ("openai", "responses", "--per-request-metrics", ("--no-calibrate",)),
    # durations in the done: true object
    ("ollama", "chat", "", ("--no-calibrate",)),
    # timings.prompt_ms / predicted_ms; llama.cpp reports no queue time (checked below)
    ("llamacpp", "completions", "", ("--no-calibrate",)),
])
def test_server_timings_match_the_truth(tmp_path, backend, api, flags, run_flags):
    w = workload(tmp_path, rate="8/s", requests=40, prompt=MIXED, output=24, backend=backend, api=api)
    s, run_dir = run_and_report(tmp_path, w, f"{SIM} --max-num-seqs 4 {flags}", *run_flags)
    j = joined(run_dir)
    assert j.height == 40 and set(j["method"]) == {"server_timings"}
    assert s["decomposition_ms"]["method"] == "server_timings"
    tol = lambda c: pl.max_horizontal(pl.lit(1.0), 0.02 * pl.col(c).abs())  # noqa: E731
    for comp in ("queue", "prefill", "decode") if backend != "llamacpp" else ("prefill", "decode"):
        share = within(j, f"{comp}_ms", f"true_{comp}_ms", tol(f"true_{comp}_ms"))
        assert share >= 0.99, (backend, comp, share)
    if backend == "llamacpp":
        # derived: client TTFT - server prefill, so it also holds the request upload and the first
        # token's trip to the client (about 1 ms on a quiet host; plus however late the busy host let the
        # client read, which the run measured: its worst loop lateness, and the simulator write the first
        # token: the truth's lateness_ns)
        err = j["queue_ms"] - j["true_queue_ms"]
        assert err.min() >= -0.5, err.describe()
        host_ms = read_run(run_dir).manifest["generator"]["loop_lateness_ms"]["max"]
        j = j.join(pl.read_parquet(f"{run_dir}/sim_truth.parquet").select(
            "request_id", (pl.col("lateness_ns").list.first().fill_null(0) / 1e6).alias("first_late_ms")),
            on="request_id")
        tol_ms = pl.max_horizontal(pl.lit(3.0), 0.05 * pl.col("true_queue_ms")) + host_ms + pl.col("first_late_ms")
        assert within(j, "queue_ms", "true_queue_ms", tol_ms) >= 0.9
    assert j["true_queue_ms"].mean() > 5  # the run did queue: the check above was not vacuous


@pytest.mark.parametrize("rate, utilization", [("7/s", 0.5), ("12/s", 0.9)])
def test_calibrated_estimates_without_server_timings(tmp_path, rate, utilization):
    w = workload(tmp_path, rate=rate, requests=60, prompt=MIXED, output=32)
    s, run_dir = run_and_report(tmp_path, w, f"{SIM} --max-num-seqs 4")
    assert abs(seat_utilization(run_dir, 4) - utilization) < 0.1
    j = joined(run_dir)
    assert set(j["method"]) == {"calibrated"}
    skip_if_host_stalled(run_dir)  # the estimate reads the engine's steps from every stream's stamps
    ttft = j["ttft_ms"].mean()
    for comp in ("queue", "prefill"):
        err = abs(j[f"{comp}_ms"].mean() - j[f"true_{comp}_ms"].mean()) / ttft
        assert err <= 0.10, (comp, err)
    share = within(j, "queue_ms", "true_queue_ms", pl.max_horizontal(pl.lit(5.0), 0.2 * pl.col("ttft_ms")))
    assert share >= 0.90, share
    assert s["calibration"]["method"] == "idle-probe"


@pytest.mark.parametrize("sim_flags", [
    "--per-request-metrics",          # chunked prefill off (8,000 tokens in one step); server timings
    "--max-num-batched-tokens 512",   # chunked prefill on (16 steps per long prompt); calibrated estimate
])
def test_stall_attribution_in_chunked_prefill_interference(tmp_path, sim_flags):
    # the shipped workload, shortened: short prompts with long outputs, 8 % 8,000-token prompts among them
    s, run_dir = run_and_report(tmp_path, "workloads/chunked-prefill-interference.toml", f"{SIM} {sim_flags}",
                                "--requests", "48")
    j = joined(run_dir)
    # where the host parked the simulator it wrote a token late (truth's lateness_ns), or parked the client
    # so that it read one late (the run's worst loop lateness), the client saw a longer gap, then a
    # catch-up: a stall the engine did not make, at most that late per request
    late = pl.read_parquet(f"{run_dir}/sim_truth.parquet").select(
        "request_id", (pl.col("lateness_ns").list.max().fill_null(0) / 1e6).alias("late_ms"))
    client_ms = read_run(run_dir).manifest["generator"]["loop_lateness_ms"]["max"]
    j = j.join(late, on="request_id").with_columns(host_ms=pl.col("late_ms") + client_ms)
    found, true = j["decode_stalls_ms"].sum(), j["true_stall_ms"].sum()
    assert true > 10_000 and found >= 0.9 * true - j["late_ms"].sum(), (found, true, j["late_ms"].sum())
    assert found <= 1.1 * true + j["host_ms"].sum(), (found, true, j["host_ms"].sum())
    calm = j.filter(pl.col("true_stall_ms") == 0)
    assert calm.height > 0
    assert (calm["decode_stalls_ms"] <= calm["host_ms"]).all(), calm.filter(pl.col("decode_stalls_ms") > 0)
    # a host that kept every timing within the attribution's 2 ms floor (StallRule.abs_ns): none at all
    if j["host_ms"].max() < 2:
        assert calm["decode_stalls_ms"].sum() == 0
    stalled = j.filter(pl.col("decode_stalls_ms") > 0)
    assert stalled["stall_causes"].list.len().min() >= 1  # every stall names its cause
    assert s["decomposition_ms"]["stalls"]["requests_stalled"] == stalled.height


def test_no_stalls_where_the_truth_has_none(tmp_path):
    # fixed mode: constant ITL whatever else runs, so no gap is a stall (client jitter included)
    w = workload(tmp_path, rate="20/s", requests=40, prompt=MIXED, output=24)
    s, run_dir = run_and_report(tmp_path, w, "--mode fixed --ttft 40ms --itl 10ms")
    j = joined(run_dir)
    assert j["true_stall_ms"].sum() == 0
    # ... save where the host made the simulator emit a token late (its truth's lateness_ns), or parked the
    # client so that it read one late (the run's worst loop lateness): the client then saw a real, longer
    # gap, at most that late
    late = pl.read_parquet(f"{run_dir}/sim_truth.parquet").select(
        "request_id", (pl.col("lateness_ns").list.max().fill_null(0) / 1e6).alias("late_ms"))
    client_ms = read_run(run_dir).manifest["generator"]["loop_lateness_ms"]["max"]
    j = j.join(late, on="request_id")
    assert (j["decode_stalls_ms"] <= j["late_ms"] + client_ms).all(), (client_ms,
                                                                       j.filter(pl.col("decode_stalls_ms") > 0))
    # a host that kept every timing within the attribution's 2 ms floor (StallRule.abs_ns): no stall at all
    if j["late_ms"].max() + client_ms < 2:
        assert j["decode_stalls_ms"].sum() == 0 and s["decomposition_ms"]["stalls"]["requests_stalled"] == 0


def test_prefill_vs_decode_report_shows_ttft_rising_and_tpot_flat(tmp_path):
    # the shipped workload (200- and 2,000-token prompts in turn, constant rate), shortened so each request
    # ends before the next one arrives: no queue, no batching, so TTFT is prefill work
    _, run_dir = run_and_report(tmp_path, "workloads/prefill-vs-decode.toml", SIM,
                                "--requests", "14", "--rate", "2/s", "--max-tokens", "32")
    text = loadgen("report", run_dir).stdout
    table = text.split("\nprompt tokens ", 1)[1].split("\n\n", 1)[0].strip().splitlines()[1:]
    assert [line.split()[0] for line in table] == ["200-200", "2000-2000"], text
    ttft = [float(line.split()[2]) for line in table]
    tpot = [float(line.split()[3]) for line in table]
    assert ttft[1] >= 3 * ttft[0], text
    assert "TTFT grows with prompt length" in text  # the diagnosis says so in words
    # the roofline: the single-stream decode rate measured by the idle probes against an H100's ceiling
    p = loadgen("report", run_dir, "--format", "json", "--device", "h100-sxm",
                "--model-config", "tests/data/llama-3-8b-config.json")
    roof = orjson.loads(p.stdout)["roofline"]
    assert roof["kv_bytes_per_token"] == 131072 and 190 < roof["single_stream_ceiling_tok_s"] < 210
    assert roof["measured_from"].startswith("idle-server probes") and roof["measured_single_stream_tok_s"] > 0
    skip_if_host_stalled(run_dir)  # TPOT within 15 %: ~1 ms, which a client read late by the host exceeds
    assert max(tpot) <= 1.15 * min(tpot), text


def test_scraped_metrics_cross_check_and_kv_diagnosis(tmp_path):
    # a KV pool too small for the offered load: requests wait while the pool is full
    w = workload(tmp_path, rate="16/s", requests=48, prompt='{ dist = "uniform", min = 256, max = 512 }', output=64)
    s, run_dir = run_and_report(tmp_path, w, f"{SIM} --kv-capacity-tokens 2048 --per-request-metrics",
                                "--scrape-metrics", "--scrape-interval", "200ms", "--no-calibrate")
    m = pl.read_parquet(f"{run_dir}/server_metrics.parquet")
    assert {"vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"} <= set(m["name"])
    # a sample before t0 and one after the run bracket it: the counters' increases are the run's requests
    # (the first scrape used to race the first requests: a request counted before it was lost)
    assert m["t_ns"].min() < 0 < m["t_ns"].max()
    rows = read_run(run_dir).requests
    assert counter_delta(m, "vllm:request_success_total") == 48
    assert counter_delta(m, "vllm:prompt_tokens_total") == rows["prompt_tokens"].sum()
    hist, mean = s["server_histograms_ms"], s["decomposition_ms"]["mean"]
    assert hist["n"] == 48
    assert hist["queue"] == pytest.approx(mean["queue"], rel=0.1)  # histogram sum/count vs per-request
    assert "kv_capacity" in [f["rule"] for f in s["diagnosis"]], s["diagnosis"]


@pytest.mark.parametrize("workload_file, requests", [
    # 70 % short chat turns, 30 % long RAG prompts: batches of long prompts overrun the 8,192-token step
    # budget, so short prompts behind them are admitted into the budget left and chunked
    ("workloads/chat-mixed.toml", "60"),
    # long decodes with 8,000-token prompts among them: requests queue behind budget-filling steps
    ("workloads/chunked-prefill-interference.toml", "40"),
])
def test_calibrated_estimates_under_contention(tmp_path, workload_file, requests):
    # issue 13 part 4: no server timings (vLLM's default), the shipped workloads shortened, the h100-sxm
    # profile (engine defaults: 256 seats, 8,192-token budget) dilated x5
    s, run_dir = run_and_report(tmp_path, workload_file, "--profile h100-sxm --speed 0.2", "--requests", requests)
    j = joined(run_dir)
    assert set(j["method"]) == {"calibrated"}
    # the estimate is built from the client's stamps of engine steps; and a stalled host inflates TTFT, so
    # even the premise below is judged only where it did not stall (beside two burners and two other suites:
    # client loop and simulator lateness p99 4.5-9.2 s, TTFT mean 3.2 s against a true queue of 0.2 s)
    skip_if_host_stalled(run_dir)
    ttft = j["ttft_ms"].mean()
    assert j["true_queue_ms"].mean() > 0.1 * ttft  # contention: the check below is not vacuous
    for comp in ("queue", "prefill"):
        err = abs(j[f"{comp}_ms"].mean() - j[f"true_{comp}_ms"].mean()) / ttft
        assert err <= 0.05, (comp, err)
    share = within(j, "queue_ms", "true_queue_ms", pl.max_horizontal(pl.lit(5.0), 0.2 * pl.col("ttft_ms")))
    assert share >= 0.90, share
    # the method reports its own uncertainty (0 per row where the replay reproduced the first token)
    dm = s["decomposition_ms"]
    assert dm["replay"]["matched_share"] > 0.5 and dm["queue_uncertainty_ms"] is not None
    assert j["queue_uncertainty_ms"].null_count() == 0


def test_calibrated_estimates_from_a_fitted_profile(tmp_path):
    # issue 27 part 5: the calibrated decomposition with the twin's model. `loadgen fit` the simulator (as it
    # would a vLLM: no server timings), run it without idle-server probes (--no-calibrate: no calibration,
    # no queue/prefill split), then `loadgen report --fitted-profile`: the split comes from the fitted model
    sim_args = f"{SIM} --max-num-seqs 4"
    with SimProcess(args=sim_args.split()) as sim:
        p = loadgen("fit", "--url", sim.url, "--out", str(tmp_path / "fitted.toml"), "--max-num-seqs", "4",
                    "--budget", "60s", "--rounds", "3", timeout=120)
        assert p.returncode == 0, p.stderr[-2000:]
    w = workload(tmp_path, rate="7/s", requests=60, prompt=MIXED, output=32)
    s, run_dir = run_and_report(tmp_path, w, sim_args, "--no-calibrate")
    assert s["decomposition_ms"]["method"] == "none"   # nothing to split TTFT with
    rep = loadgen("report", run_dir, "--format", "json", "--fitted-profile", str(tmp_path / "fitted.toml"))
    assert rep.returncode == 0, rep.stderr
    s = orjson.loads(rep.stdout)
    assert s["calibration"]["method"] == "fitted-profile" and "fitted.toml" in s["calibration"]["source"]
    j = joined(run_dir)
    assert set(j["method"]) == {"calibrated"}
    skip_if_host_stalled(run_dir)
    ttft = j["ttft_ms"].mean()
    for comp in ("queue", "prefill"):
        err = abs(j[f"{comp}_ms"].mean() - j[f"true_{comp}_ms"].mean()) / ttft
        print(f"{comp}: mean {j[f'{comp}_ms'].mean():.1f} ms, truth {j[f'true_{comp}_ms'].mean():.1f} ms, "
              f"error {err:.1%} of TTFT")
        assert err <= 0.10, (comp, err)
    # a file that is not a profile: exit 2 naming the flag, no traceback
    (tmp_path / "bad.toml").write_text("name = 1\n")
    for bad in (str(tmp_path / "bad.toml"), str(tmp_path / "missing.toml"), str(tmp_path / "x.json")):
        rep = loadgen("report", run_dir, "--fitted-profile", bad)
        assert rep.returncode == 2 and "--fitted-profile" in rep.stderr and "Traceback" not in rep.stderr, rep.stderr
