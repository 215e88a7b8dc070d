"""Renderers of a summary dict: text for terminals, JSON for other tools."""
from __future__ import annotations

import orjson

from loadgen.analysis.summary import METRICS, STATS
from loadgen.metrics import PERCENTILE_RULE
from loadgen.results.folder import Summary
from loadgen.report.explain_text import explain_lines


def to_json(summary: Summary) -> str:
    return orjson.dumps(summary, option=orjson.OPT_INDENT_2).decode() + "\n"


def sampled(summary: Summary) -> tuple[list[str], list[str]]:
    """(the latency metrics with samples, those without), in METRICS order. A metric without a single sample
    (every statistic null: no streamed token in a pooling run, every request failed) is named once by the
    reports, not drawn as a row of dashes."""
    lat = summary["latency_ms"]
    present = [m for m in METRICS if lat.get(m) is not None]
    empty = [m for m in present if all(lat[m][st] is None for st in STATS)]
    return [m for m in present if m not in empty], empty


def to_text(summary: Summary) -> str:
    r, rate, thr = summary["requests"], summary["rate"], summary["throughput"]
    lines = [
        f"run        {summary['run']['path']}  ({summary['run']['status']})",
        f"target     {summary['run']['target']}"
        + (f"  (server: {summary['server']})" if summary.get("server") else ""),
        f"requests   scheduled {r['scheduled']}  ok {r['ok']}  failed {r['failed']}  dropped {r['dropped']}",
        "outcomes   " + "  ".join(f"{k} {v}" for k, v in sorted(summary["outcomes"].items())),
        *_error_lines(summary.get("errors")),
        f"rate       offered {_f(rate['offered_per_s'])}/s  achieved {_f(rate['achieved_per_s'])}/s",
        f"throughput {_f(thr['requests_per_s'])} req/s  {_f(thr['output_tokens_per_s'])} output tok/s"
        + (f"  {_f(thr['prompt_tokens_per_s'])} prompt tok/s" if thr.get("prompt_tokens_per_s") is not None else ""),
        *_prefix_cache_lines(summary),
        *_abandoned_lines(summary),
        *_reply_lines(summary),
        *_agentic_lines(summary),
        *_telemetry_lines(summary.get("telemetry")),
        "",
        f"{'latency (ms)':<16}" + "".join(f"{s:>10}" for s in STATS),
    ]
    shown, empty = sampled(summary)
    for m in shown:
        d = summary["latency_ms"][m]
        lines.append(f"{m:<16}" + "".join(f"{_f(d[s]):>10}" for s in STATS))
    if empty:
        lines.append(f"no samples: {', '.join(empty)}")
    lines.append(f"percentiles: {summary.get('percentiles') or PERCENTILE_RULE}; HDR figures take the same rank "
                 "and report its bucket's highest value (at most 0.1 % above)")
    h = summary.get("histograms")
    if h:
        lines += ["", f"{'HDR (*.hlog)':<16}{'count':>10}{'p50':>10}{'p99':>10}{'max':>10}{'out-of-range':>14}"]
        for m, d in h.items():
            if d["count"] == 0 and m in empty:
                continue   # named under the latency table
            lines.append(f"{m:<16}{d['count']:>10}" + "".join(f"{_f(d[s]):>10}" for s in ("p50", "p99", "max"))
                         + f"{d['out_of_range'] if d['out_of_range'] is not None else '-':>14}")
    g = summary.get("generator")
    if g and g.get("send_lag_p99_ms") is not None:
        lat = g.get("loop_lateness_ms") or {}
        lines += ["", f"generator  send_lag p99 {_f(g['send_lag_p99_ms'])} ms  overdue {g.get('overdue')}  "
                      f"dispatch-gap CV {_f(g.get('cv_dispatch'))} (plan {_f(g.get('cv_plan'))})  "
                      f"loop lateness p99 {_f(lat.get('p99'))} ms"]
        lines += _lag_lines(g)
    lines += _load_and_goodput(summary)
    lines += breakdown_lines(summary)
    if "decomposition_ms" in summary:  # written by analysis/explain.py
        lines += explain_lines(summary)
    pl_ = summary.get("prompt_lengths")
    if pl_ and not pl_["exact"]:
        lines += ["", f"{'note' if pl_.get('asked_approximate') else 'WARNING'}: prompt lengths are NOT exact: "
                      f"{pl_['reason']}"]
    if not summary["valid"]:
        lines.append("")
        lines += [f"INVALID: {why}" for why in summary["invalid_reasons"]] or ["INVALID"]
    return "\n".join(lines) + "\n"


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v:.1%}"


def _prefix_cache_lines(summary: Summary) -> list[str]:
    # the measured hit rate beside the workload's (analysis/prefix_cache.py); runs before it: nothing
    c = summary.get("prefix_cache")
    if not c:
        return []
    salt = f"; prompt salt {c['prompt_salt']}" if c.get("prompt_salt") is not None else ""
    source = c["source"] or (c.get("server") or {}).get("note") or "not reported by the server"
    lines = [f"prefix cache hit rate {_pct(c['hit_rate'])} ({source}); "
             f"the workload implies {_pct(c['expected_hit_rate'])}{salt}"]
    per = c.get("per_request") or {}
    d = per.get("cached_tokens_per_request")
    if d:  # the rows' cached_tokens (usage): runs before it have no such key
        lines.append(f"cached tokens per request ({per['rows_reporting']} rows report them): p50 {_f(d['p50'])}  "
                     f"p99 {_f(d['p99'])}  max {_f(d['max'])}  mean {_f(d['mean'])}; {per['cached_tokens']} of "
                     f"{per['prompt_tokens']} prompt tokens ({_pct(per['hit_rate'])})")
    if c.get("mismatch"):
        lines.append(f"WARNING: {c['mismatch']}")
    return lines


def _abandoned_lines(summary: Summary) -> list[str]:
    # [abandon] (analysis/abandon.py): how many were cut, what they had got, whether the server let go
    a = summary.get("abandoned")
    if not a:
        return []
    got = a["output_tokens"]
    line = (f"abandoned  {a['abandoned']} of {a['planned']} planned (by {a['by']}; {a['finished_first']} ended "
            f"first); {a['with_first_token']} had a first token" + (f", tokens p50 {got['p50']:g} max {got['max']}"
                                                                    if got else ""))
    slots = a.get("server_slots")
    if slots is None:
        return [line]
    verdict = "freed their slots" if slots["freed"] else "did NOT free their slots"
    return [line, f"           the server {verdict}: it held {slots['excess_mean']:+.2f} requests on average "
                  f"(max {slots['excess_max']:+.0f}) beyond those the client had open, over {slots['scrapes']} scrapes"]


def _reply_lines(summary: Summary) -> list[str]:
    # valid JSON / valid tool calls of a workload that sent tools or response_format (analysis/replies.py)
    r = summary.get("replies")
    if not r:
        return []
    j, c = r["json"], r["calls"]
    parts = [f"replies    judged {r['judged']} of the ok: valid {r['valid']} ({_pct(r['valid_share'])})"]
    if j["judged"]:
        parts.append(f"JSON {j['valid']}/{j['judged']} valid ({_pct(j['valid_share'])}), {j['parsed']} parsed")
    if c["judged"]:
        parts.append(f"tool calls {c['valid']}/{c['judged']} valid ({_pct(c['valid_share'])}), "
                     f"{c['tool_calls']} calls")
    if r["not_judged"]:
        parts.append(f"{r['not_judged']} not judged (no call, no schema)")
    lines = ["; ".join(parts)]
    lines += [f"           {t['count']:>5}× {t['problem']}" for t in r["top"]]
    return lines


def _agentic_lines(summary: Summary) -> list[str]:
    # agentic sessions (analysis/agentic.py): what the requests carried, the tools' waits, the growth
    a = summary.get("agentic")
    if not a:
        return []
    lat = a["tool_latency_ms"]
    line = (f"agentic    {a['requests']} requests: {a['user_turns']} user turns, {a['tool_rounds']} tool rounds"
            + (f" (by round {', '.join(f'{k}: {v}' for k, v in a['by_round'].items() if k != '0')})"
               if a["tool_rounds"] else "")
            + (f", {a['not_built']} never built" if a["not_built"] else ""))
    lines = [line]
    if lat["p50"] is not None:
        lines.append(f"           tool latency waited p50 {lat['p50']:.0f} ms, max {lat['max']:.0f} ms; "
                     f"prompt tokens mean by round " + ", ".join(f"{k}: {v:.0f}" for k, v in
                                                                 a["prompt_tokens_mean"].items()))
    return lines


def _lag_lines(g: dict) -> list[str]:
    """How far the send lag moved each reported percentile (selfcheck.py), and the client's cause."""
    out = []
    shifts = g.get("lag_shift") or []
    if shifts:
        out.append("           send lag moved " + "  ".join(
            f"{s['figure']} {_f(s['shift_ms'])} ms (tol {_f(s['tolerance_ms'])})"
            + (" AFFECTED" if s["affected"] else "") for s in shifts))
    h = g.get("host") or {}
    if g.get("cause") and h:
        out.append(f"           client {g['cause']}: loop CPU {100 * (h.get('loop_cpu_share') or 0):.0f} % of a core, "
                   f"run-queue wait {100 * (h.get('loop_runqueue_share') or 0):.1f} % of the run, other processes "
                   f"{_f(h.get('others_cpu_cores'))} of {h.get('host_cpus') or h.get('cpus')} cores, "
                   f"steal {100 * (h.get('steal_share') or 0):.0f} %")
    return out


def _telemetry_lines(tel: dict | None) -> list[str]:
    """--scrape: the GPUs' overall figures over the measured window, and each node's CPU busy share."""
    if not tel:
        return []
    lines = []
    o = tel["overall"]
    if tel["gpus"]:
        lines.append(f"gpus       {o['gpus']}: util mean {_f(o['gpu_util_pct']['mean'])} % (max "
                     f"{_f(o['gpu_util_pct']['max'])})  SM active {_f(o['sm_active']['mean'])}  power "
                     f"{_f(o['power_w']['mean'])} W (max {_f(o['power_w']['max'])})  memory "
                     f"{_f(o['memory_used_mib']['mean'])} MiB  energy {_f(o['energy_j'])} J  "
                     f"{_f(o['output_tokens_per_j'])} output tok/J")
    lines += [f"node       {n['source']}: CPU busy {_pct(n['cpu_busy'])} of {n['cpus']} cpus"
              for n in tel.get("nodes") or []]
    return lines


def _error_lines(e: dict | None) -> list[str]:
    """The error rate and the most frequent error texts (analysis/failures.py), when anything failed."""
    if not e or not e.get("failed"):
        return []
    lines = [f"errors     {e['failed']} of {e['counted']} failed ({100 * e['error_rate']:.1f} %); most frequent:"]
    lines += [f"           {t['count']:>5}× {t['outcome']} {t['kind']}" + (f": {t['text']}" if t["text"] else "")
              for t in e["top"]]
    return lines


def _f(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:.3f}" if abs(v) < 10 else f"{v:.1f}"


def _load_and_goodput(summary: Summary) -> list[str]:
    out = []
    load = summary.get("load") or {}
    if load.get("loop") == "closed":
        who = (f"{load['concurrency']} users, think {_f(load.get('think_ms'))} ms" if load.get("concurrency")
               else f"rate inf, max-concurrency {load.get('max_concurrency') or 'none'}")
        if load.get("bound") == "duration":
            who += f", for {load['duration_s']:g} s"
        out += ["", f"CLOSED LOOP ({who}): {load.get('note', '')}"]
        if load.get("pool_exhausted_at_s") is not None:
            out.append(f"WARNING: the users used up the pool of requests {load['pool_exhausted_at_s']:.1f} s after "
                       f"t0, before the {load['duration_s']:g} s deadline: the run ended early (raise "
                       f"--max-user-rate; manifest schedule.pool)")
    g = summary.get("goodput")
    if g:
        slo = ", ".join(slo_text(k, v) for k, v in summary.get("slo", {}).items())
        att = g["attainment"]
        out += ["", f"goodput    {_f(g['requests_per_s'])} req/s meet every SLO ({slo}); attainment "
                    f"{'-' if att is None else f'{att:.1%}'} ({g['met']} of {g['requests']})  "
                    + "  ".join(f"{k} {v:.1%}" for k, v in g["attainment_by_slo"].items() if v is not None)]
    return out


def slo_text(key: str, ms: float) -> str:
    """A recorded SLO key (`ttft_ms`, `ttft_ms@chat`) and bound in words: `ttft <= 200 ms` (`... for chat`)."""
    name, _, cls = key.partition("@")
    return f"{name.removesuffix('_ms')} <= {ms:g} ms" + (f" for {cls}" if cls else "")


BREAKDOWN_COLUMNS = (("ttft", "p50"), ("ttft", "p99"), ("itl", "p50"), ("itl", "p99"), ("e2e", "p50"), ("e2e", "p99"))


def breakdown_lines(summary: Summary) -> list[str]:
    """One table per [[mix]] class and per model, when the run has more than one (analysis/breakdown.py)."""
    out: list[str] = []
    for section, label in (("by_class", "class"), ("by_model", "model")):
        groups = (summary.get("breakdown") or {}).get(section)
        if not groups:
            continue
        head = "".join(f"{f'{m} {s}':>11}" for m, s in BREAKDOWN_COLUMNS)
        out += ["", f"{('per ' + label + ' (ms)'):<18}{'ok/req':>9}{'prio':>6}" + head + f"{'goodput':>10}"]
        for name, g in groups.items():
            prio = ",".join(str(p) for p in g.get("priority") or []) or "-"
            good = g.get("goodput")
            att = "-" if not good or good.get("attainment") is None else f"{good['attainment']:.1%}"
            counts = f"{g['ok']}/{g['requests']}"
            out.append(f"{name[:18]:<18}{counts:>9}{prio[:6]:>6}"
                       + "".join(f"{_f(g['latency_ms'][m][s]):>11}" for m, s in BREAKDOWN_COLUMNS) + f"{att:>10}")
    return out
