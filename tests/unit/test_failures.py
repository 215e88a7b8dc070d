"""analysis/failures.py: which rows count, the rate, the threshold, the texts (redacted, cut, grouped)."""
import polars as pl

from loadgen.analysis import failures
from loadgen.client.recorder import Row


def rows(spec):
    # spec: (outcome, kind, detail, warmup)
    return pl.DataFrame({"outcome": [s[0] for s in spec], "error_kind": [s[1] for s in spec],
                         "error_detail": [s[2] for s in spec], "warmup": [s[3] for s in spec]},
                        schema={"outcome": pl.String, "error_kind": pl.String, "error_detail": pl.String,
                                "warmup": pl.Boolean})


def test_rate_counts_failures_and_drops_not_warmup_cancelled_or_interrupted():
    f = failures.summarize(rows([("ok", None, None, False)] * 6 + [
        ("http_error", "http_500", '{"error": "boom"}', False), ("http_error", "http_500", '{"error":  "boom"}', False),
        ("timeout", "request_timeout", None, False), ("dropped", "dropped", "held back", False),
        ("http_error", "http_500", "warm", True), ("cancelled", "cancelled", None, False),
        ("interrupted", "interrupted", None, False)]))
    assert (f["counted"], f["failed"]) == (10, 4) and f["error_rate"] == 0.4
    assert f["by_outcome"] == {"dropped": 1, "http_error": 2, "timeout": 1}
    assert f["top"][0] == {"outcome": "http_error", "kind": "http_500", "text": '{"error": "boom"}', "count": 2}
    assert failures.reason(f, 0.4) is None                       # at the threshold: still valid
    why = failures.reason(f, 0.39)
    assert why.startswith("errors: 4 of 10 requests failed (40.0 %") and "2× http_500" in why
    assert "only the 6 requests that succeeded" in why


def test_no_rows_no_rate_no_reason():
    f = failures.summarize(rows([]))
    assert f["error_rate"] is None and failures.reason(f, 0.0) is None


def test_error_texts_lose_credentials_and_length():
    echoed = ('{"error": "bad key sk-live1234567890abcd, header Authorization: Bearer eyJhbGciOi.abc.def, '
              'url http://alice:hunter2@proxy/v1, "api_key": "s3cr3t"}' + " pad" * 100)
    text = failures.summarize(rows([("http_error", "http_401", echoed, False)]))["top"][0]["text"]
    for secret in ("sk-live1234567890abcd", "eyJhbGciOi", "hunter2", "alice", "s3cr3t"):
        assert secret not in text, text
    assert len(text) == failures.TEXT_CHARS and text.endswith("…")
    # the recorder redacts before a row is written
    row = Row.__new__(Row)
    row.outcome = None
    row.fail("http_error", "http_401", echoed)
    assert "hunter2" not in row.error_detail and "sk-live" not in row.error_detail
