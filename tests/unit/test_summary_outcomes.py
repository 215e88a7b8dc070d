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
    assert s["requests"] == {"scheduled": 3, "ok": 1, "failed": 1, "dropped": 0, "abandoned": 0}
    assert s["outcomes"]["cancelled"] == 1


def test_abandoned_rows_are_not_failed_and_are_counted(tmp_path):
    # [abandon]: closed by the client as planned, with what they had received: neither ok nor failed
    run = make_run([{"id": "a", "tokens": [10, 20]},
                    {"id": "b", "tokens": [30], "outcome": "abandoned"},
                    {"id": "c", "tokens": [50, 60], "outcome": "http_error"}],
                   manifest={"status": "complete", "schedule": {"requests": 3}})
    s = summarize(replace(run, path=tmp_path))
    assert s["requests"] == {"scheduled": 3, "ok": 1, "failed": 1, "dropped": 0, "abandoned": 1}
    assert s["errors"]["counted"] == 2 and s["errors"]["error_rate"] == 0.5
    assert s["latency_ms"]["ttft"]["p50"] is not None and s["abandoned"] is None   # no plan in these rows
