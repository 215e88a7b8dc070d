"""loadgen against a server of exactly known timing, next to a bare reference client.

    python -m tests.bench.bench_fast    prints a table, writes tests/bench/results.json (~4.5 min);
                                        `make bench` runs it with every other tests/bench/bench_*.py

Environment (durations in seconds; a quick run: BENCH_ACCURACY_S=3 BENCH_CAPACITY_S=2 BENCH_ANALYSIS_ROWS=1000000):
  BENCH_ACCURACY_S   15        per accuracy case (50, 100, 150, 200 req/s x 64 tokens)
  BENCH_CAPACITY_S   6         per capacity case (400, 800, 1600, 2000 req/s x BENCH_CAPACITY_TOKENS)
  BENCH_CAPACITY_TOKENS 16     fewer tokens than 64: the one-core simulator is the limit otherwise
  BENCH_ACCURACY_RATES / BENCH_CAPACITY_RATES   comma lists overriding the rates
  BENCH_CLIENTS      loadgen,bare,lg-aio   (lg-aio: loadgen with its aiohttp transport; accuracy cases only;
                               also c: tests/bench/cclient.c, the bare client's work in C, what no Python client beats;
                               bare-cb: tests/bench/bare_cb.py, the bare client writing from its timer's callback)
  BENCH_ANALYSIS_ROWS 10000000 chunk rows of the synthetic run given to `loadgen report` (0 = skip)
  BENCH_SIM_CORE / BENCH_CLIENT_CORE   1 / 0   (taskset lists: e.g. BENCH_SIM_CORE=1-3)
  BENCH_SIM_PROCESSES 1        capacity cases: `loadgen sim --processes N`, all pinned to BENCH_SIM_CORE
  BENCH_SERVER       fastmock  tests/bench/fastmock.c (C, one thread, the same fixed timing and truth as the
                               simulator's fixed mode, its own lateness p99 ~0.1 ms, and 2,000 req/s on one core),
                               built with gcc; without gcc: sim, `loadgen sim --mode fixed` (lateness p99 3-10 ms,
                               saturated near 1,600 req/s), said on the first line. BENCH_SERVER=sim asks for it
  BENCH_REPEATS      3         every case this many times, alternating the clients at each rate (goals.py
                               judges the errors in each repetition, a stall in one is a miss; the CPU
                               over the repetitions together)

Exit status: 1 when a goal of tests/bench/goals.py is missed (every figure is printed first).

Every case starts a fresh `loadgen sim --mode fixed --ttft 20ms --itl 5ms` pinned to one core (with a
truth file) and runs the client pinned to the other. See tests/bench/README.md for what each column means.
"""
from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit

import orjson
import polars as pl

from loadgen.sim.process import SimProcess
from tests.bench import analysis_bench, goals
from tests.bench import fastmock
from tests.bench.fastmock import FastMock
from tests.bench.truthcmp import compare, read_truth

HERE = Path(__file__).parent
PY = sys.executable


def env_list(name: str, default: str) -> list[float]:
    return [float(x) for x in os.environ.get(name, default).split(",") if x]


def workload(path: Path, rate: float, duration_s: float, tokens: int) -> Path:
    path.write_text(f"""model = "m"
api = "completions"
seed = 1
[arrivals]
process = "poisson"
rate = "{rate:g}/s"
[run]
duration = "{duration_s:g}s"
drain_timeout = "20s"
[prompt]
tokens = 16
[output]
tokens = {tokens}
""")
    return path


def server() -> str:
    """The server of the cases: BENCH_SERVER, else fastmock where gcc can build it, else the simulator. The goals
    (goals.py) compare errors within 0.5 ms: their truth must be precise to far less than that."""
    return os.environ.get("BENCH_SERVER") or ("fastmock" if shutil.which("gcc") else "sim")


def tokenizer_args() -> list[str]:
    """`loadgen run`'s flags for the server: fastmock has no /tokenize, so approximate prompt lengths are asked
    for, and the status says only what the self-check found."""
    return ["--tokenizer", "approximate"] if server() == "fastmock" else []


def start_sim(truth: Path, core: str, processes: int = 1) -> SimProcess | FastMock:
    """The server of every case, pinned to `core`: fastmock.c (server() "fastmock": one process whatever
    `processes` says) or `loadgen sim --mode fixed` ("sim")."""
    if server() == "fastmock":
        sim: SimProcess | FastMock = FastMock(truth)
        sim.start()
        subprocess.run(["taskset", "-p", "-c", core, str(sim.proc.pid)], check=True, capture_output=True)
        return sim
    sim = SimProcess(args=["--mode", "fixed", "--ttft", "20ms", "--itl", "5ms", "--truth", str(truth),
                           "--processes", str(processes)])
    sim.start()
    # --processes N: the children are processes of their own (already started): pin each of them too
    children = Path(f"/proc/{sim.proc.pid}/task/{sim.proc.pid}/children").read_text().split()
    for pid in [str(sim.proc.pid), *children]:
        subprocess.run(["taskset", "-a", "-p", "-c", core, pid], check=True, capture_output=True)
    return sim


def run_loadgen(url: str, tmp: Path, rate: float, duration_s: float, tokens: int, core: str,
                transport: str = "raw") -> tuple[dict, pl.DataFrame, pl.DataFrame]:
    out = tmp / "run"
    w = workload(tmp / "w.toml", rate, duration_s, tokens)
    p = subprocess.run(["taskset", "-c", core, PY, "-m", "loadgen", "run", str(w), "--url", url, "--out", str(out),
                        "--quiet", *tokenizer_args()], capture_output=True, text=True,
                       env={**os.environ, "LOADGEN_TRANSPORT": transport})
    if p.returncode not in (0, 3):
        raise RuntimeError(f"loadgen run failed ({p.returncode}): {p.stderr[-2000:]}")
    m = orjson.loads((out / "manifest.json").read_bytes())
    t0 = m["t0"]["monotonic_ns"]
    req = pl.read_parquet(out / "requests.parquet")
    client = req.filter(pl.col("dispatched_ns").is_not_null()).select(
        "request_id", intended_ns=pl.col("intended_ns") + t0, sent_ns=pl.col("dispatched_ns") + t0,
        first_ns=pl.col("first_token_ns") + t0, wire_sent_ns=pl.col("sent_ns") + t0)
    # TTFT error is measured from the request being fully written (first_token - sent): swap it in.
    client = client.with_columns(sent_for_ttft=pl.col("wire_sent_ns"))
    chunks = pl.read_parquet(out / "tokens.parquet").select("request_id", "idx", t_ns=pl.col("t_ns") + t0)
    g = m.get("generator", {})
    extra = {"status": m["status"], "invalid_reasons": m.get("invalid_reasons", []),
             "cpu_us_per_chunk": g.get("cpu_us_per_chunk"), "chunks": g.get("chunks"),
             "loop_lateness_p99_ms": (g.get("loop_lateness_ms") or {}).get("p99")}
    return extra, client, chunks


def run_bare(url: str, tmp: Path, rate: float, duration_s: float, tokens: int, core: str,
             in_c: bool = False, module: str = "bare_client") -> tuple[dict, pl.DataFrame, pl.DataFrame]:
    """The bare uvloop client (bare_client.py; module bare_cb: dispatching from its timer's callback), or in_c:
    the same client in C (cclient.c); one output format."""
    out = tmp / "bare.json"
    if in_c:
        u = urlsplit(url)
        cmd = [str(fastmock.build("cclient")), u.hostname or "127.0.0.1", str(u.port)]
    else:
        cmd = [PY, "-m", f"tests.bench.{module}", url]
    subprocess.run(["taskset", "-c", core, *cmd, str(rate), str(duration_s), str(tokens), str(out)], check=True,
                   capture_output=True)
    d = orjson.loads(out.read_bytes())
    reqs = d["requests"]
    ids, idx, t = [], [], []
    first = []
    for r in reqs:
        k = 0
        f = None
        for stamp, n in zip(r["read_ns"], r["chunks"]):
            for _ in range(n):
                ids.append(r["request_id"])
                idx.append(k)
                t.append(stamp)
                k += 1
                f = stamp if f is None else f
        first.append(f)
    client = pl.DataFrame({"request_id": [r["request_id"] for r in reqs],
                           "intended_ns": [r["intended_ns"] for r in reqs], "sent_ns": [r["sent_ns"] for r in reqs],
                           "first_ns": first}, schema_overrides={"first_ns": pl.Int64})
    client = client.with_columns(sent_for_ttft=pl.col("sent_ns"))
    chunks = pl.DataFrame({"request_id": ids, "idx": idx, "t_ns": t},
                          schema={"request_id": pl.String, "idx": pl.Int64, "t_ns": pl.Int64})
    n = len(t)
    return {"status": "-", "cpu_us_per_chunk": d["cpu_s"] * 1e6 / n if n else None, "chunks": n,
            "loop_lateness_p99_ms": None}, client, chunks


def one_case(kind: str, client_name: str, rate: float, duration_s: float, tokens: int) -> dict:
    sim_core, client_core = os.environ.get("BENCH_SIM_CORE", "1"), os.environ.get("BENCH_CLIENT_CORE", "0")
    with tempfile.TemporaryDirectory(prefix="lgbench-") as d:
        tmp = Path(d)
        truth_path = tmp / "truth.jsonl"
        processes = int(os.environ.get("BENCH_SIM_PROCESSES", "1")) if kind == "capacity" else 1
        sim = start_sim(truth_path, sim_core, processes)
        try:
            if client_name in ("bare", "bare-cb", "c"):
                extra, client, chunks = run_bare(sim.url, tmp, rate, duration_s, tokens, client_core,
                                                 in_c=client_name == "c",
                                                 module="bare_cb" if client_name == "bare-cb" else "bare_client")
            else:
                transport = "aiohttp" if client_name == "lg-aio" else "raw"
                extra, client, chunks = run_loadgen(sim.url, tmp, rate, duration_s, tokens, client_core, transport)
        finally:
            sim.stop()
        truth = read_truth(truth_path)
    # ttft from the moment the request was fully written (loadgen: sent_ns; bare: its write)
    ttft_client = client.with_columns(sent_ns=pl.col("sent_for_ttft"))
    res = compare(client, chunks, truth)
    res_ttft = compare(ttft_client, chunks.head(0), truth)
    res.update(ttft_err_p50_ms=res_ttft["ttft_err_p50_ms"], ttft_err_p99_ms=res_ttft["ttft_err_p99_ms"])
    res.update(extra, kind=kind, client=client_name, rate_per_s=rate, tokens=tokens, duration_s=duration_s,
               sim_processes=processes, server=server())
    return res


COLUMNS = [("kind", "{:<8}"), ("client", "{:<8}"), ("rate_per_s", "{:>6.0f}"), ("tokens", "{:>4}"),
           ("achieved_per_s", "{:>8.1f}"), ("arrival_cv_at_server", "{:>6.2f}"), ("send_lag_p50_ms", "{:>7.3f}"),
           ("send_lag_p99_ms", "{:>7.3f}"), ("ttft_err_p50_ms", "{:>7.3f}"), ("ttft_err_p99_ms", "{:>7.3f}"),
           ("itl_gap_err_p50_ms", "{:>7.3f}"), ("itl_gap_err_p99_ms", "{:>7.3f}"), ("sim_lateness_p99_ms", "{:>7.3f}"),
           ("cpu_us_per_chunk", "{:>7.1f}"), ("status", "{:<8}")]
HEADS = ["kind", "client", "rate", "tok", "achieved", "CV@srv", "lag50", "lag99", "ttft50", "ttft99",
         "itl50", "itl99", "simlt99", "cpu/chk", "status"]


def fmt_row(r: dict) -> str:
    cells = []
    for k, f in COLUMNS:
        v = r.get(k)
        width = len(f.format(0 if "f" in f else "x")) if v is None else None
        cells.append(f"{'-':>{width}}" if v is None else f.format(v))
    return " ".join(cells)


def header() -> str:
    widths = [len(f.format(0.0 if ("f" in f) else ("x" if "<" in f else 0))) for _, f in COLUMNS]
    return " ".join(f"{h:>{w}}" if i > 1 else f"{h:<{w}}" for i, (h, w) in enumerate(zip(HEADS, widths)))


def cpu_ratios(results: list[dict]) -> dict[tuple[str, float, int], float]:
    """loadgen's CPU per streamed chunk over the bare client's, per case (kind, rate, rep) run by both."""
    return {k: lg["cpu_us_per_chunk"] / bare["cpu_us_per_chunk"] for k, (lg, bare) in goals.pairs(results).items()
            if lg.get("cpu_us_per_chunk") and bare.get("cpu_us_per_chunk")}


def main() -> int:
    acc_s = float(os.environ.get("BENCH_ACCURACY_S", "15"))
    cap_s = float(os.environ.get("BENCH_CAPACITY_S", "6"))
    cap_tokens = int(os.environ.get("BENCH_CAPACITY_TOKENS", "16"))
    clients = os.environ.get("BENCH_CLIENTS", "loadgen,bare,lg-aio").split(",")
    repeats = int(os.environ.get("BENCH_REPEATS", "3"))
    once = [("accuracy", c, r, acc_s, 64) for r in env_list("BENCH_ACCURACY_RATES", "50,100,150,200") for c in clients]
    once += [("capacity", c, r, cap_s, cap_tokens) for r in env_list("BENCH_CAPACITY_RATES", "400,800,1600,2000")
             for c in clients if c != "lg-aio"]
    cases = [(rep, *case) for rep in range(repeats) for case in once]
    how = ("BENCH_SERVER" if os.environ.get("BENCH_SERVER") else
           "gcc found" if server() == "fastmock" else "no gcc to build fastmock: the truth is only as good as simlt99")
    print(f"server: {server()} ({how})", flush=True)
    print("ms unless noted; cpu/chk in µs of client CPU per streamed chunk; errors vs the server's truth",
          flush=True)
    print(header(), flush=True)
    results = []
    for rep, *case in cases:
        try:
            r = one_case(*case)
        except Exception as e:  # a failed case is reported, the others still run
            r = {"kind": case[0], "client": case[1], "rate_per_s": case[2], "tokens": case[4],
                 "error": repr(e)[:500]}
            print(f"{case[0]:<8} {case[1]:<8} {case[2]:>6.0f} FAILED: {r['error']}", flush=True)
        else:
            print(fmt_row(r), flush=True)
        r["rep"] = rep
        results.append(r)
    ratios = cpu_ratios(results)
    judged, misses = goals.judge(results)
    print("\ngoals (loadgen against the bare client of the same run, tests/bench/goals.py):", flush=True)
    for line in judged:
        print("  " + line, flush=True)
    analysis = None
    rows = int(os.environ.get("BENCH_ANALYSIS_ROWS", "10000000"))
    if rows:
        analysis = analysis_bench.run(rows)
        print(f"\nanalysis: loadgen report of {analysis['chunk_rows']:,} chunk rows "
              f"({analysis['requests']:,} requests): "
              f"{analysis['seconds']:.1f} s (CPU {analysis['cpu_s']:.1f} s, load average "
              f"{analysis['load_average']:.1f}), peak RSS {analysis['peak_rss_mib']:.0f} MiB (target <= 10 s, "
              f"<= 2048 MiB)", flush=True)
    out = {"when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "host": platform.node(),
           "cpus": os.cpu_count(), "cases": results, "analysis": analysis,
           "cpu_ratio_vs_bare": {f"{k} {r:g} run {rep + 1}": v for (k, r, rep), v in ratios.items()},
           "goals_missed": misses,
           "load_average_at_end": os.getloadavg()}
    (HERE / "results.json").write_bytes(orjson.dumps(out, option=orjson.OPT_INDENT_2))
    print(f"wrote {HERE / 'results.json'}")
    if misses:
        print(f"\nmake bench: {len(misses)} goal(s) MISSED:\n  " + "\n  ".join(misses), file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
