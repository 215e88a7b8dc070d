"""Text rendering of the explanation (analysis/explain.py): decomposition table, per-length table,
windows, server cross-check, roofline, diagnosis."""
from __future__ import annotations

import textwrap

from loadgen.analysis.decompose import COMPONENTS
from loadgen.results.folder import Summary

METHOD_NOTE = {
    "server_timings": "server-reported per-request timings",
    "calibrated": "ESTIMATES from the idle-server calibration (queue = TTFT - connect - prefill(L))",
    "none": "no server timings and no calibration: queue and prefill unknown, counted in `other`",
}


def split_unavailable(s: Summary) -> str | None:
    """Why the decomposition has no queue/prefill split, when it is because calibration failed (the
    manifest's `calibration`, "failed: WHY"); None otherwise (calibrated, server timings, or turned off)."""
    d, calibration = s.get("decomposition_ms") or {}, s.get("calibration")
    if d.get("method") in ("none", None) and isinstance(calibration, str) and calibration.startswith("failed"):
        return f"queue/prefill split UNAVAILABLE: the idle-server calibration {calibration}"
    return None


def _f(v) -> str:
    if v is None:
        return "-"
    return f"{v:.3f}" if abs(v) < 10 else f"{v:.1f}"


def explain_lines(s: Summary) -> list[str]:
    d = s["decomposition_ms"]
    method = d.get("method")
    if not d["n"]:   # nothing to split (a pooling run's rows have no first token): no table of dashes
        return ["", "decomposition: no ok request with a first token to split into queue, prefill and decode",
                *([str(split_unavailable(s))] if split_unavailable(s) else [])]
    lines = ["", f"decomposition (ms) of {d['n']} ok requests; method: {method}"
             + (f" — {METHOD_NOTE[method]}" if method in METHOD_NOTE else "")]
    if split_unavailable(s):
        lines.append(str(split_unavailable(s)))
    cols = (("mean", "mean"), ("p99 e2e", "p99_e2e"), ("p99 ttft", "p99_ttft"))
    lines.append(f"{'component':<20}" + "".join(f"{c:>12}" for c, _ in cols))
    for comp in COMPONENTS:
        label = ("  " + comp) if comp.startswith("decode_") else comp
        lines.append(f"{label:<20}" + "".join(f"{_f(d[k][comp]):>12}" for _, k in cols))
    lines.append(f"{'requests':<20}" + "".join(f"{d[k]['n'] if k != 'mean' else d['n']:>12}" for _, k in cols))
    st = d.get("stalls") or {}
    if st.get("requests_stalled"):
        lines.append(f"stalls: {st['requests_stalled']} requests stalled by other requests' prefills, "
                     f"{_f(st['total_ms'])} ms in all")
    hist, split = s.get("server_histograms_ms"), s.get("queue_split_ms")
    if split:
        lines += split_lines(split)
    elif hist:
        lines.append("server histograms (mean ms, cross-check): " + "  ".join(
            f"{k} {_f(hist.get(k))}" for k in ("queue", "prefill", "decode")) + f"  (n {hist.get('n')})")
    by_len = s.get("by_prompt_tokens") or []
    if by_len:
        lines += ["", f"{'prompt tokens':<16}{'n':>6}{'ttft p50':>12}{'tpot p50':>12}{'queue':>10}{'prefill':>10}"]
        for b in by_len:
            lines.append(f"{str(b['prompt_tokens_min']) + '-' + str(b['prompt_tokens_max']):<16}{b['n']:>6}"
                         f"{_f(b['ttft_p50']):>12}{_f(b['tpot_p50']):>12}{_f(b['queue_mean']):>10}{_f(b['prefill_mean']):>10}")
    windows = s.get("decomposition_windows") or []
    if len(windows) > 1:
        lines += ["", f"{'window start s':<16}{'n':>6}{'queue':>10}{'prefill':>10}{'decode':>10}{'stalls':>10}"]
        for w in windows:
            lines.append(f"{_f(w['t_s']):<16}{w['n']:>6}{_f(w['queue']):>10}{_f(w['prefill']):>10}"
                         f"{_f(w['decode']):>10}{_f(w['decode_stalls']):>10}")
    lines += roofline_lines(s.get("roofline"))
    diagnosis = s.get("diagnosis") or []
    lines += ["", "diagnosis:" if diagnosis else "diagnosis: no rule fired"]
    for f in diagnosis:
        lines += textwrap.wrap(f"- {f['finding']}", 100, subsequent_indent="  ")
        lines += textwrap.wrap(f"remedy: {f['remedy']}", 100, initial_indent="  ", subsequent_indent="    ")
    return lines


def split_lines(q: dict) -> list[str]:
    """loadgen's split beside the server's own histograms (analysis/server_split.py), front-end time named."""
    lo, sv, tol = q["loadgen"], q["server"], q["tolerance_ms"]
    lines = ["", f"{'vs the server (mean ms)':<24}{'loadgen':>10}{'server':>10}{'difference':>12}{'tolerance':>11}"]
    for comp in ("queue", "prefill", "decode"):
        a, b, diff = lo.get(comp), sv.get(comp), q["difference_ms"][comp]
        flag = "" if diff is None or abs(diff) <= tol[comp] else "  DISAGREE"
        lines.append(f"{comp:<24}{_f(a):>10}{_f(b):>10}{_f(diff):>12}{_f(tol[comp]):>11}{flag}")
    lines.append(f"{'requests':<24}{lo.get('n')!s:>10}{sv.get('n')!s:>10}")
    lines += textwrap.wrap(f"engine queue {_f(q['engine_queue_ms'])} ms; front-end/step-boundary time (loadgen queue "
                           f"- engine queue) {_f(q['front_end_ms'])} ms"
                           + (f" ({q['front_end_note']})" if q.get("front_end_note") else ""), 100,
                           subsequent_indent="  ")
    lines.append(f"tolerance: {q['tolerance_rule']}")
    for d in q["disagreements"]:
        lines += textwrap.wrap(f"DISAGREE ({d['component']}): {d['finding']}", 100, subsequent_indent="  ")
    return lines


def roofline_lines(r: dict | None) -> list[str]:
    if not r:
        return []
    lines: list[str] = []
    lines += ["", f"roofline ({r['bandwidth']}): weights {r['weight_bytes'] / 1e9:.2f} GB, KV "
                  f"{r['kv_bytes_per_token'] / 1024:.0f} KiB/token, "
                  f"{r['kv_bytes_per_request'] / 2**20:.1f} MiB/request; "
                  f"single-stream ceiling {r['single_stream_ceiling_tok_s']:.1f} tok/s, measured "
                  f"{_f(r['measured_single_stream_tok_s'])} tok/s"
                  + (f" ({r['fraction_of_ceiling']:.0%})" if r.get("fraction_of_ceiling") else "")
                  + f" from {r['measured_from']}"]
    if r.get("warning"):
        lines += textwrap.wrap(f"IMPOSSIBLE: {r['warning']}", 100, subsequent_indent="  ")
    return lines
