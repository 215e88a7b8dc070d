"""Issue 15 defect 9: rows `cancelled` by SIGINT/SIGTERM were never sent: not counted as failed."""
from dataclasses import replace

from loadgen.analysis.summary import summarize
from tests.frames import make_run


def test_cancelled_rows_are_not_failed(tmp_path):
    run = make_run([{"id": "a", "tokens": [10, 20]},
                    {"id": "b", "tokens": [30, 40], "outcome": "interrupted"},
                    {"id": "c", "tokens": [50, 60], "outcome": "cancelled"}],
                   manifest={"status": "interrupted", "schedule": {"requests": 3}})
    s = summarize(replace(run, path=tmp_path))
    assert s["requests"] == {"scheduled": 3, "ok": 1, "failed": 1, "dropped": 0}
    assert s["outcomes"]["cancelled"] == 1
