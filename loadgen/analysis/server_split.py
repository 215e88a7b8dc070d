"""loadgen's queue/prefill/decode split beside the server's own, and where they disagree.

The server's side is vLLM's histogram deltas over the run (decompose.histogram_crosscheck: `_sum`/`_count`
of `vllm:request_{queue,prefill,decode}_time_seconds`, last minus first scrape). vLLM V1 observes them per
finished request on the engine core's clock (vllm/v1/metrics/stats.py, 0.32):
    queue   = scheduled - queued          time in the engine scheduler's waiting queue
    prefill = first token - scheduled
    decode  = last token - first token
loadgen's `queue` (decompose.py) is everything between the request's send and the start of its prefill,
so it also holds what happens before the engine core sees the request and between steps: HTTP, chat
template, tokenisation, IPC from the API server to the engine core, waiting for the running step to end.
That part is named here:
    front_end_ms = loadgen queue - engine queue   (ms; may be slightly negative within the tolerance)

Tolerances (stated in the output as `tolerance_ms`): queue and prefill within max(TOL_ABS_MS, TOL_REL x
loadgen's mean TTFT) — the decomposition's own accuracy is defined against TTFT, and an idle engine's
queue is ~0, so a share of the queue itself means nothing —; decode within max(TOL_ABS_MS, TOL_REL x the
server's mean decode). A component beyond its tolerance is listed in `disagreements` with a sentence
saying what it means. The means cover different sets: loadgen's the run's ok, non-warm-up requests;
the server's every request it finished between the first and last scrape (warm-up and failed ones too):
both `n` are given.
"""
from __future__ import annotations

TOL_ABS_MS = 2.0
TOL_REL = 0.10
COMPONENTS = ("queue", "prefill", "decode")
# Where the front-end time is when loadgen's queue is the server's own per-request queue (vLLM
# --enable-per-request-metrics): front_end_ms is then ~0 by construction.
FRONT_END_NOTE = {"server_timings": "loadgen's queue is the server's per-request queue time: front-end and "
                                    "step-boundary time is in `other`"}


def queue_split(server: dict | None, decomposition: dict, ttft_mean_ms: float | None) -> dict | None:
    """The `queue_split_ms` block of summary.json, or None without the server's histograms or a queue estimate.

    server: histogram_crosscheck's {component: mean ms, "n"}; decomposition: decompose.aggregate's block
    ("mean": component -> mean ms or None, "n", "method"); ttft_mean_ms: mean TTFT of its requests."""
    loadgen_mean, loadgen_n, method = decomposition["mean"], decomposition["n"], decomposition.get("method")
    if not server or server.get("queue") is None or loadgen_mean.get("queue") is None:
        return None
    ttft = ttft_mean_ms or 0.0
    tolerance = {"queue": max(TOL_ABS_MS, TOL_REL * ttft), "prefill": max(TOL_ABS_MS, TOL_REL * ttft),
                 "decode": max(TOL_ABS_MS, TOL_REL * (server.get("decode") or 0.0))}
    ours = {c: loadgen_mean.get(c) for c in COMPONENTS}
    theirs = {c: server.get(c) for c in COMPONENTS}
    front_end = ours["queue"] - theirs["queue"]
    difference = {c: (ours[c] - theirs[c] if ours[c] is not None and theirs[c] is not None else None)
                  for c in COMPONENTS}
    disagreements = []
    for comp in COMPONENTS:
        a, b = ours[comp], theirs[comp]
        if a is None or b is None or abs(a - b) <= tolerance[comp]:
            continue
        disagreements.append({"component": comp, "loadgen_ms": a, "server_ms": b, "difference_ms": a - b,
                              "tolerance_ms": tolerance[comp], "finding": _finding(comp, a, b)})
    return {"loadgen": {**ours, "n": loadgen_n}, "server": {**theirs, "n": server.get("n")}, "method": method,
            "engine_queue_ms": theirs["queue"], "front_end_ms": front_end,
            "front_end_note": FRONT_END_NOTE.get(method or ""), "difference_ms": difference, "tolerance_ms": tolerance,
            "tolerance_rule": (f"queue, prefill: max({TOL_ABS_MS:g} ms, {TOL_REL:.0%} of mean TTFT); "
                               f"decode: max({TOL_ABS_MS:g} ms, {TOL_REL:.0%} of the server's mean decode)"),
            "agree": not disagreements, "disagreements": disagreements}


def _finding(comp: str, ours: float, theirs: float) -> str:
    if comp == "queue" and ours > theirs:
        what = "is not engine queueing" if theirs < 0.5 * ours else "is more than engine queueing"
        return (f"loadgen's queue ({ours:.1f} ms) {what}: the server's own queue time is "
                f"{theirs:.2f} ms, so {ours - theirs:.1f} ms is front-end and step-boundary time (HTTP, chat "
                f"template, tokenisation, IPC to the engine core, waiting for the running step)")
    if comp == "queue":
        return (f"the server's queue time ({theirs:.1f} ms) exceeds loadgen's whole queue ({ours:.1f} ms): "
                f"part of what the server counts as waiting lands in loadgen's prefill")
    return (f"loadgen's {comp} ({ours:.1f} ms) and the server's own ({theirs:.1f} ms) differ by "
            f"{abs(ours - theirs) / theirs:.0%}" if theirs else f"loadgen's {comp} is {ours:.1f} ms, the server's 0")
