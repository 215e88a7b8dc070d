"""`loadgen report RUN --format md`: a compact Markdown summary (tables, verdict, diagnosis) to paste into an
issue or a pull request. The same table specifications and number format as the HTML report
(tables.py), so every number equals the JSON report's value, rounded for reading."""
from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from loadgen.analysis.decompose import COMPONENTS
from loadgen.report import tables
from loadgen.results.folder import Summary


# Text that may come from the server (model names, error texts, version strings) or a user (names, paths)
# is made inert: it cannot end a table cell (|), open a code span (`), emphasis (*), a link ([ ]), raw HTML
# (<, as an entity: > alone opens nothing mid-line) or a new block (a line break); a backslash is escaped
# first.
_INERT = str.maketrans({"\\": "\\\\", "|": "\\|", "`": "\\`", "*": "\\*", "[": "\\[", "]": "\\]",
                        "<": "&lt;", "\n": " ", "\r": " "})


def inert(text: object) -> str:
    return str(text).translate(_INERT)


def code(text: object) -> str:
    """text as an inline code span: fenced by more backticks than its longest run of them (no escape works
    inside a code span), on one line, a pipe escaped (GFM splits a table row at | before reading code)."""
    t = str(text).replace("\r", " ").replace("\n", " ").replace("|", "\\|")
    longest = max((len(run) for run in re.findall(r"`+", t)), default=0)
    pad = " " if longest else ""
    return f"{'`' * (longest + 1)}{pad}{t}{pad}{'`' * (longest + 1)}"


def cell(c: tables.Cell, s: Mapping[str, Any]) -> str:
    return inert(tables.text(c, s) if isinstance(c, tables.Key) else c)


def table_md(t: tables.Table | None, s: Mapping[str, Any]) -> list[str]:
    if t is None:
        return []
    lines = [f"**{inert(t.title)}**" + (f" ({inert(t.note)})" if t.note else ""), "",
             "| " + " | ".join(inert(h) or " " for h in t.headers) + " |",
             "|" + "|".join(":--" if i == 0 else "--:" for i in range(len(t.headers))) + "|"]
    lines += ["| " + " | ".join(cell(c, s) for c in row) + " |" for row in t.rows]
    return lines + [""]


def verdict_md(s: Summary) -> list[str]:
    return _verdict_md(s) + _affected_md(s)


def _affected_md(s: Summary) -> list[str]:
    """The figures the client's send lag moved beyond their tolerance (selfcheck.py), and its cause."""
    g = s.get("generator") or {}
    if not g.get("affected"):
        return []
    return [f"Figures moved by the client's send lag beyond their tolerance: {', '.join(g['affected'])} "
            f"(client {g.get('cause', 'unknown')}).", ""]


def _verdict_md(s: Summary) -> list[str]:
    if s.get("valid"):
        return [f"**Valid run** (status {code(s['run']['status'])}): the generator kept its schedule.", ""]
    return ["**INVALID run**: its figures do not describe the server, for these reasons:", "",
            *(f"- {inert(r)}" for r in s.get("invalid_reasons") or []), ""]


def diagnosis_md(s: Summary) -> list[str]:
    findings = s.get("diagnosis")
    if findings is None:
        return []
    if not findings:
        return ["**Diagnosis**: no rule fired.", ""]
    return ["**Diagnosis**", "", *(f"- **{inert(f['rule'])}**: {inert(f['finding'])} *Remedy:* {inert(f['remedy'])}"
                                   for f in findings), ""]


def render_run(summary: Summary) -> str:
    s = summary
    t = tables
    lines = [f"### loadgen report: {inert(s['run'].get('name') or s['run']['path'])}", "",
             f"{code(s['run']['path'])} against {code(s['run']['target'])}", ""]
    lines += verdict_md(s)
    for table in (t.overview(s), t.errors(s), t.telemetry(s), t.latency(s), t.breakdown(s, "by_class"),
                  t.breakdown(s, "by_model"), t.decomposition(s, COMPONENTS), t.by_prompt(s), t.server_crosscheck(s)):
        lines += table_md(table, s)
    lines += diagnosis_md(s)
    lines += table_md(t.config_rows(s), s)
    return "\n".join(lines).rstrip() + "\n"
