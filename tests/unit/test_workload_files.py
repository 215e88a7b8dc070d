"""Every shipped workload loads and schedules; the classic-observation workloads have their shape;
`loadgen schedule` writes the plan (stdout, .jsonl, .parquet) and a written plan replays as a trace."""
import subprocess
import sys
from pathlib import Path

import numpy as np
import orjson
import polars as pl
import pytest

from loadgen.config import workload as config
from loadgen.plan.schedule import NONE, build

ROOT = Path(__file__).resolve().parents[2]
WORKLOADS = sorted((ROOT / "workloads").glob("*.toml"))
REQUIRED = {"quickstart", "chat-mixed", "rag-long-prompts", "shared-system-prompt", "multi-turn-chat",
            "azure-replay", "mooncake-replay", "burstgpt-replay", "prefill-vs-decode",
            "chunked-prefill-interference", "embeddings", "rerank"}


def test_the_ready_workloads_are_all_there():
    assert REQUIRED <= {p.stem for p in WORKLOADS}


@pytest.mark.parametrize("path", WORKLOADS, ids=lambda p: p.stem)
def test_every_workload_loads_and_schedules(path):
    s = build(config.load(path))
    timed = s.intended_ns[s.after == NONE]
    assert len(s) > 0 and timed[0] == 0 and np.all(np.diff(timed) >= 0)
    pooling = path.stem in ("embeddings", "rerank")   # nothing generated: no max_tokens
    assert s.prompt_tokens.min() >= 1
    assert (s.max_tokens == 0).all() if pooling else s.max_tokens.min() >= 1


def test_prefill_vs_decode_alternates_200_and_2000():
    s = build(config.load(ROOT / "workloads" / "prefill-vs-decode.toml"))
    assert s.prompt_tokens[:6].tolist() == [200, 2000] * 3 and len(set(s.max_tokens.tolist())) == 1
    assert np.all(np.diff(s.intended_ns) == 1_000_000_000)


def test_chunked_prefill_interference_mixes_long_prompts_into_decoders():
    s = build(config.load(ROOT / "workloads" / "chunked-prefill-interference.toml"))
    long = s.prompt_tokens == 8000
    assert 0 < long.sum() < 0.2 * len(s) and np.all(s.max_tokens[~long] == 512)


def loadgen(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "loadgen", *map(str, args)], capture_output=True, text=True,
                          timeout=60, cwd=ROOT, check=False)


def test_schedule_outputs_and_a_written_plan_replays(tmp_path):
    w = ROOT / "workloads" / "shared-system-prompt.toml"
    p = loadgen("schedule", w, "--requests", "20")
    lines = [orjson.loads(x) for x in p.stdout.splitlines()]
    assert p.returncode == 0 and len(lines) == 20
    keys = {"request_id", "intended_ns", "prompt_tokens", "max_tokens", "prefix_group", "session", "turn"}
    assert keys <= set(lines[0])
    assert loadgen("schedule", w, "--requests", "20", "--out", tmp_path / "plan.parquet").returncode == 0
    assert pl.read_parquet(tmp_path / "plan.parquet")["intended_ns"].to_list() == [r["intended_ns"] for r in lines]
    assert loadgen("schedule", w, "--requests", "20", "--out", tmp_path / "plan.jsonl").returncode == 0
    again = loadgen("schedule", w, "--trace", tmp_path / "plan.jsonl")
    replayed = [orjson.loads(x) for x in again.stdout.splitlines()]
    assert [(r["intended_ns"], r["prompt_tokens"], r["max_tokens"], r["prefix_group"]) for r in replayed] == \
        [(r["intended_ns"], r["prompt_tokens"], r["max_tokens"], r["prefix_group"]) for r in lines]


@pytest.mark.parametrize("args,expected", [
    # the trace does not exist
    (["--trace", "nope.csv"], "--trace: no such file"),
    # an unknown format name
    (["--trace", "workloads/traces/azure_synthetic.csv", "--trace-format", "parquet"],
     "--trace-format: must be one of"),
    # a time scale that is not a positive number
    (["--trace", "workloads/traces/azure_synthetic.csv", "--time-scale", "fast"], "--time-scale: must be a number > 0"),
    # a format that does not match the file
    (["--trace", "workloads/traces/azure_synthetic.csv", "--trace-format", "burstgpt"],
     "missing column(s) 'Timestamp'"),
    # --out with an unknown extension
    (["--out", "plan.txt"], "must end in .jsonl or .parquet"),
])
def test_schedule_bad_input_exits_2_without_traceback(args, expected):
    p = loadgen("schedule", "workloads/quickstart.toml", *args)
    assert p.returncode == 2 and expected in p.stderr and "Traceback" not in p.stderr, p.stderr
