"""Writes the small SYNTHETIC traces in this folder, one per supported format. They are not real
production data: they are drawn from a seeded model with the shape real traces have, so replay
workloads and tests work offline. Regenerate with `python workloads/traces/make_traces.py`.

Shape: arrivals follow a two-state modulated Poisson process (calm at ~2/s, bursts at ~12/s lasting a
few seconds), prompt lengths are lognormal (median ~600 tokens, heavy right tail up to 16k), output
lengths lognormal (median ~150). Mooncake rows share leading 512-token blocks (a few long system
prompts / documents reused by many requests), so replay exercises prefix caching.
"""
from __future__ import annotations

import sys
from datetime import datetime, timedelta
from pathlib import Path

import numpy as np

HERE = Path(__file__).parent
ROWS = 400


def arrivals_s(rng: np.random.Generator, n: int) -> np.ndarray:
    t, out, burst = 0.0, [], False
    state_end = rng.exponential(20.0)
    while len(out) < n:
        rate = 12.0 if burst else 2.0
        t += rng.exponential(1.0 / rate)
        if t > state_end:
            burst = not burst
            state_end = t + rng.exponential(4.0 if burst else 20.0)
        out.append(t)
    return np.array(out)


def lengths(rng: np.random.Generator, n: int, median: float, sigma: float, hi: int) -> np.ndarray:
    return np.clip(np.rint(rng.lognormal(np.log(median), sigma, n)), 1, hi).astype(int)


def main(out: Path = HERE) -> None:
    rng = np.random.default_rng(20240601)
    t = arrivals_s(rng, ROWS)
    p = lengths(rng, ROWS, 600, 1.0, 16000)
    o = lengths(rng, ROWS, 150, 0.8, 2000)
    header = "# SYNTHETIC trace made by workloads/traces/make_traces.py (not production data)\n"
    # Azure LLM inference trace layout (CSV; no comment line: the real files have none either).
    start = datetime(2023, 11, 16, 18, 0, 0)
    with open(out / "azure_synthetic.csv", "w") as f:
        f.write("TIMESTAMP,ContextTokens,GeneratedTokens\n")
        f.writelines(f"{(start + timedelta(seconds=float(ti))).strftime('%Y-%m-%d %H:%M:%S.%f')}0,{pi},{oi}\n" for ti, pi, oi in zip(t, p, o))
    # BurstGPT layout; ~3% failed requests (Response tokens 0), as in the real logs.
    failed = rng.random(ROWS) < 0.03
    models = np.where(rng.random(ROWS) < 0.8, "ChatGPT", "GPT-4")
    with open(out / "burstgpt_synthetic.csv", "w") as f:
        f.write("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n")
        for ti, m, pi, oi, bad in zip(t, models, p, o, failed):
            oi = 0 if bad else oi
            f.write(f"{ti:.3f},{m},{pi},{oi},{pi + oi},Conversation log\n")
    # Mooncake layout: timestamp in ms; hash_ids = 512-token blocks, leading blocks shared per group.
    groups = [list(range(g * 1000, g * 1000 + int(rng.integers(1, 8)))) for g in range(6)]
    next_id = 100_000
    with open(out / "mooncake_synthetic.jsonl", "w") as f:
        for ti, pi, oi in zip(t, p, o):
            n_blocks = -(-int(pi) // 512)
            ids = []
            if rng.random() < 0.7:
                ids = groups[int(rng.integers(0, len(groups)))][:n_blocks]
            while len(ids) < n_blocks:
                ids.append(next_id)
                next_id += 1
            f.write(f'{{"timestamp": {round(ti * 1000)}, "input_length": {pi}, "output_length": {oi}, '
                    f'"hash_ids": [{", ".join(map(str, ids))}]}}\n')
    with open(out / "loadgen_synthetic.jsonl", "w") as f:
        for i, (ti, pi, oi) in enumerate(zip(t, p, o)):
            f.write(f'{{"request_id": "t-{i:06d}", "intended_ns": {round(ti * 1e9)}, "prompt_tokens": {pi}, '
                    f'"max_tokens": {oi}}}\n')
    (out / "README.md").write_text(header.lstrip("# ") + "\n" + __doc__)


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE)
