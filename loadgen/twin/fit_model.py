"""Fits the simulator's step-time model (sim/profiles.py) to probe samples (fit_probe.py) and writes
the profile. Pure: no I/O but `to_toml`.

Three forms of the model are fitted, each a special case of the profile's step time, and the one with
the smaller residuals is kept:

  roofline  (a GPU: decode reads the weights, prefill is compute-bound; multi_token = 0)
            decode step  = overhead + weights + per_seq * B + kv * kv_tokens_read
            prefill step = overhead + per_seq + prefill_tok * tokens + attn * attention_pairs
  compute   (a CPU engine such as llama.cpp: no weight-read floor, weights = 0; a one-token step is
            several times cheaper than any larger one)
            step = overhead + (multi_token + multi_kv * kv_tokens_read) [tokens > 1] + per_seq * B
                   + max(kv * kv_tokens_read, prefill_tok * tokens + attn * pairs)
            (decode attention, a matrix-vector product, costs far more per pair than prefill's: the
            kv term carries it; a batched decode reads its contexts at kv + multi_kv a token: llama.cpp
            on a CPU, 1.7 against 1.05 us at batch 2 and 1, equal or unequal contexts alike)
  sum       (a CPU engine that pays its reads and its compute one after the other: profile
            memory_compute = "sum"; weights = 0)
            step = overhead + (multi_token + multi_kv * kv_tokens_read) [tokens > 1] + per_seq * B
                   + kv * kv_tokens_read + prefill_tok * tokens + attn * pairs
            (the forms differ on a mixed step, a prompt run with decodes: under max() the prompt's
            compute hides the decodes' reads, under sum it adds to them)

A mixed probe's step: the prompt's P tokens and B decodes, B + 1 sequences, kv_tokens_read
P + B (ctx + 1), pairs P (P + 1) / 2 + B (ctx + 1). A probe's TTFT = request_overhead + the prefill's
steps (a prompt longer than max_num_batched_tokens runs in ceil(P / chunk) steps; the attention pairs
of all its chunks add up to P (P + 1) / 2).
request_overhead is measured, not fitted, when the server reports its own prefill time (llama.cpp's
`timings.prompt_ms`): the median of TTFT - prompt_ms. Otherwise it is fitted where mixed samples exist
(their steps are timed between tokens, without it; a prefill's TTFT has it once: the two tell it from a
step's own overhead), else 0. multi_kv is fitted where batched decodes were probed at two contexts
(else 0). Least squares on relative errors
(each row divided by its measurement), with coefficients kept >= 0 (non-negative least squares, _nnls).
The model is linear on each branch of max(memory, compute): each sample's row is built
on the branch the current fit makes active (first guess: decode reads memory, prefill computes), and
the fit is repeated until no sample changes branch. The residual of each sample is then computed with
the profile's own step_ns, max() included, so the figures describe the profile written.
"""
from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from loadgen.probe.calibrate import DECODE_KEY, fit as fit_calibration
from loadgen.twin.fit_probe import DecodeSample, MixedSample, PrefillSample
from loadgen.sim.profiles import Profile

NOMINAL_KV_BYTES_PER_TOKEN = 1024.0  # the fit sees only kv_bytes / kv_bandwidth; the split is nominal


@dataclass(frozen=True)
class EngineLimits:
    model_name: str
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    n_params: float | None = None   # the model's parameters, if the server says (llama.cpp /v1/models meta)
    size_bytes: float | None = None  # the weights' size in bytes, likewise


@dataclass(frozen=True)
class Coefficients:  # seconds
    overhead: float
    per_seq: float
    weights: float
    kv_per_token: float
    per_token: float       # compute per new token
    per_pair: float        # compute per attention pair
    multi_token: float
    request_overhead: float
    multi_token_kv: float = 0.0   # per KV token read, in a step of more than one token


def in_us(c: Coefficients) -> dict[str, float]:
    """The coefficients in microseconds by name, as reports and [[rounds]] tables write them."""
    return {k: v * 1e6 for k, v in vars(c).items()}


def coefficients(p: Profile) -> Coefficients:
    """The effective coefficients of a profile (what a fit can recover; raw fields are one of many splits)."""
    flops = p.compute_tflops * 1e12
    return Coefficients(
        overhead=p.overhead_us * 1e-6, per_seq=p.per_seq_us * 1e-6,
        weights=p.weight_bytes / (p.weight_bandwidth_gb_s * 1e9),
        kv_per_token=p.kv_bytes_per_token / (p.kv_bandwidth_gb_s * 1e9),
        per_token=2 * p.params / flops, per_pair=4 * p.layers * p.hidden / flops,
        multi_token=p.multi_token_us * 1e-6, request_overhead=p.request_overhead_us * 1e-6,
        multi_token_kv=p.multi_token_kv_us * 1e-6)


def to_profile(c: Coefficients, lim: EngineLimits, name: str, description: str,
               memory_compute: str = "max") -> Profile:
    params = float(lim.n_params or 1e9)
    per_token = max(c.per_token, 1e-12)
    flops = 2 * params / per_token
    weight_bytes = float(lim.size_bytes or 1e9) if c.weights > 0 else 0.0
    kv_bytes = NOMINAL_KV_BYTES_PER_TOKEN if c.kv_per_token > 0 else 0.0
    return Profile(
        name=name, model_name=lim.model_name, description=description, max_model_len=lim.max_model_len,
        params=params, weight_bytes=weight_bytes, kv_bytes_per_token=kv_bytes, layers=1,
        hidden=max(0, round(c.per_pair * flops / 4)),
        overhead_us=c.overhead * 1e6, per_seq_us=c.per_seq * 1e6,
        weight_bandwidth_gb_s=weight_bytes / c.weights / 1e9 if c.weights > 0 else 1.0,
        kv_bandwidth_gb_s=kv_bytes / c.kv_per_token / 1e9 if c.kv_per_token > 0 else 1.0,
        compute_tflops=flops / 1e12, prefill_launch_us=0.0, decode_launch_us=0.0,
        max_num_seqs=lim.max_num_seqs, max_num_batched_tokens=lim.max_num_batched_tokens,
        kv_capacity_tokens=lim.max_num_seqs * lim.max_model_len,
        multi_token_us=c.multi_token * 1e6, request_overhead_us=c.request_overhead * 1e6,
        multi_token_kv_us=c.multi_token_kv * 1e6, memory_compute=memory_compute)


# --- what a profile predicts for each probe shape (the simulator's engine, one sequence or B in lockstep)

def chunks(prompt: int, chunk: int) -> list[tuple[int, int]]:
    """(new tokens, tokens already computed) of each prefill step of one prompt."""
    return [(min(chunk, prompt - c), c) for c in range(0, prompt, chunk)]


def predicted_ttft_s(p: Profile, prompt: int) -> float:
    ns = sum(p.step_ns(n, 1, c + n, n * c + n * (n + 1) // 2, True)
             for n, c in chunks(prompt, p.max_num_batched_tokens))
    return ns / 1e9 + p.request_overhead_us * 1e-6


def decode_context(s: DecodeSample) -> float:
    # mean context of a step in the measured window (the middle of the output)
    return s.prompt_tokens + s.output_tokens / 2


def predicted_step_s(p: Profile, s: DecodeSample) -> float:
    kv = round(s.batch * (decode_context(s) + 1))
    return p.step_ns(s.batch, s.batch, kv, kv, False) / 1e9


def mixed_shape(m: MixedSample) -> tuple[int, int, float, float]:
    """(tokens, sequences, kv_tokens_read, attention_pairs) of a mixed probe's step."""
    decode_kv = m.batch * (m.context + 1)
    return m.prompt_tokens + m.batch, m.batch + 1, m.prompt_tokens + decode_kv, \
        m.prompt_tokens * (m.prompt_tokens + 1) / 2 + decode_kv


def predicted_mixed_s(p: Profile, m: MixedSample) -> float:
    tokens, seqs, kv, pairs = mixed_shape(m)
    return p.step_ns(tokens, seqs, round(kv), round(pairs), True) / 1e9


# --- fitting

FORMS = ("roofline", "compute", "sum")
FORM_MEMORY_COMPUTE = {"roofline": "max", "compute": "max", "sum": "sum"}  # the profile's memory_compute per form
_NAMES = ("overhead", "per_seq", "weights", "kv_per_token", "per_token", "per_pair", "multi_token",
          "request_overhead", "multi_token_kv")


def _step_row(x: np.ndarray | None, tokens: int, seqs: int, kv: float, pairs: float, decode: bool,
              form: str) -> np.ndarray:
    # the step's coefficient vector over _NAMES on the branch of max(memory, compute) that x makes
    # active (x None: decode reads memory, prefill computes); the sum form pays both (no weights column).
    # multi_token and multi_token_kv are outside max(): a step of more than one token pays them on either branch
    multi = tokens > 1
    if form == "sum":
        return np.array([1, seqs, 0, kv, tokens, pairs, multi, 0, kv if multi else 0], dtype=np.float64)
    if x is None:
        memory = decode
    else:
        memory = x[2] + x[3] * kv >= x[4] * tokens + x[5] * pairs
    return np.array([1, seqs, 1 if memory else 0, kv if memory else 0, 0 if memory else tokens,
                     0 if memory else pairs, multi, 0, kv if multi else 0], dtype=np.float64)


_ONCE = np.eye(len(_NAMES))[_NAMES.index("request_overhead")]  # a prefill probe's TTFT pays it once


def _rows(x, prefill: list[PrefillSample], decode: list[DecodeSample], mixed: Sequence[MixedSample], chunk: int,
          r: float, form: str):
    rows, y = [], []
    for s in prefill:
        rows.append(_ONCE + sum(_step_row(x, n, 1, c + n, n * c + n * (n + 1) / 2, False, form)
                                for n, c in chunks(s.prompt_tokens, chunk)))
        y.append(s.ttft_s - r)
    for d in decode:
        kv = d.batch * (decode_context(d) + 1)
        rows.append(_step_row(x, d.batch, d.batch, kv, kv, True, form))
        y.append(d.step_s)
    for m in mixed:
        rows.append(_step_row(x, *mixed_shape(m), False, form))
        y.append(m.step_s)
    return np.array(rows), np.array(y, dtype=np.float64)


def _nnls(a: np.ndarray, y: np.ndarray, free: list[int]) -> np.ndarray:
    """Least squares of relative errors over the columns in `free`, every coefficient >= 0, the others 0:
    Lawson and Hanson's active-set method (a column held at 0 comes back when the residual asks for it; the
    greedy "drop the most negative and refit" this replaces could not, and once left a probe round with
    every step coefficient at 0). Columns are scaled to unit norm first (ones, tokens and attention pairs
    differ by 1e6)."""
    w = 1.0 / np.maximum(np.abs(y), 1e-9)
    m, b = a[:, free] * w[:, None], y * w
    norms = np.linalg.norm(m, axis=0)
    norms[norms == 0] = 1.0
    m = m / norms
    n = m.shape[1]
    x, passive = np.zeros(n), np.zeros(n, dtype=bool)
    tol = 1e-12 * max(1.0, float(np.abs(m).sum()))
    for _ in range(3 * n + 10):
        grad = m.T @ (b - m @ x)
        grad[passive] = -np.inf
        j = int(np.argmax(grad))
        if grad[j] <= tol:
            break
        passive[j] = True
        while True:
            z = np.zeros(n)
            z[passive], *_ = np.linalg.lstsq(m[:, passive], b, rcond=None)
            if np.all(z[passive] > tol):
                x = z
                break
            neg = passive & (z <= tol)
            step = np.min(x[neg] / (x[neg] - z[neg]))
            x = x + step * (z - x)
            passive &= x > tol
            x[~passive] = 0.0
    out = np.zeros(a.shape[1])
    out[free] = x / norms
    return out


@dataclass
class FitResult:
    form: str
    profile: Profile
    coefficients: Coefficients
    residuals: list[dict]          # one per sample: kind, shape, measured_ms, predicted_ms, error_rel
    rms_rel: float
    max_abs_rel: float
    alternatives: dict[str, float]  # form -> rms_rel


def _columns(form: str, decode, fit_request_overhead: bool) -> list[int]:
    # the columns a form may use (the others are 0); per_seq and multi_token need two batch sizes.
    # (In the compute form one-token decode steps give overhead + per_seq + kv, two-token ones add
    # per_seq + multi_token, prefill steps pay overhead + per_seq + multi_token once each.)
    cols = {"overhead", "per_token", "per_pair", "kv_per_token"}
    if len({s.batch for s in decode}) > 1:
        cols |= {"per_seq"} if form == "roofline" else {"per_seq", "multi_token"}
    if form != "roofline" and len({s.prompt_tokens for s in decode if s.batch > 1}) > 1:
        cols.add("multi_token_kv")   # batched decodes at two contexts: their reads' cost apart from one stream's
    if form == "roofline":
        cols.add("weights")
    if fit_request_overhead:
        cols.add("request_overhead")
    return [_NAMES.index(c) for c in _NAMES if c in cols]


def fit(prefill: list[PrefillSample], decode: list[DecodeSample], lim: EngineLimits,
        request_overhead_s: float | None = 0.0, name: str = "fitted", description: str = "",
        forms: tuple[str, ...] = FORMS, mixed: Sequence[MixedSample] = ()) -> FitResult:
    """The best of `forms` (the smaller rms relative residual over every sample, mixed ones included); one
    form given, that form. request_overhead_s None: not measured, fitted where mixed samples exist, else 0."""
    if len(prefill) < 3 or len({s.prompt_tokens for s in prefill}) < 3:
        raise ValueError("the fit needs prefill samples of at least 3 prompt lengths")
    if not decode:
        raise ValueError("the fit needs decode samples")
    results = {}
    for form in forms:
        cols = _columns(form, decode, request_overhead_s is None and bool(mixed))
        x, seen = None, []
        for _ in range(8):  # refit until every sample sits on the branch of max() the fit makes active
            a, y = _rows(x, prefill, decode, mixed, lim.max_num_batched_tokens, request_overhead_s or 0.0, form)
            branches = a[:, 2].tolist()
            if branches in seen:
                break
            seen.append(branches)
            x = _nnls(a, y, cols)
        assert x is not None  # the loop's first pass always fits
        c = Coefficients(**dict(zip(_NAMES, (float(v) for v in x))))
        if request_overhead_s is not None:
            c = replace(c, request_overhead=request_overhead_s)
        prof = to_profile(c, lim, name, description, FORM_MEMORY_COMPUTE[form])
        res = residuals(prof, prefill, decode, mixed)
        rms = math.sqrt(sum(r["error_rel"] ** 2 for r in res) / len(res))
        results[form] = (prof, res, rms)
    best = min(results, key=lambda f: results[f][2])
    prof, res, rms = results[best]
    return FitResult(best, prof, coefficients(prof), res, rms, max(abs(r["error_rel"]) for r in res),
                     {f: round(v[2], 4) for f, v in results.items()})


def residuals(p: Profile, prefill: list[PrefillSample], decode: list[DecodeSample],
              mixed: Sequence[MixedSample] = ()) -> list[dict]:
    out = []
    for s in prefill:
        pred = predicted_ttft_s(p, s.prompt_tokens)
        out.append({"kind": "prefill", "prompt_tokens": s.prompt_tokens, "measured_ms": s.ttft_s * 1e3,
                    "predicted_ms": pred * 1e3, "error_rel": (pred - s.ttft_s) / s.ttft_s})
    for d in decode:
        pred = predicted_step_s(p, d)
        out.append({"kind": "decode", "batch": d.batch, "prompt_tokens": d.prompt_tokens,
                    "output_tokens": d.output_tokens, "measured_ms": d.step_s * 1e3, "predicted_ms": pred * 1e3,
                    "error_rel": (pred - d.step_s) / d.step_s})
    for m in mixed:
        pred = predicted_mixed_s(p, m)
        out.append({"kind": "mixed", "batch": m.batch, "prompt_tokens": m.prompt_tokens,
                    "context": round(m.context, 1), "measured_ms": m.step_s * 1e3, "predicted_ms": pred * 1e3,
                    "error_rel": (pred - m.step_s) / m.step_s})
    return out


def to_toml(p: Profile, header: list[str], rounds: Sequence[dict] = (), rms_rel: float | None = None,
            recheck: dict | None = None) -> str:
    """The profile as `loadgen sim --profile` reads it; `rounds` (coefficients in us, one dict per probe
    round) become [[rounds]] tables, rms_rel (the fit's residual) [fit] rms_rel and `recheck` (numbers) a
    [recheck] table, which the simulator ignores and twin/intervals.py reads."""
    def num(v: float) -> str:  # full precision: a written profile predicts exactly what the fit did
        return repr(int(v)) if isinstance(v, int) else repr(float(v))
    lines = [f"# {h}" for h in header]
    lines += [f"name = {json.dumps(p.name)}", f"model_name = {json.dumps(p.model_name)}",
              f"description = {json.dumps(p.description)}",
              f"max_model_len = {p.max_model_len}", "", "[model]"]
    lines += [f"{k} = {num(getattr(p, k))}"
              for k in ("params", "weight_bytes", "kv_bytes_per_token", "layers", "hidden")]
    lines += ["", "[step]  # see loadgen/sim/profiles.py for the step-time model"]
    lines += [f"{k} = {num(getattr(p, k))}" for k in (
        "overhead_us", "per_seq_us", "weight_bandwidth_gb_s", "kv_bandwidth_gb_s", "compute_tflops",
        "prefill_launch_us", "decode_launch_us", "multi_token_us", "multi_token_kv_us", "request_overhead_us")]
    lines.append(f"memory_compute = {json.dumps(p.memory_compute)}")
    lines += ["", "[engine]"]
    lines += [f"{k} = {getattr(p, k)}" for k in ("max_num_seqs", "max_num_batched_tokens", "kv_capacity_tokens")]
    if rms_rel is not None:
        lines += ["", "[fit]", f"rms_rel = {num(rms_rel)}"]
    if recheck:
        lines += ["", "[recheck]"] + [f"{k} = {num(v)}" for k, v in recheck.items()]
    for r in rounds:
        lines += ["", "[[rounds]]"] + [f"{k}_us = {num(v)}" for k, v in r.items()]
    return "\n".join(lines) + "\n"


def idle_calibration(p: Profile, prompt_tokens: Sequence[int], source: str) -> dict:
    """What the run's idle-server probes would have measured, from a profile: calibration.json's shape
    (probe/calibrate.py), so that the calibrated decomposition (analysis/decompose.py) uses the fitted model.
    Each distinct prompt length given is one exact "probe": prefill_ms = the profile's TTFT (request overhead
    included, as a probe's first token - connected is), decode ms per token = its one-sequence decode step at
    that context; fitted as the probes are (a quadratic and a line over the lengths)."""
    lengths = sorted({int(n) for n in prompt_tokens if n and n > 0}) or [1]
    probes: list[dict | None] = [{"prompt_tokens": n, "prefill_ms": predicted_ttft_s(p, n) * 1e3,
                                  DECODE_KEY: p.decode_ns(1, n) / 1e6, "server_prefill_ms": None,
                                  "server_queue_ms": None}
                                 for n in lengths]
    out = fit_calibration(probes)
    del out["probes"]
    return {**out, "method": "fitted-profile", "source": source, "prompt_lengths": len(lengths)}
