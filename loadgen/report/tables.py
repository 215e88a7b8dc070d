"""The tables of the HTML and Markdown reports, as specifications over the summary dict.

A cell is either literal text or a `Key`: a dotted path into the summary (`latency_ms.ttft.p99`,
`by_prompt_tokens.0.n`). Both renderers turn a Key into text with `show`, the one number format of every
report (loadgen.report._f for floats), so what the HTML and the Markdown print is the JSON report's value,
rounded for reading, and a test can check it by resolving the same path in `loadgen report --format json`.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dataclasses import dataclass

from loadgen.analysis.summary import STATS
from loadgen.analysis.telemetry import GAUGES
from loadgen.report import BREAKDOWN_COLUMNS, _f, sampled
from loadgen.report.explain_text import split_unavailable
from loadgen.results.folder import Summary


@dataclass(frozen=True)
class Key:
    path: str
    pct: bool = False    # a fraction shown as a signed percentage (compare's relative changes)
    scale: float = 1.0   # shown as value x scale, in the unit the label names (1e-9: ns shown in s)


Cell = str | Key


@dataclass
class Table:
    title: str
    headers: list[str]
    rows: list[list[Cell]]
    note: str = ""


def lookup(summary: Mapping[str, Any], path: str):
    v = summary
    for part in path.split("."):
        v = v[int(part)] if isinstance(v, list) else v[part]
    return v


def text(c: Key, summary: Mapping[str, Any]) -> str:
    v = lookup(summary, c.path)
    if c.pct and v is not None:
        # an interval may be [None, None] (compare's within-noise metrics): shown as "-"
        return " – ".join(_pct(x) for x in v) if isinstance(v, list) else _pct(v)
    if c.scale != 1.0 and isinstance(v, (int, float)) and not isinstance(v, bool):
        return show(float(v) * c.scale)
    return show(v)


def _pct(v) -> str:
    # a fraction as a signed percentage; no value (a side without a successful request: null) is "-"
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return f"{v * 100:+.1f}%"
    return show(v)


def show(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, list):       # a confidence interval [low, high]
        return " – ".join(show(x) for x in v)
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return _f(v)
    return str(v)


def overview(s: Summary) -> Table:
    rows: list[list[Cell]] = [["requests scheduled", Key("requests.scheduled")], ["ok", Key("requests.ok")],
            ["failed", Key("requests.failed")], ["dropped", Key("requests.dropped")],
            ["offered rate (req/s)", Key("rate.offered_per_s")], ["achieved rate (req/s)", Key("rate.achieved_per_s")],
            ["throughput (ok req/s)", Key("throughput.requests_per_s")],
            ["throughput (output tok/s)", Key("throughput.output_tokens_per_s")]]
    if (s.get("throughput") or {}).get("prompt_tokens_per_s") is not None:  # (summaries before it: none)
        rows.append(["throughput (prompt tok/s)", Key("throughput.prompt_tokens_per_s")])
    rows += [[f"outcome {k}", Key(f"outcomes.{k}")] for k in sorted(s.get("outcomes") or {})]
    if isinstance(s.get("prefix_cache"), dict):  # analysis/prefix_cache.py (runs before it: no rows)
        rows += [["prefix-cache hit rate", Key("prefix_cache.hit_rate")],
                 ["hit rate the workload implies", Key("prefix_cache.expected_hit_rate")]]
    replies = s.get("replies")
    if isinstance(replies, dict):  # analysis/replies.py: a workload that sent tools / response_format
        rows += [["replies judged", Key("replies.judged")], ["replies valid", Key("replies.valid")],
                 ["replies valid (share)", Key("replies.valid_share")]]
        kinds = (("JSON replies", "json"), ("tool-call replies", "calls"))
        rows += [[f"{label} valid (share)", Key(f"replies.{k}.valid_share")]
                 for label, k in kinds if replies[k]["judged"]]
    if isinstance(s.get("errors"), dict) and s["errors"].get("error_rate") is not None:
        rows.append(["error rate (share of measured)", Key("errors.error_rate")])
    # keys of the sweep/compare feature (docs/sweep-and-compare.md), when the summary has them
    if isinstance(s.get("load"), dict) and "loop" in s["load"]:
        rows.append(["load loop", Key("load.loop")])
    for k in sorted(s.get("slo") or {}):
        rows.append([f"SLO {k}", Key(f"slo.{k}")])
    g = s.get("goodput")
    if isinstance(g, dict):
        rows += [[label, Key(f"goodput.{k}")] for label, k in (("goodput (req/s)", "requests_per_s"),
                                                                ("SLO attainment", "attainment")) if k in g]
    return Table("Requests, rate, throughput", ["", "value"], rows)


def breakdown(s: Summary, section: str) -> Table | None:
    """Per [[mix]] class (section "by_class") or per model ("by_model"), when the run has more than one
    (analysis/breakdown.py). Cells are the JSON's values as text (a model's name may hold dots, which a
    Key's dotted path cannot)."""
    groups = (s.get("breakdown") or {}).get(section)
    if not groups:
        return None
    label = "class" if section == "by_class" else "model"
    rows: list[list[Cell]] = []
    for name, g in groups.items():
        good = g.get("goodput") or {}
        rows.append([name, show(g["requests"]), show(g["ok"]), ",".join(map(str, g.get("priority") or [])) or "-",
                     *(show(g["latency_ms"][m][st]) for m, st in BREAKDOWN_COLUMNS), show(good.get("attainment"))])
    heads = [label, "requests", "ok", "priority", *(f"{m} {st}" for m, st in BREAKDOWN_COLUMNS), "SLO attainment"]
    return Table(f"Per {label} (ms)", heads, rows,
                 f"summary.json `breakdown.{section}`: each {label}'s requests alone, by the run's rules")


def errors(s: Summary) -> Table | None:
    """The most frequent error texts (analysis/failures.py), when anything failed."""
    e = s.get("errors") or {}
    if not e.get("failed"):
        return None
    rows: list[list[Cell]] = [[Key(f"errors.top.{i}.count"), Key(f"errors.top.{i}.outcome"),
                               Key(f"errors.top.{i}.kind"), Key(f"errors.top.{i}.text")] for i in range(len(e["top"]))]
    return Table("Errors", ["count", "outcome", "kind", "text"], rows,
                 f"{e['failed']} of {e['counted']} requests failed ({100 * e['error_rate']:.1f} %), "
                 "most frequent first; credentials redacted")


def telemetry(s: Summary) -> Table | None:
    """The GPU figures of the --scrape endpoints (analysis/telemetry.py): mean and max per GPU and overall."""
    tel = s.get("telemetry")
    if not isinstance(tel, dict) or not tel.get("gpus"):
        return None
    rows: list[list[Cell]] = []
    for gauge in GAUGES:
        overall = f"telemetry.overall.{gauge.key}"
        rows.append([gauge.label + (" (total)" if gauge.total else ""), Key(f"{overall}.mean"), Key(f"{overall}.max"),
                     *(Key(f"telemetry.gpus.{i}.{gauge.key}.mean") for i in range(len(tel["gpus"])))])
    rows.append(["energy J (window)", Key("telemetry.overall.energy_j"), "",
                 *(Key(f"telemetry.gpus.{i}.energy_j") for i in range(len(tel["gpus"])))])
    rows.append(["output tokens per J", Key("telemetry.overall.output_tokens_per_j"), "", *([""] * len(tel["gpus"]))])
    gpus = [f"gpu {g['gpu']} mean" for g in tel["gpus"]]
    return Table("GPU telemetry (--scrape, over the measured window)", ["", "mean", "max", *gpus], rows,
                 "dcgm-exporter fields; power and memory overall are the GPUs' total; energy is the counter's "
                 "increase over the window, tokens per J the window's output tokens over it")


def latency(s: Summary) -> Table:
    shown, empty = sampled(s)
    return Table("Latency (ms)", ["metric", *STATS],
                 [[m, *(Key(f"latency_ms.{m}.{st}") for st in STATS)] for m in shown],
                 "exact percentiles over all samples, summary.json `latency_ms`"
                 + (f"; no samples: {', '.join(empty)}" if empty else ""))


def histograms(s: Summary) -> Table | None:
    h = s.get("histograms")
    if not h:
        return None
    cols = ("count", "p50", "p99", "max", "out_of_range")
    empty = sampled(s)[1]
    return Table("HdrHistogram interval logs (ms, cross-check)", ["metric", *cols],
                 [[m, *(Key(f"histograms.{m}.{c}") for c in cols)] for m in h
                  if not (m in empty and not h[m]["count"])])


def generator(s: Summary) -> Table | None:
    g = s.get("generator")
    if not g or g.get("send_lag_p99_ms") is None:
        return None
    rows: list[list[Cell]] = [[label, Key(f"generator.{k}")] for label, k in (
        ("send lag p99 (ms)", "send_lag_p99_ms"), ("send lag max (ms)", "send_lag_max_ms"),
        ("overdue sends", "overdue"), ("dispatch-gap CV", "cv_dispatch"), ("dispatch-gap CV of the plan", "cv_plan"))
        if k in g]
    if isinstance(g.get("loop_lateness_ms"), dict) and "p99" in g["loop_lateness_ms"]:
        rows.append(["event-loop lateness p99 (ms)", Key("generator.loop_lateness_ms.p99")])
    for i, sh in enumerate(g.get("lag_shift") or []):
        rows.append([f"send lag moved {sh['figure']} by (ms)" + (" — AFFECTED" if sh["affected"] else ""),
                     Key(f"generator.lag_shift.{i}.shift_ms")])
    if g.get("cause"):
        rows.append(["client cause (starved / saturated)", Key("generator.cause")])
        rows += [[label, Key(f"generator.host.{k}")] for label, k in (
            ("loop CPU (share of a core)", "loop_cpu_share"), ("loop run-queue wait (share of the run)",
                                                               "loop_runqueue_share"),
            ("other processes' CPU (cores)", "others_cpu_cores"), ("steal (share)", "steal_share"))
            if (g.get("host") or {}).get(k) is not None]
    return Table("Generator self-check", ["", "value"], rows)


DECOMPOSITION_COLUMNS = (("mean", "mean"), ("at p99 e2e", "p99_e2e"), ("at p99 TTFT", "p99_ttft"))


def decomposition(s: Summary, components: tuple[str, ...]) -> Table | None:
    d = s.get("decomposition_ms")
    if not d:
        return None
    why = f" — {split_unavailable(s)}" if split_unavailable(s) else ""
    if not d.get("n"):   # nothing decomposed (a pooling run has no first token): one row, no table of dashes
        return Table("Where the time went (ms)", ["", "value"], [["ok requests with a first token",
                                                                  Key("decomposition_ms.n")]],
                     "nothing to split into queue, prefill and decode" + why)
    rows: list[list[Cell]] = [[("  " + c) if c.startswith("decode_") else c,
                               *(Key(f"decomposition_ms.{k}.{c}") for _, k in DECOMPOSITION_COLUMNS)]
                              for c in components]
    rows.append(["requests", Key("decomposition_ms.n"), Key("decomposition_ms.p99_e2e.n"),
                 Key("decomposition_ms.p99_ttft.n")])
    rows.append(["threshold", "", Key("decomposition_ms.p99_e2e.threshold_ms"),
                 Key("decomposition_ms.p99_ttft.threshold_ms")])
    return Table("Where the time went (ms)", ["component", *(c for c, _ in DECOMPOSITION_COLUMNS)], rows,
                 f"method: {d.get('method')}" + why)


def by_prompt(s: Summary) -> Table | None:
    bins = s.get("by_prompt_tokens") or []
    if not bins:
        return None
    cols = ("prompt_tokens_min", "prompt_tokens_max", "n", "ttft_p50", "tpot_p50", "queue_mean", "prefill_mean")
    return Table("By prompt length", ["min tokens", "max tokens", "n", "TTFT p50", "TPOT p50", "queue mean",
                                      "prefill mean"],
                 [[Key(f"by_prompt_tokens.{i}.{c}") for c in cols] for i in range(len(bins))], "ms")


def server_crosscheck(s: Summary) -> Table | None:
    h, q = s.get("server_histograms_ms"), s.get("queue_split_ms")
    if q:
        return queue_split(q)
    if not h:
        return None
    return Table("Server histograms (mean ms, cross-check)", ["queue", "prefill", "decode", "n"],
                 [[Key(f"server_histograms_ms.{k}") if k in h else "-" for k in ("queue", "prefill", "decode", "n")]])


def queue_split(q: dict) -> Table:
    """loadgen's split beside the server's own (analysis/server_split.py); disagreements in the note."""
    flagged = {d["component"] for d in q["disagreements"]}
    rows: list[list[Cell]] = [[c, Key(f"queue_split_ms.loadgen.{c}"), Key(f"queue_split_ms.server.{c}"),
                               Key(f"queue_split_ms.difference_ms.{c}"), Key(f"queue_split_ms.tolerance_ms.{c}"),
                               "DISAGREE" if c in flagged else "agree"] for c in ("queue", "prefill", "decode")]
    rows.append(["requests", Key("queue_split_ms.loadgen.n"), Key("queue_split_ms.server.n"), "", "", ""])
    rows.append(["front-end / step-boundary", Key("queue_split_ms.front_end_ms"), "", "", "", ""])
    notes = [f"ms; front-end = loadgen queue - engine queue; tolerance: {q['tolerance_rule']}.",
             *([q["front_end_note"] + "."] if q.get("front_end_note") else []),
             *(f"DISAGREE ({d['component']}): {d['finding']}." for d in q["disagreements"])]
    return Table("loadgen vs the server's own histograms", ["", "loadgen", "server", "difference", "tolerance", ""],
                 rows, " ".join(notes))


def config_rows(s: Summary) -> Table | None:
    c = s.get("config")
    if not isinstance(c, dict):
        return None
    keys: list[tuple[str, str | Key]] = [
            ("name", "config.name"), ("model", "config.model"), ("api", "config.api"), ("backend", "config.backend"),
            ("arrivals", "config.arrivals.process"), ("rate (req/s)", "config.arrivals.rate_per_s"),
            ("requests", "config.requests"), ("duration (s)", Key("config.duration_ns", scale=1e-9)),
            ("warm-up requests", "config.warmup_requests"), ("max concurrency", "config.max_concurrency"),
            ("seed", "config.seed"), ("target", "run.target")]
    rows: list[list[Cell]] = []
    for label, path in keys:
        key = path if isinstance(path, Key) else Key(path)
        try:
            lookup(s, key.path)
        except (KeyError, IndexError, TypeError):
            continue
        rows.append([label, key])
    return Table("Configuration", ["", "value"], rows)
