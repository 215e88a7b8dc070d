"""Trace readers on the shipped synthetic traces and on broken fixtures (file and line named)."""
from pathlib import Path

import numpy as np
import pytest

from loadgen.plan import arrivals, traces
from loadgen.plan.traces import TraceError

TRACES = Path(__file__).resolve().parents[2] / "workloads" / "traces"
SHIPPED = ["azure_synthetic.csv", "burstgpt_synthetic.csv", "mooncake_synthetic.jsonl", "loadgen_synthetic.jsonl"]


@pytest.mark.parametrize("name,fmt", list(zip(SHIPPED, ["azure", "burstgpt", "mooncake", "jsonl"])))
def test_shipped_traces_sniff_and_read(name, fmt):
    assert traces.sniff(TRACES / name) == fmt
    t = traces.read(TRACES / name)
    assert t.format == fmt and len(t) > 300
    assert np.all(np.diff(t.timestamps_ns) >= 0) and t.timestamps_ns.dtype == np.int64
    assert t.prompt_tokens.min() >= 1 and t.prompt_tokens.max() > 5 * np.median(t.prompt_tokens)  # heavy tail


def test_all_formats_hold_the_same_synthetic_requests():
    # make_traces.py writes one set of requests in four layouts: the readers must agree.
    az, bg, mc, own = (traces.read(TRACES / n) for n in SHIPPED)
    assert np.array_equal(az.prompt_tokens, mc.prompt_tokens) and np.array_equal(az.prompt_tokens, own.prompt_tokens)
    # azure is relative to its first row; the others keep the file's origin (same gaps, to the unit written)
    assert np.allclose(np.diff(az.timestamps_ns), np.diff(own.timestamps_ns), atol=1_000)
    assert np.allclose(np.diff(mc.timestamps_ns), np.diff(own.timestamps_ns), atol=1_000_000)
    assert bg.skipped["failed"] == 400 - len(bg)  # Response tokens 0 = failed: skipped and counted
    assert all(len(h) == -(-p // 512) for h, p in zip(mc.hash_ids, mc.prompt_tokens))


def test_replay_reproduces_the_trace_gaps():
    t = traces.read(TRACES / "loadgen_synthetic.jsonl")
    assert np.array_equal(np.diff(arrivals.replay(t.timestamps_ns, time_scale=1.0)), np.diff(t.timestamps_ns))


BURST_HEAD = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
AZURE_HEAD = "TIMESTAMP,ContextTokens,GeneratedTokens\n"


@pytest.mark.parametrize("name,text,fmt,expected", [
    # a required column is missing: named, on line 1
    ("a.csv", "Timestamp,Model,Request tokens\n1,x,3\n", "burstgpt", "a.csv:1: missing column(s) 'Response tokens'"),
    # a non-numeric length on data line 2 (file line 3)
    ("b.csv", BURST_HEAD + "1,m,5,5,10,C\n2,m,five,5,10,C\n", "burstgpt", "b.csv:3: Request tokens is not an integer"),
    # negative timestamp
    ("c.csv", BURST_HEAD + "-1,m,5,5,10,C\n", "burstgpt", "c.csv:2: Timestamp is negative"),
    # unsorted timestamps
    ("d.csv", BURST_HEAD + "5,m,5,5,10,C\n4,m,5,5,10,C\n", "burstgpt",
     "d.csv:3: Timestamp is earlier than the row before"),
    # azure: a timestamp that is not a datetime
    ("e.csv", AZURE_HEAD + "2023-11-16 18:15:46.6805900,10,5\nyesterday,10,5\n", "azure",
     "e.csv:3: TIMESTAMP is not a valid timestamp"),
    # mooncake: a line that is not JSON, and one without input_length
    ("f.jsonl", '{"timestamp": 1, "input_length": 5, "output_length": 2}\n{oops\n', "mooncake",
     "f.jsonl:2: not a JSON object"),
    ("g.jsonl", '{"timestamp": 1, "output_length": 2}\n', "mooncake", "g.jsonl:1: input_length is missing"),
    ("h.jsonl", '{"timestamp": 1, "input_length": 5, "output_length": 2, "hash_ids": ["x"]}\n', "mooncake",
     "h.jsonl:1: hash_ids must be a list of integers"),
    # own jsonl: unsorted
    ("i.jsonl", '{"intended_ns": 9, "prompt_tokens": 5, "max_tokens": 2}\n'
                '{"intended_ns": 3, "prompt_tokens": 5, "max_tokens": 2}\n',
     "jsonl", "i.jsonl:2: intended_ns is earlier"),
])
def test_broken_traces_name_file_and_line(tmp_path, name, text, fmt, expected):
    p = tmp_path / name
    p.write_text(text)
    with pytest.raises(TraceError) as e:
        traces.read(p, fmt)
    assert any(expected in m for m in e.value.problems), e.value.problems


def test_skip_bad_rows_drops_and_counts(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text(BURST_HEAD + "1,m,5,5,10,C\n2,m,x,5,10,C\n1.5,m,5,5,10,C\n3,m,7,0,7,C\n4,m,8,2,10,C\n")
    t = traces.read(p, skip_bad_rows=True)
    assert t.skipped == {"bad_rows": 2, "failed": 1}
    assert t.timestamps_ns.tolist() == [1_000_000_000, 4_000_000_000] and t.prompt_tokens.tolist() == [5, 8]


def test_every_bad_row_is_counted_but_only_ten_are_listed(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text(BURST_HEAD + "".join(f"{i},m,x,1,1,C\n" for i in range(25)))
    with pytest.raises(TraceError) as e:
        traces.read(p)
    assert len([m for m in e.value.problems if "Request tokens" in m]) == 10
    assert any("15 more bad rows" in m for m in e.value.problems)
    assert any("25 bad row(s)" in m and "--skip-bad-rows" in m for m in e.value.problems)


def test_unknown_format_asks_for_the_flag(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text("a,b\n1,2\n")
    with pytest.raises(TraceError, match="--trace-format"):
        traces.read(p)
