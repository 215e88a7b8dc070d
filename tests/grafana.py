"""The Grafana dashboard in docs/grafana/ as the tests read it: its PromQL queries, with Grafana's variables
replaced by what an "All" selection sends, and the metric names each query reads."""
from __future__ import annotations

import json
import re
from pathlib import Path

DASHBOARD = Path(__file__).resolve().parents[1] / "docs" / "grafana" / "loadgen-vllm.json"
VARIABLES = {"$__rate_interval": "1m", "$run_id": ".*", "$model_name": ".*"}
_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "bool",
             "offset", "inf", "nan"}


def queries() -> list[tuple[str, str]]:
    """(panel title, PromQL) of every panel target, the variables replaced."""
    out = []
    for panel in json.loads(DASHBOARD.read_text())["panels"]:
        for target in panel["targets"]:
            expr = target["expr"]
            for var, value in VARIABLES.items():
                expr = expr.replace(var, value)
            assert "$" not in expr, f"{panel['title']}: an unknown variable in {expr}"
            out.append((panel["title"], expr))
    return out


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects: identifiers outside strings, label matchers, ranges and
    by/without lists that are neither functions (followed by `(`) nor keywords."""
    bare = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    bare = re.sub(r"\{[^}]*\}|\[[^\]]*\]", " ", bare)
    bare = re.sub(r"\b(by|without|on|ignoring)\s*\([^)]*\)", " ", bare)
    names = set()
    for m in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", bare):
        rest = bare[m.end():].lstrip()
        if rest.startswith("(") or m.group().lower() in _KEYWORDS:
            continue
        names.add(m.group())
    return names
