"""summary.json is typed to the last key: the keys `report` writes for a run are exactly those its TypedDicts
(results/folder.py) list, so a key added to summary.json without its type fails here."""
from __future__ import annotations

import orjson

from loadgen.analysis.report_summary import build
from loadgen.results.folder import Explanation, GoodputSection, RunSummary, Summary
from tests.synthetic_run import make_run


def _keys(td: type) -> set[str]:
    return set(td.__required_keys__ | td.__optional_keys__)  # type: ignore[attr-defined]


def test_summary_keys_are_the_typeddicts_keys(tmp_path):
    run_dir = make_run(tmp_path / "run", 200)
    _, summary, _ = build(run_dir)
    written = orjson.loads((run_dir / "summary.json").read_bytes())
    assert set(written) == set(summary)
    # without an SLO: every required key, and none of the SLO's
    assert set(written) == set(Summary.__required_keys__)
    assert not set(written) & {"slo", "goodput"}


def test_summary_keys_with_an_slo(tmp_path):
    run_dir = make_run(tmp_path / "run", 200)
    _, summary, _ = build(run_dir, slo_ms={"ttft": 500.0, "tpot": 50.0})
    written = orjson.loads((run_dir / "summary.json").read_bytes())
    assert set(written) == _keys(Summary)
    assert written["slo"] and written["goodput"]["requests"] == 200


def test_the_parts_make_up_the_summary():
    # summarize's keys, explain's, goodput's and build's own (load, config, breakdown): nothing listed twice
    parts = [_keys(RunSummary), _keys(Explanation), _keys(GoodputSection), {"load", "config", "breakdown"}]
    assert sum(len(p) for p in parts) == len(_keys(Summary))
    assert set().union(*parts) == _keys(Summary)
