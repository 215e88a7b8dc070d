"""Idle-server calibration: probe the target before the measured run, fit prefill(L) and the idle ITL.

Why: without per-request server timings, TTFT is one number. Probing the idle server (one request at a
time, so nothing queues) measures what prefill alone costs at each prompt length; during the run,
queue ~= ttft_from_send - connect - prefill(L) (analysis/decompose.py defines it).

Probe plan (`probe_lengths`): prompt lengths spanning the run's planned ones (their min, quartiles
and max: 5 points at most, fewer when lengths repeat; none above the target's context limit minus
PROBE_OUTPUT_TOKENS), REPS repetitions each, PROBE_OUTPUT_TOKENS output tokens, sent sequentially after
one discarded warm-up request (it opens the connection). The probes' text is made by the run's own
prompt maker (plan/prompts.py, the run's tokenizer: the server's /tokenize by default), so a probe of L
tokens is L tokens to the server, as the run's prompts are; each probe's text is its own (no cache hits).
Each probe yields
    prefill_ms = first_token - connected      (server TTFT + network; the same quantity the run's
                                               estimate subtracts, so the network cancels out)
    decode_ms_per_token = (last_token - first_token) / (output_tokens - 1)
                          (one request's mean decode time per token, on the idle server: not ITL, which
                           metrics.py defines per token from every gap, and not a distribution)
Fit (`fit`), on the median per length (robust to a stray slow probe):
    prefill_ms(L)          = a + b*L + c*L^2  (degree = min(2, distinct lengths - 1); a negative top
                                               coefficient drops the degree by one: never bends down)
    decode_ms_per_token(L) = d + e*L          (KV reads grow with context)
calibration.json holds the plan, every probe, both fits as {"coef": [a, b, c]} (lowest power first),
their RMS residuals, and whether the server also gave per-request timings. The decode figure is stored
under the key `itl_ms` (DECODE_KEY; in each probe and for the fit): analysis/decompose.py and explain.py
read it, and so do earlier runs' calibration.json files, so the key stays.
"""
from __future__ import annotations

import numpy as np

from loadgen.client.recorder import Row

REPS = 3
PROBE_OUTPUT_TOKENS = 8
POINTS = 5
DECODE_KEY = "itl_ms"  # calibration.json's key of decode_ms_per_token (the name is historical, see above)


def probe_lengths(planned_prompt_tokens, context_limit: int | None = None) -> list[int]:
    """context_limit: the target's tokens per request (prompt + max_tokens); every probe stays inside it."""
    planned = np.asarray(planned_prompt_tokens, dtype=np.int64)
    if planned.size == 0:
        return []
    top = context_limit - PROBE_OUTPUT_TOKENS if context_limit is not None else None
    if top is not None and top < 1:
        return []
    points = np.quantile(planned, np.linspace(0, 1, POINTS), method="nearest")
    return sorted({int(min(x, top) if top is not None else x) for x in points})


def _polyfit(x: np.ndarray, y: np.ndarray, degree: int) -> list[float]:
    degree = min(degree, len(np.unique(x)) - 1)
    while degree >= 0:
        coef = np.polynomial.polynomial.polyfit(x.astype(float), y.astype(float), degree)
        if degree == 0 or coef[-1] >= 0:
            return [float(c) for c in coef]
        degree -= 1
    return [float(np.mean(y))]


def _rms(coef: list[float], x: np.ndarray, y: np.ndarray) -> float:
    return float(np.sqrt(np.mean((np.polynomial.polynomial.polyval(x, coef) - y) ** 2)))


def probe_record(row: Row) -> dict | None:
    if row.outcome != "ok" or row.first_token_ns is None or row.connected_ns is None:
        return None
    n = row.output_tokens or 0
    return {"prompt_tokens": row.prompt_tokens or row.planned_prompt_tokens,
            "prefill_ms": (row.first_token_ns - row.connected_ns) / 1e6,
            DECODE_KEY: ((row.last_token_ns - row.first_token_ns) / 1e6 / (n - 1)
                         if n > 1 and row.last_token_ns is not None else None),
            "server_prefill_ms": row.server_prefill_ms, "server_queue_ms": row.server_queue_ms}


def fit(probes: list[dict | None]) -> dict:
    """probes: probe_record() dicts (None: a probe that failed). Raises ValueError when nothing usable came back."""
    good = [p for p in probes if p is not None]
    if not good:
        raise ValueError("no calibration probe succeeded")
    L = np.array([p["prompt_tokens"] for p in good], dtype=float)
    pre = np.array([p["prefill_ms"] for p in good], dtype=float)
    lengths = np.unique(L)
    med_pre = np.array([np.median(pre[L == x]) for x in lengths])
    pre_coef = _polyfit(lengths, med_pre, 2)
    with_decode = [p for p in good if p[DECODE_KEY] is not None]
    if with_decode:
        Ld = np.array([p["prompt_tokens"] for p in with_decode], dtype=float)
        decode = np.array([p[DECODE_KEY] for p in with_decode], dtype=float)  # ms per token, per probe
        ld = np.unique(Ld)
        med_decode = np.array([np.median(decode[Ld == x]) for x in ld])
        decode_coef = _polyfit(ld, med_decode, 1)
        decode_rms = _rms(decode_coef, ld, med_decode)
    else:
        decode_coef, decode_rms = [0.0], None
    return {
        "method": "idle-probe",
        "prefill_ms": {"coef": pre_coef, "rms_ms": _rms(pre_coef, lengths, med_pre)},
        DECODE_KEY: {"coef": decode_coef, "rms_ms": decode_rms},
        "server_timings": any(p["server_prefill_ms"] is not None for p in good),
        "probes": good,
    }


def probe_failure(row: Row) -> str:
    """How a probe that did not succeed ended, in words: outcome, HTTP status, error text."""
    status = f" HTTP {row.http_status}" if row.http_status and row.http_status != 200 else ""
    detail = row.error_detail or row.error_kind or ""
    return f"{row.outcome}{status}" + (f" ({detail[:200]})" if detail else "")


def probe_rows(planned_prompt_tokens, now_ns: int, tag: str = "", context_limit: int | None = None) -> list[Row]:
    """The warm-up probe first (discarded by the caller), then REPS rounds over the lengths (inside the
    target's context_limit). Request ids are `calib-{tag}-{i}`: server logs and the simulator's truth
    can tell probes from the run."""
    lengths = probe_lengths(planned_prompt_tokens, context_limit)
    if not lengths:
        return []
    plan = [lengths[0]] + [L for _ in range(REPS) for L in lengths]
    return [Row(i, f"calib-{tag}-{i:04d}", now_ns, L, PROBE_OUTPUT_TOKENS) for i, L in enumerate(plan)]
