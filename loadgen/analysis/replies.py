"""How many replies were what the workload asked for (summary `replies`): valid JSON of the response_format's
schema, valid tool calls. Read from the rows' verdict (reply_valid, tool_calls, reply_problem: judged after
each stream by client/backends/replies.py), over the measured ok rows; null for a run that asked for no
structure (and for runs before the columns existed).

- `judged`: ok rows whose reply was judged; `valid`, `valid_share` (of judged; null without any);
- `json`: the replies judged as content (no call): `judged`, `parsed` (the content was JSON, whatever the
  schema said), `valid` (JSON the schema accepts), `valid_share`;
- `calls`: the replies judged as tool calls (and those that made none under tool_choice required or a
  named function): `judged`, `valid`, `valid_share`, `tool_calls` (calls in all ok replies);
- `not_judged`: ok rows without a verdict (tools under tool_choice auto answered in plain text);
- `problems`: {kind: rows} (the kinds of replies.PROBLEMS), `top`: [{`problem`, `count`}] the most
  frequent texts (at most TOP).
"""
from __future__ import annotations

import polars as pl

from loadgen import metrics
from loadgen.results.folder import Json, Run

TOP = 5
_CALL_KINDS = ("no_call", "undeclared", "arguments_not_json", "arguments_schema", "unexpected_call")


def section(run: Run) -> Json | None:
    asked = (run.manifest.get("config") or {}).get("structured")
    req = run.requests.filter(~pl.col("warmup"))
    if asked is None and not req["reply_valid"].is_not_null().any():
        return None
    ok = req.filter(metrics.OK_ROWS)
    judged = ok.filter(pl.col("reply_valid").is_not_null())
    kind = pl.col("reply_problem").str.split_exact(":", 1).struct.field("field_0")
    judged = judged.with_columns(kind.alias("kind"))
    as_call = ((pl.col("tool_calls").fill_null(0) > 0) | pl.col("kind").is_in(list(_CALL_KINDS))).fill_null(False)
    calls, content = judged.filter(as_call), judged.filter(~as_call)
    problems = dict(judged.filter(pl.col("kind").is_not_null()).group_by("kind").len().sort("kind").iter_rows())
    top = (judged.filter(pl.col("reply_problem").is_not_null()).group_by("reply_problem").len()
           .sort(["len", "reply_problem"], descending=[True, False]).head(TOP))
    return {"judged": judged.height, **_valid(judged),
            "json": {"judged": content.height,
                     "parsed": content.height - int((content["kind"] == "not_json").sum()), **_valid(content)},
            "calls": {"judged": calls.height, **_valid(calls), "tool_calls": int(ok["tool_calls"].sum() or 0)},
            "not_judged": ok.height - judged.height, "problems": problems,
            "top": [{"problem": p, "count": c} for p, c in top.iter_rows()]}


def _valid(rows: pl.DataFrame) -> Json:
    valid = int(rows["reply_valid"].sum() or 0)
    return {"valid": valid, "valid_share": valid / rows.height if rows.height else None}
