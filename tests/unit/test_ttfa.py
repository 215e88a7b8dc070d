"""TTFA (time to the first answer token) through the results contract: rows interpreted from reasoning
transcripts, summarized, judged by an SLO, compared and gated; an older folder without the columns."""
from array import array
from pathlib import Path

import orjson
import polars as pl

from loadgen import metrics
from loadgen.analysis import goodput
from loadgen.analysis.summary import measured, summarize
from loadgen.cli.main import main
from loadgen.client.backends.openai import OpenAIBackend
from loadgen.client.recorder import Row
from loadgen.config.slo import parse_slo
from loadgen.results.folder import Run, read_run, requests_frame, tokens_frame
from tests.synthetic_run import make_run as synthetic_run
from tests.unit.test_reasoning_tool_streams import DONE, ROLE, ev, usage

MS = 1_000_000
THINK_THEN_ANSWER = [ROLE, ev('{"reasoning_content":"a"}'), ev('{"reasoning_content":"b"}'), ev('{"content":"c"}'),
                     ev('{"content":"d"}', '"stop"'), usage(4) + DONE]
PLAIN = [ROLE, ev('{"content":"c"}'), ev('{"content":"d"}', '"stop"'), usage(2) + DONE]
NO_ANSWER = [ROLE, ev('{"reasoning":"a"}'), ev('{"reasoning":"b"}', '"length"'), usage(2) + DONE]


def interpreted(i: int, intended_ms: int, reads: list[bytes], stamps_ms: list[int]) -> Row:
    r = Row(i, f"r{i}", intended_ms * MS, 9, 16)
    r.dispatched_ns = r.intended_ns
    OpenAIBackend("chat", "m", {}).interpret(r, array("q", [s * MS for s in stamps_ms]), reads)
    r.done_ns = r.last_token_ns
    return r


def reasoning_run() -> Run:
    rows = [interpreted(0, 0, THINK_THEN_ANSWER, [5, 20, 30, 50, 60, 60]),   # ttft 20, ttfa 50
            interpreted(1, 100, PLAIN, [105, 130, 140, 140]),                 # ttft = ttfa = 30
            interpreted(2, 200, NO_ANSWER, [205, 210, 220, 220])]             # ttft 10, no answer
    return Run(Path("."), {"status": "complete", "config": {"name": "t"}, "target": {"url": "x"}},
               requests_frame(rows, 0), tokens_frame(rows, 0))


def test_summary_reports_ttfa_beside_ttft():
    s = summarize(reasoning_run())
    assert s["latency_ms"]["ttft"]["max"] == 30 and s["latency_ms"]["ttft"]["mean"] == 20
    ttfa = s["latency_ms"]["ttfa"]
    assert (ttfa["p50"], ttfa["max"], ttfa["mean"]) == (30, 50, 40)  # the stream without an answer has none
    assert reasoning_run().requests["reasoning_tokens"].to_list() == [2, 0, 2]


def test_a_ttfa_slo_is_judged_and_a_stream_without_an_answer_misses_it():
    run = reasoning_run()
    slo = parse_slo("ttfa=40ms")
    assert slo == {"ttfa": 40.0}
    met = goodput.meets(metrics.latency_columns(measured(run)), run.tokens, slo)
    assert met["met_ttfa"].to_list() == [False, True, False]
    assert goodput.section(metrics.latency_columns(measured(run)), run.tokens, slo)["goodput"]["met"] == 1


def test_an_older_folder_without_the_columns_still_reads(tmp_path):
    run_dir = synthetic_run(tmp_path / "old", 40)
    req = pl.read_parquet(run_dir / "requests.parquet").drop("first_answer_ns", "reasoning_tokens", "cached_tokens")
    req.write_parquet(run_dir / "requests.parquet")
    run = read_run(run_dir)
    assert run.requests["first_answer_ns"].null_count() == run.requests["reasoning_tokens"].null_count() == 40
    s = summarize(run)
    assert s["latency_ms"]["ttfa"]["p50"] is None and s["latency_ms"]["ttft"]["p50"] is not None
    assert main(["export", str(run_dir), "--format", "csv", "--out", str(tmp_path / "r.csv")]) == 0
    exported = pl.read_csv(tmp_path / "r.csv")
    assert exported["ttfa_ms"].null_count() == 40 and exported["ttft_ms"].null_count() == 0


def test_compare_finds_a_later_answer_with_the_same_first_token(tmp_path, capsys):
    a, b = synthetic_run(tmp_path / "a", 200, seed=1), synthetic_run(tmp_path / "b", 200, seed=1)
    req = pl.read_parquet(b / "requests.parquet")
    req.with_columns(pl.col("first_answer_ns") + 80 * MS).write_parquet(b / "requests.parquet")
    out = tmp_path / "c.json"
    rc = main(["compare", str(a), str(b), "--resamples", "200", "--format", "json", "--out", str(out),
               "--fail-if", "p99 ttfa > +10%", "--fail-if", "p99 ttft > +10%"])
    assert rc == 4
    result = orjson.loads(out.read_bytes())
    (c,) = result["comparisons"]
    by = {(m["metric"], m["stat"]): m for m in c["metrics"]}
    assert by[("ttfa", "p50")]["verdict"] == "worse" and by[("ttft", "p50")]["verdict"] != "worse"
    assert result["failed_rules"] == [r for r in result["failed_rules"] if "ttfa" in r] != []
