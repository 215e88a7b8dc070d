"""`loadgen report`'s split beside the server's own histograms (analysis/server_split.py), through the CLI:
the front-end time named, a disagreement beyond the stated tolerance flagged in JSON, text and Markdown."""
from __future__ import annotations

import orjson
import polars as pl
import pytest

from loadgen.analysis.server_split import TOL_ABS_MS, TOL_REL
from tests.integration.conftest import loadgen
from tests.synthetic_run import make_run

MS = 1_000_000


def with_histograms(run_dir, *, queue_s: float, prefill_s: float, decode_s: float, n: int) -> None:
    """Replace the folder's scrape by vLLM's three request histograms: 0 at the first sample, these means
    (seconds, `n` requests) at the last, on two label sets (engines) that share the counts."""
    rows = []
    for name, mean_s in (("queue", queue_s), ("prefill", prefill_s), ("decode", decode_s)):
        for labels, share in (('engine="0",model_name="tiny"', 0.25), ('engine="1",model_name="tiny"', 0.75)):
            for t_ns, k in ((0, 0.0), (60_000 * MS, 1.0)):
                rows.append((t_ns, f"vllm:request_{name}_time_seconds_sum", labels, k * share * n * mean_s))
                rows.append((t_ns, f"vllm:request_{name}_time_seconds_count", labels, k * share * n))
    pl.DataFrame(rows, schema={"t_ns": pl.Int64, "name": pl.String, "labels": pl.String, "value": pl.Float64},
                 orient="row").write_parquet(run_dir / "server_metrics.parquet")


def means(run_dir) -> dict:
    r = pl.read_parquet(run_dir / "requests.parquet")
    return {c: float(r[f"server_{c}_ms"].mean()) for c in ("queue", "prefill", "decode")} | {
        "ttft": float(((r["first_token_ns"] - r["intended_ns"]) / MS).mean())}


def report(run_dir, fmt: str = "json"):
    p = loadgen("report", str(run_dir), "--format", fmt)
    assert p.returncode == 0, p.stderr
    return orjson.loads(p.stdout) if fmt == "json" else p.stdout


def front_end(run_dir, ms: float) -> None:
    """loadgen's per-request queue `ms` longer than the engine's own, as a front end makes it."""
    r = pl.read_parquet(run_dir / "requests.parquet")
    r.with_columns(server_queue_ms=pl.col("server_queue_ms") + ms).write_parquet(run_dir / "requests.parquet")


def test_engine_queue_far_below_loadgens_is_named_front_end_and_flagged(tmp_path):
    run_dir = make_run(tmp_path / "run", 200)
    front_end(run_dir, 40.0)
    m = means(run_dir)
    # the engine says it queued 0.02 ms on average; prefill as loadgen's; decode 30 % longer than loadgen's;
    # it finished 230 requests in the window (warm-up and failed ones count there too)
    with_histograms(run_dir, queue_s=0.02e-3, prefill_s=m["prefill"] / 1e3, decode_s=1.3 * m["decode"] / 1e3, n=230)
    q = report(run_dir)["queue_split_ms"]
    assert q["server"]["n"] == 230 and q["loadgen"]["n"] == 200
    assert q["engine_queue_ms"] == pytest.approx(0.02, rel=1e-6)
    assert q["loadgen"]["queue"] == pytest.approx(m["queue"], rel=1e-6) and m["queue"] > 40.0
    assert q["front_end_ms"] == pytest.approx(m["queue"] - 0.02, rel=1e-6)
    assert q["tolerance_ms"]["queue"] == pytest.approx(max(TOL_ABS_MS, TOL_REL * m["ttft"]), rel=1e-3)
    assert q["tolerance_ms"]["decode"] == pytest.approx(TOL_REL * 1.3 * m["decode"], rel=1e-6)
    flagged = {d["component"]: d for d in q["disagreements"]}
    assert not q["agree"] and set(flagged) == {"queue", "decode"}
    assert flagged["decode"]["difference_ms"] == pytest.approx(-0.3 * m["decode"], rel=1e-6)
    assert f"{m['queue'] - 0.02:.1f} ms is front-end and step-boundary time" in flagged["queue"]["finding"]
    text = report(run_dir, "text")
    assert "DISAGREE (queue)" in text and "DISAGREE (decode)" in text and "front-end/step-boundary time" in text
    assert "server's per-request queue time" in text   # method server_timings: where front-end time is then


def test_the_markdown_page_shows_both_sides(tmp_path):
    run_dir = make_run(tmp_path / "run", 100)
    front_end(run_dir, 40.0)
    m = means(run_dir)
    with_histograms(run_dir, queue_s=(m["queue"] - 40.0) / 1e3, prefill_s=m["prefill"] / 1e3,
                    decode_s=m["decode"] / 1e3, n=100)
    q = report(run_dir)["queue_split_ms"]
    assert [d["component"] for d in q["disagreements"]] == ["queue"]
    assert q["front_end_ms"] == pytest.approx(40.0, abs=1e-6)
    md = report(run_dir, "md")
    assert "loadgen vs the server's own histograms" in md and "front-end = loadgen queue - engine queue" in md
    assert "| queue |" in md and "| DISAGREE |" in md and "| prefill |" in md and "| agree |" in md


def test_agreement_within_tolerance_and_none_without_histograms(tmp_path):
    run_dir = make_run(tmp_path / "run", 100)
    m = means(run_dir)
    # every server mean 5 % off loadgen's, inside 10 % of TTFT / of the server's decode
    with_histograms(run_dir, queue_s=m["queue"] * 1.0 / 1e3, prefill_s=m["prefill"] * 1.05 / 1e3,
                    decode_s=m["decode"] * 0.95 / 1e3, n=100)
    q = report(run_dir)["queue_split_ms"]
    assert q["agree"] and q["disagreements"] == [] and abs(q["front_end_ms"]) < 1e-6
    assert "DISAGREE" not in report(run_dir, "text")
    (run_dir / "server_metrics.parquet").unlink()
    assert report(run_dir)["queue_split_ms"] is None
