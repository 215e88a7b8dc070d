"""A benchmark, not a test: `vllm bench serve` and loadgen on the same vLLM at the same rate, side by side.

    make bench-vllm            (or: VLLM_PYTHON=... VLLM_MODEL=... python -m tests.e2e.bench_vllm --rate 2)

One vLLM server (tests/e2e/vllm_server.py, default flags). Each tool offers the same load in turn: Poisson
arrivals at --rate, prompts of 64-512 tokens (uniform), 64 output tokens with ignore_eos, a cold prefix
cache (vLLM's random dataset draws random token ids; loadgen gets a fresh seed). vLLM's /metrics is read
just before and just after each tool's run, so vLLM's own histograms (TTFT from its front end's arrival
to first token; time per output token) are given over each tool's window: where the server ran slower
in one window, both tools see it, and the table says so. Percentiles from vLLM's histograms are bucket
interpolations (Prometheus' histogram_quantile rule: coarse, vLLM's buckets are wide); means are exact.
Prints a Markdown table and writes it, with every tool's raw numbers, to --out.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path

import orjson

from loadgen.probe.scrape import parse
from tests.e2e.vllm_server import CLI, MODEL_NAME, VllmServer

PROMPT_MIN, PROMPT_MAX, OUTPUT = 64, 512, 64


def scrape(url: str) -> dict[tuple[str, str], float]:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    return {(name, labels): value for _, name, labels, value in parse(text, 0)}


def _delta(before: dict, after: dict, name: str) -> dict[str, float]:
    """after - before of every sample called `name`, keyed by labels."""
    return {lab: v - before.get((n, lab), 0.0) for (n, lab), v in after.items() if n == name}


def hist_mean_ms(before: dict, after: dict, base: str) -> float | None:
    s, c = sum(_delta(before, after, base + "_sum").values()), sum(_delta(before, after, base + "_count").values())
    return 1e3 * s / c if c else None


def hist_quantile_ms(before: dict, after: dict, base: str, q: float) -> float | None:
    """Linear interpolation inside the bucket holding rank q (Prometheus' histogram_quantile), summed over
    the histogram's label sets."""
    buckets: dict[float, float] = {}
    for lab, v in _delta(before, after, base + "_bucket").items():
        le = next(p.split("=", 1)[1].strip('"') for p in lab.split(",") if p.startswith("le="))
        buckets[float(le)] = buckets.get(float(le), 0.0) + v
    edges = sorted(buckets)
    if not edges or buckets[edges[-1]] == 0:
        return None
    rank, lo, below = q * buckets[edges[-1]], 0.0, 0.0
    for le in edges:
        if buckets[le] >= rank:
            if le == float("inf"):
                return 1e3 * lo
            return 1e3 * (lo + (le - lo) * (rank - below) / max(buckets[le] - below, 1e-12))
        lo, below = le, buckets[le]
    return None


def vllm_view(before: dict, after: dict) -> dict:
    out = {}
    for key, base in (("ttft", "vllm:time_to_first_token_seconds"),
                      ("tpot", "vllm:request_time_per_output_token_seconds")):
        out[f"p50_{key}"] = hist_quantile_ms(before, after, base, 0.5)
        out[f"p99_{key}"] = hist_quantile_ms(before, after, base, 0.99)
        out[f"mean_{key}"] = hist_mean_ms(before, after, base)
    out["n"] = int(sum(_delta(before, after, "vllm:e2e_request_latency_seconds_count").values()))
    out["prefix_cache_hits"] = sum(_delta(before, after, "vllm:prefix_cache_hits_total").values())
    return out


def run_bench(py: str, model: str, url: str, rate: float, n: int, out: Path) -> dict:
    mid = (PROMPT_MIN + PROMPT_MAX) // 2
    ratio = (PROMPT_MAX - PROMPT_MIN) / (PROMPT_MAX + PROMPT_MIN)   # uniform in [mid(1-r), mid(1+r)]
    cmd = [py, str(CLI), "bench", "serve", "--backend", "vllm", "--base-url", url, "--endpoint", "/v1/completions",
           "--model", MODEL_NAME, "--tokenizer", model, "--dataset-name", "random",
           "--random-input-len", str(mid), "--random-output-len", str(OUTPUT),
           "--random-range-ratio", orjson.dumps({"input": round(ratio, 4), "output": 0.0}).decode(),
           "--num-prompts", str(n), "--request-rate", str(rate), "--ignore-eos", "--seed", str(int(time.time())),
           "--percentile-metrics", "ttft,tpot,itl", "--metric-percentiles", "50,99", "--disable-tqdm",
           "--save-result", "--result-dir", str(out), "--result-filename", "vllm-bench.json"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "VLLM_TARGET_DEVICE": "cpu"}
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
    (out / "vllm-bench.log").write_text(p.stdout + p.stderr)
    if p.returncode != 0:
        raise SystemExit(f"vllm bench serve failed ({p.returncode}): {(p.stdout + p.stderr)[-3000:]}")
    r = orjson.loads((out / "vllm-bench.json").read_bytes())
    return {k: r.get(f"{k}_ms") for k in ("p50_ttft", "p99_ttft", "p50_tpot", "p99_tpot", "mean_ttft", "mean_tpot")} | {
        "n": r.get("completed")}


def run_loadgen(url: str, rate: float, n: int, out: Path) -> dict:
    wl = out / "loadgen.toml"
    wl.write_text(textwrap.dedent(f"""
        model = "{MODEL_NAME}"
        api = "completions"
        seed = {int(time.time())}
        [arrivals]
        process = "poisson"
        rate = "{rate}/s"
        [prompt]
        tokens = {{ dist = "uniform", min = {PROMPT_MIN}, max = {PROMPT_MAX} }}
        [output]
        tokens = {OUTPUT}
        [request]
        extra_body = {{ ignore_eos = true }}
        """))
    # no calibration: its probes would land in vLLM's histograms of this window
    cmd = [sys.executable, "-m", "loadgen", "run", str(wl), "--url", url, "--requests", str(n), "--no-calibrate",
           "--out", str(out / "loadgen"), "--overwrite", "--quiet"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if p.returncode not in (0, 3):   # 3: the self-check judged the run invalid; its numbers still print
        raise SystemExit(f"loadgen run failed ({p.returncode}): {p.stderr[-3000:]}")
    s = orjson.loads(subprocess.run([sys.executable, "-m", "loadgen", "report", str(out / "loadgen"), "--format",
                                     "json"], capture_output=True, text=True, check=True).stdout)
    lat = s["latency_ms"]
    return {"p50_ttft": lat["ttft"]["p50"], "p99_ttft": lat["ttft"]["p99"], "p50_tpot": lat["tpot"]["p50"],
            "p99_tpot": lat["tpot"]["p99"], "mean_ttft": lat["ttft"]["mean"], "mean_tpot": lat["tpot"]["mean"],
            "n": s["requests"]["ok"], "valid": s.get("valid"),
            "invalid_reasons": s.get("invalid_reasons")}


def table(rows: list[tuple[str, dict]]) -> str:
    def f(v):
        return "-" if v is None else f"{v:.1f}"
    lines = ["| | n | TTFT p50 | TTFT p99 | TTFT mean | TPOT p50 | TPOT p99 | TPOT mean |",
             "|:--|--:|--:|--:|--:|--:|--:|--:|"]
    for name, r in rows:
        mark = "" if r.get("valid", True) else " (invalid: see bench.json)"
        lines.append(f"| {name}{mark} | {r.get('n')} | " + " | ".join(
            f(r.get(k)) for k in ("p50_ttft", "p99_ttft", "mean_ttft", "p50_tpot", "p99_tpot", "mean_tpot")) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--rate", type=float, default=2.0, help="requests per second, both tools (default 2)")
    ap.add_argument("--requests", type=int, default=120, help="requests per tool (default 120)")
    ap.add_argument("--out", default="results/bench-vllm", help="folder for the table and raw numbers")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    srv = VllmServer(out / "vllm-server.log")
    srv.start()
    print(f"vLLM ready in {srv.ready_s:.1f} s at {srv.url}", file=sys.stderr)
    try:
        rows, raw = [], {}
        tools = (("vllm bench serve", lambda: run_bench(srv.python, srv.model, srv.url, a.rate, a.requests, out)),
                 ("loadgen", lambda: run_loadgen(srv.url, a.rate, a.requests, out)))
        for name, go in tools:
            before = scrape(srv.url)
            print(f"running {name}: {a.requests} requests at {a.rate:g}/s", file=sys.stderr)
            mine = go()
            theirs = vllm_view(before, scrape(srv.url))
            rows += [(name, mine), (f"vLLM's histograms, {name} window", theirs)]
            raw[name] = {"tool": mine, "vllm": theirs}
    finally:
        srv.stop()
    md = (f"{a.requests} requests per tool, Poisson {a.rate:g}/s, prompts {PROMPT_MIN}-{PROMPT_MAX} tokens, "
          f"{OUTPUT} out, cold cache; ms\n\n" + table(rows))
    (out / "table.md").write_text(md + "\n")
    (out / "bench.json").write_bytes(orjson.dumps(raw, option=orjson.OPT_INDENT_2))
    print(md)


if __name__ == "__main__":
    main()
