"""Diagnosis: rules that say in plain words what a run shows, each with its evidence and the usual remedy.

Each rule reads the `Facts` of a run (built by analysis/explain.py from the decomposition, the server's
/metrics samples and the roofline) and returns a Finding or None. Thresholds are named constants here,
so a finding can always be traced to the numbers that fired it.

  kv_capacity      queue >= QUEUE_DOMINANT of mean TTFT, the server reports requests waiting (> 0) and
                   KV cache usage >= KV_FULL: the KV pool, not compute, limits admission
  overload         queue >= QUEUE_DOMINANT of mean TTFT without a full KV pool (or no /metrics):
                   requests arrive faster than the server finishes them, or a max-num-seqs cap holds them
  prefill_stalls   stalls caused by other requests' prefills are >= STALL_SHARE of decode time
  prefill_cost     median TTFT of the longest-prompt bin >= TTFT_GROWTH x the shortest bin's while
                   queue < QUEUE_SMALL of mean TTFT: TTFT is prefill work, it grows with prompt length
  below_ceiling    single-stream decode below CEILING_FRACTION of the bandwidth ceiling (roofline.py)
  errors           any request failed with an HTTP error, a reset or a malformed stream (failures.py);
                   the remedy follows the most frequent kind (404: model/path, 401/403: key, 429/503:
                   the server sheds load, 5xx: its log, resets/streams: a proxy or a crash)
  timeouts         any request timed out (request_timeout elapsed, or still running when the drain ended)
  drops            any request was dropped: held back by --max-concurrency until the end, or its
                   conversation broken by an earlier failed turn
  over_saturation  the ok requests completed at < KEEP_UP of the offered rate while TTFT grew
                   >= TTFT_RUNAWAY x from the first to the last quarter of the run: the queue never drains
  ideal_overstated mean decode_contention < 0 by more than NEGATIVE_SHARE of decode_ideal: the streams
                   decoded faster than the idle calibration says decoding alone costs, so decode_ideal is
                   too high. It is not clamped (decode = ideal + contention + stalls must still add up):
                   this finding says why it is negative
  prefix_cache     the measured prefix-cache hit rate is not the one the workload implies
                   (analysis/prefix_cache.py: a warm cache above it, caching off or evicted below it)
A run whose requests all failed always fires one of errors / timeouts / drops.
"""
from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from loadgen.metrics import number
from loadgen.probe.scrape import KV_USAGE, WAITING

QUEUE_DOMINANT = 0.5
QUEUE_SMALL = 0.2
KV_FULL = 0.95
STALL_SHARE = 0.10
TTFT_GROWTH = 1.5
CEILING_FRACTION = 0.5
NEGATIVE_SHARE = 0.02   # of decode_ideal: below it, a negative contention is the calibration's noise
KEEP_UP = 0.9
TTFT_RUNAWAY = 2.0
# The command the overload remedy recommends (tests/unit/test_diagnose.py parses it with the CLI's parser).
SWEEP_COMMAND = "loadgen sweep WORKLOAD.toml --start 1/s --refine 3"


@dataclass
class Facts:
    mean: dict                      # decomposition means (ms), decompose.aggregate()["mean"]
    ttft_mean_ms: float | None
    by_prompt: list[dict]           # decompose.by_prompt_tokens()
    stalled_requests: int = 0
    requests: int = 0
    max_waiting: float | None = None    # from /metrics, None when not scraped
    max_kv_usage: float | None = None
    roofline: dict | None = None
    prefix_cache: dict | None = None    # the summary's prefix_cache section (analysis/prefix_cache.py)
    errors: dict | None = None          # analysis/failures.summarize
    request_timeout_ms: float | None = None
    offered_per_s: float | None = None
    completed_per_s: float | None = None  # ok requests / the span from the first intended to the last done
    ttft_first_ms: float | None = None  # mean TTFT of the first and the last quarter (by intended time)
    ttft_last_ms: float | None = None


def facts_from_metrics(metrics: pl.DataFrame | None) -> tuple[float | None, float | None]:
    if metrics is None or metrics.height == 0:
        return None, None

    def top(names: tuple[str, ...]) -> float | None:
        v = metrics.filter(pl.col("name").is_in(list(names)))["value"]
        return float(number(v.max())) if v.len() else None

    return top(WAITING), top(KV_USAGE)


def _share(f: Facts, comp: str) -> float | None:
    v = f.mean.get(comp)
    return None if v is None or not f.ttft_mean_ms else v / f.ttft_mean_ms


def kv_capacity(f: Facts) -> dict | None:
    q = _share(f, "queue")
    if q is None or q < QUEUE_DOMINANT or not f.max_waiting or (f.max_kv_usage or 0) < KV_FULL:
        return None
    return {"rule": "kv_capacity", "finding": f"{q:.0%} of mean TTFT is queueing while the KV cache is full "
            f"(usage peaked at {f.max_kv_usage:.0%}, up to {f.max_waiting:g} requests waiting): KV capacity "
            "limits how many requests run at once.",
            "evidence": {"queue_share_of_ttft": q, "max_kv_usage": f.max_kv_usage, "max_waiting": f.max_waiting},
            "remedy": "Give the KV cache more room (higher gpu-memory-utilization, an fp8 KV cache, a smaller "
                      "max-model-len), shorten prompts/outputs, or add replicas."}


def overload(f: Facts) -> dict | None:
    q = _share(f, "queue")
    if q is None or q < QUEUE_DOMINANT or (f.max_kv_usage is not None and f.max_kv_usage >= KV_FULL
                                           and f.max_waiting):
        return None
    seen = "" if f.max_kv_usage is None else f" (KV usage peaked at {f.max_kv_usage:.0%}, not full)"
    return {"rule": "overload", "finding": f"{q:.0%} of mean TTFT is queueing{seen}: requests arrive faster "
            "than the server completes them, or a concurrency cap (max-num-seqs) holds them back.",
            "evidence": {"queue_share_of_ttft": q, "max_kv_usage": f.max_kv_usage, "max_waiting": f.max_waiting},
            "remedy": "Lower the request rate to below the saturation point (find it with `" + SWEEP_COMMAND
                      + "`), raise max-num-seqs if memory allows, or add replicas."}


def prefill_stalls(f: Facts) -> dict | None:
    dec, st = f.mean.get("decode"), f.mean.get("decode_stalls")
    if not dec or st is None or st / dec < STALL_SHARE:
        return None
    return {"rule": "prefill_stalls", "finding": f"{st / dec:.0%} of decode time is streams stalled by other "
            f"requests' prefills ({f.stalled_requests} of {f.requests} requests saw such a gap): long prompts "
            "admitted mid-stream make one long step that every running stream waits for.",
            "evidence": {"stall_share_of_decode": st / dec, "mean_stall_ms": st,
                         "stalled_requests": f.stalled_requests},
            "remedy": "Enable chunked prefill or lower max-num-batched-tokens so a prompt is split over several "
                      "steps (raises that prompt's TTFT a little); or disaggregate prefill and decode."}


def prefill_cost(f: Facts) -> dict | None:
    q = _share(f, "queue")
    bins = [b for b in f.by_prompt if b.get("ttft_p50") is not None]
    if len(bins) < 2 or q is None or q >= QUEUE_SMALL:
        return None
    lo, hi = bins[0], bins[-1]
    if not lo["ttft_p50"] or hi["ttft_p50"] / lo["ttft_p50"] < TTFT_GROWTH:
        return None
    tpot = "" if lo.get("tpot_p50") is None or hi.get("tpot_p50") is None else (
        f"; TPOT {lo['tpot_p50']:.1f} -> {hi['tpot_p50']:.1f} ms")
    return {"rule": "prefill_cost", "finding": f"TTFT grows with prompt length (p50 {lo['ttft_p50']:.1f} ms at "
            f"{lo['prompt_tokens_min']}-{lo['prompt_tokens_max']} tokens -> {hi['ttft_p50']:.1f} ms at "
            f"{hi['prompt_tokens_min']}-{hi['prompt_tokens_max']}{tpot}) while queueing is only {q:.0%} of TTFT: "
            "TTFT is prefill work.",
            "evidence": {"ttft_growth": hi["ttft_p50"] / lo["ttft_p50"], "queue_share_of_ttft": q,
                         "shortest_bin": lo, "longest_bin": hi},
            "remedy": "Shorten prompts, reuse shared prefixes (prefix caching), or give prefill more compute."}


def below_ceiling(f: Facts) -> dict | None:
    r = f.roofline
    if not r or r.get("fraction_of_ceiling") is None or r["fraction_of_ceiling"] >= CEILING_FRACTION:
        return None
    return {"rule": "below_ceiling", "finding": f"single-stream decode runs at {r['measured_single_stream_tok_s']:.1f} "
            f"tokens/s, {r['fraction_of_ceiling']:.0%} of the {r['single_stream_ceiling_tok_s']:.1f} tokens/s that "
            f"{r['bandwidth']} allows: the serving stack, not the memory bandwidth, sets the pace.",
            "evidence": {k: r[k] for k in ("measured_single_stream_tok_s", "single_stream_ceiling_tok_s",
                                           "fraction_of_ceiling", "measured_from")},
            "remedy": "Look at the stack: CUDA graphs off, CPU-bound scheduling or detokenization, an "
                      "unquantized or mis-sharded model, small-batch kernels."}


def ideal_overstated(f: Facts) -> dict | None:
    c, ideal, dec = f.mean.get("decode_contention"), f.mean.get("decode_ideal"), f.mean.get("decode")
    if c is None or not ideal or c >= 0 or -c < NEGATIVE_SHARE * ideal:
        return None
    return {"rule": "ideal_overstated", "finding": f"decode_contention is negative (mean {c:.1f} ms, "
            f"{-c / ideal:.0%} of decode_ideal {ideal:.1f} ms): the streams decoded faster than the idle-server "
            "calibration says decoding alone costs, so decode_ideal overstates the ideal by at least that much. "
            "It is left negative, not clamped, so that decode = ideal + contention + stalls still adds up.",
            "evidence": {"mean_decode_contention_ms": c, "mean_decode_ideal_ms": ideal, "mean_decode_ms": dec},
            "remedy": "Read decode_ideal as an upper bound (and contention as at least this much higher). The "
                      "calibration's few idle probes measured a slower decode than the run saw: other work on the "
                      "server or this host during calibration (it runs before t0), or a server that runs faster "
                      "once warm; re-run with both quiet before t0."}


def prefix_cache(f: Facts) -> dict | None:
    c = f.prefix_cache
    if not c or not c.get("mismatch"):
        return None
    warm = c["hit_rate"] > c["expected_hit_rate"]
    return {"rule": "prefix_cache", "finding": c["mismatch"] + ".",
            "evidence": {k: c.get(k) for k in ("hit_rate", "expected_hit_rate", "source", "prompt_salt")},
            "remedy": ("For the server's cold speed: let each run draw its own prompt salt (the default; do not "
                       "fix prompt.salt / --prompt-salt), or reset the server's prefix cache between runs. To "
                       "measure caching, declare the sharing ([prefix], [session]) so that it is expected."
                       if warm else
                       "Turn the server's prefix caching on (vLLM: on by default, off with "
                       "--no-enable-prefix-caching), or give the KV cache room to keep the shared prefixes.")}


def _failed(f: Facts, outcomes: tuple[str, ...]) -> tuple[int, list[dict]]:
    e = f.errors or {}
    n = sum((e.get("by_outcome") or {}).get(o, 0) for o in outcomes)
    return n, [t for t in e.get("top") or [] if t["outcome"] in outcomes]


def _error_remedy(kind: str) -> str:
    if kind in ("http_404",):
        return ("Check the model name against the server's GET /v1/models (--model) and the URL's path "
                "(--url is the base URL, without /v1).")
    if kind in ("http_401", "http_403"):
        return "Check the API key (the variable request.api_key_env names) and --header values."
    if kind in ("http_429", "http_503"):
        return ("The server sheds load: lower the rate (find its capacity with `" + SWEEP_COMMAND + "`) or "
                "raise its queue/rate limits.")
    if kind.startswith("http_4"):
        return "The server rejected the request: check the workload's api, max tokens and context length."
    if kind.startswith("http_5"):
        return "The server failed: read its log for the request ids (X-Request-Id) in `loadgen export`."
    return ("Connections reset or streams cut: look for a proxy's idle/body limits, or a server that crashed "
            "or restarted (its log); `loadgen export` lists each failed request.")


def errors(f: Facts) -> dict | None:
    n, top = _failed(f, ("http_error", "stream_error", "connection_error"))
    if not n or not f.errors:
        return None
    e = f.errors
    first = top[0] if top else {"kind": "error", "text": ""}
    texts = "; ".join(f"{t['count']}× {t['kind']}" + (f' "{t["text"]}"' if t["text"] else "") for t in top[:3])
    return {"rule": "errors", "finding": f"{n} of {e['counted']} requests failed ({n / e['counted']:.1%}): "
            f"{texts}.", "evidence": {"failed": n, "counted": e["counted"], "by_outcome": e["by_outcome"],
                                      "top": top[:3]},
            "remedy": _error_remedy(first["kind"])}


def timeouts(f: Facts) -> dict | None:
    n, top = _failed(f, ("timeout",))
    if not n or not f.errors:
        return None
    limit = "" if f.request_timeout_ms is None else f" (--request-timeout {f.request_timeout_ms / 1000:g} s)"
    kinds = ", ".join(f"{t['count']} {t['kind']}" for t in top)
    return {"rule": "timeouts", "finding": f"{n} of {f.errors['counted']} requests timed out{limit}: {kinds}. "
            "A timed-out request is missing from every latency figure, and it was one of the slowest.",
            "evidence": {"timeouts": n, "counted": f.errors["counted"], "request_timeout_ms": f.request_timeout_ms,
                         "kinds": {t["kind"]: t["count"] for t in top}},
            "remedy": "Lower the rate or the output length so requests finish in time; raise --request-timeout "
                      "(or run.drain_timeout for drain_timeout rows) when the server is merely slow."}


def drops(f: Facts) -> dict | None:
    n, top = _failed(f, ("dropped",))
    if not n or not f.errors:
        return None
    kinds = ", ".join(f"{t['count']} {t['kind']}" for t in top)
    return {"rule": "drops", "finding": f"{n} of {f.errors['counted']} requests were dropped ({kinds}): a "
            "--max-concurrency cap held them back until the run ended, or an earlier turn of their "
            "conversation failed.", "evidence": {"dropped": n, "counted": f.errors["counted"],
                                                  "kinds": {t["kind"]: t["count"] for t in top}},
            "remedy": "Raise --max-concurrency or lower the rate (the cap, not the server, set the pace); for "
                      "session_broken drops fix the failures of the earlier turns."}


def over_saturation(f: Facts) -> dict | None:
    if not (f.offered_per_s and f.completed_per_s and f.ttft_first_ms and f.ttft_last_ms):
        return None
    keep, growth = f.completed_per_s / f.offered_per_s, f.ttft_last_ms / f.ttft_first_ms
    if keep >= KEEP_UP or growth < TTFT_RUNAWAY:
        return None
    return {"rule": "over_saturation", "finding": f"ok requests completed at {f.completed_per_s:.2f}/s against "
            f"{f.offered_per_s:.2f}/s offered ({keep:.0%}) while mean TTFT grew {growth:.1f}x from the first "
            f"quarter of the run ({f.ttft_first_ms:.1f} ms) to the last ({f.ttft_last_ms:.1f} ms): the server "
            "is past saturation, its queue grows for as long as the run lasts, and every latency figure "
            "depends on the run's length.",
            "evidence": {"completed_per_s": f.completed_per_s, "offered_per_s": f.offered_per_s,
                         "ttft_first_quarter_ms": f.ttft_first_ms, "ttft_last_quarter_ms": f.ttft_last_ms},
            "remedy": "Lower the rate below the server's capacity (find it with `" + SWEEP_COMMAND + "`) or add "
                      "replicas; latencies past saturation describe the queue, not the server."}


RULES = (errors, timeouts, drops, over_saturation, kv_capacity, overload, prefill_stalls, prefill_cost,
         below_ceiling, ideal_overstated, prefix_cache)


def diagnose(f: Facts) -> list[dict]:
    return [finding for rule in RULES if (finding := rule(f)) is not None]
