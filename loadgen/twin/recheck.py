"""`loadgen fit --url URL --recheck PROFILE.toml --out NOW.toml`: the server's speed now against a profile
(docs/twin.md, "Recheck"): a few seconds of idle probes, and the profile scaled to them.

Why: the fit describes the server it probed; one restarted, moved to another host or given other neighbours
since runs at another speed (a second CPU vLLM process ran ~10 % slower than the first). A recheck measures
that in ~5-10 s where a fit takes a minute. It is not a way to follow a CPU server's speed from one minute to
the next: on a 2-core VM a few seconds of probes read the following minute no better than a fit made minutes
before (docs/twin.md, "The model at a workload's shapes, and the recheck").

What it measures: RECHECK_ROUNDS rounds of prefills (RECHECK_PROMPTS tokens, one output) and decodes (batch 1
at context 16, batches 1 and 2 at a quarter of the context per slot), as the fit takes them (fit_probe.py). Each
sample's predicted time depends on two factors: one on the prompt terms (PROMPT_TERMS: the compute per new
token and per attention pair, the cost of a step of more than one token), one on the step terms (STEP_TERMS:
the step's overhead, per sequence, weights and KV reads). The factors are the least squares of the samples'
relative errors against the profile scaled by them (factors()), their standard errors from its residuals and
covariance. A prefill's measured time is the server's own prompt time where it reports one (llama.cpp), else
TTFT - the profile's request overhead.

What it writes: the profile and each of its [[rounds]] with the prompt terms times the prefill factor and the
step terms times the decode factor (the request overhead kept: the front end's, not the engine's speed); the
rounds' spread is kept, so `predict` still sees the seconds-scale phases the fit saw; [recheck] records the
factors and se_log = the larger standard error (in log), which `predict` adds to the intervals
(twin/intervals.py). The limits are the profile's (a different setting is `predict --set`'s).
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, replace

import numpy as np

from loadgen.sim.profiles import Profile
from loadgen.twin.fit import FitOptions, decode_context_in, decode_probe
from loadgen.twin.fit_model import EngineLimits, coefficients, in_us, predicted_step_s, predicted_ttft_s, \
    to_profile, to_toml
from loadgen.twin.fit_probe import DecodeSample, PrefillSample, Prober, ProbeFailed, ShortOverlap
from loadgen.twin.intervals import Spread

RECHECK_ROUNDS = 3
RECHECK_PROMPTS = (256, 1024)
PROMPT_TERMS = ("per_token", "per_pair", "multi_token", "multi_token_kv")
STEP_TERMS = ("overhead", "per_seq", "weights", "kv_per_token")
GAUSS_NEWTON_STEPS = 20


@dataclass(frozen=True)
class Factors:
    prefill: float    # the server's prompt work now / the profile's (1.1: 10 % slower)
    decode: float     # its step work now / the profile's
    se_log: float     # the larger of the two factors' standard errors, relative (~ in log)
    samples: int


def scaled(p: Profile, prefill: float, decode: float) -> Profile:
    """`p` with its prompt terms times `prefill`, its step terms times `decode` (launch floors likewise)."""
    c = coefficients(p)
    c = replace(c, **{k: getattr(c, k) * prefill for k in PROMPT_TERMS},
                **{k: getattr(c, k) * decode for k in STEP_TERMS})
    lim = EngineLimits(p.model_name, p.max_num_seqs, p.max_num_batched_tokens, p.max_model_len, p.params,
                       p.weight_bytes or None)
    return replace(to_profile(c, lim, p.name, p.description, p.memory_compute),
                   kv_capacity_tokens=p.kv_capacity_tokens, prefill_launch_us=p.prefill_launch_us * prefill,
                   decode_launch_us=p.decode_launch_us * decode)


def _times(p: Profile, prefill: list[PrefillSample], decode: list[DecodeSample]) -> np.ndarray:
    """What `p` predicts for each sample: a prefill's prompt time (TTFT less the request overhead), a
    decode's step."""
    return np.array([predicted_ttft_s(p, s.prompt_tokens) - p.request_overhead_us * 1e-6 for s in prefill]
                    + [predicted_step_s(p, d) for d in decode])


def factors(p: Profile, prefill: list[PrefillSample], decode: list[DecodeSample]) -> Factors:
    """The two factors (the module's docstring); ProbeFailed when the samples cannot tell them apart.

    A step's time is homogeneous of degree one in the two factors (each term scales with one of them; max()
    of two such terms too), so t = f_p dt/df_p + f_d dt/df_d on each branch of max(): Gauss-Newton on the
    relative errors, the derivatives by differences at the current factors, converges in a few steps."""
    m = np.array([s.server_prefill_s if s.server_prefill_s is not None else s.ttft_s - p.request_overhead_us * 1e-6
                  for s in prefill] + [d.step_s for d in decode])
    if len(m) < 3 or not np.all(m > 0):
        raise ProbeFailed(f"the recheck's {len(m)} probes cannot tell the prompt work from the step work")
    f, h = np.ones(2), 1e-4
    for _ in range(GAUSS_NEWTON_STEPS):
        t = _times(scaled(p, *f), prefill, decode)
        x = np.column_stack([(_times(scaled(p, f[0] * (1 + h), f[1]), prefill, decode) - t) / (f[0] * h),
                             (_times(scaled(p, f[0], f[1] * (1 + h)), prefill, decode) - t) / (f[1] * h)]) / m[:, None]
        if np.linalg.matrix_rank(x) < 2:
            raise ProbeFailed(f"the recheck's {len(m)} probes cannot tell the prompt work from the step work "
                              "(the profile predicts no time for one of them)")
        step, *_ = np.linalg.lstsq(x, 1.0 - t / m, rcond=None)
        f = f + step
        if not np.all(f > 0):
            raise ProbeFailed(f"the recheck's probes fit no positive speed factors (prompt {f[0]:.3g}, "
                              f"step {f[1]:.3g})")
        if np.max(np.abs(step / f)) < 1e-9:
            break
    resid = _times(scaled(p, *f), prefill, decode) / m - 1.0
    cov = resid @ resid / max(1, len(m) - 2) * np.linalg.inv(x.T @ x)
    se = np.sqrt(np.diag(cov)) / f
    return Factors(float(f[0]), float(f[1]), float(max(se)), len(m))


async def _probe(o: FitOptions, p0: Profile) -> tuple[list[PrefillSample], list[DecodeSample], float]:
    async with Prober(o.url, o.budget_s, o.extra_body, headers=dict(o.headers), tls=o.tls) as p:
        ctx = p0.max_model_len
        prompts = [n for n in RECHECK_PROMPTS if n + 2 <= ctx]
        deep = decode_context_in(ctx, ctx // 4)   # the fit's deeper decode context
        shapes = [(1, 16), (1, deep)] + ([(2, deep)] if p0.max_num_seqs >= 2 else [])
        await p.prefill(16)   # warm-up, as the fit's (a fresh server's first request, a new batch shape)
        for b in sorted({b for b, _ in shapes}):
            try:
                await p.decode(b, 16, 48)
            except ShortOverlap:
                pass
        pre: list[PrefillSample] = []
        dec: list[DecodeSample] = []
        outputs: dict[tuple, int] = {}
        for _ in range(o.rounds):
            pre += [await p.prefill(n) for n in prompts]
            for b, c in shapes:
                try:
                    dec.append(await decode_probe(p, b, c, ctx, outputs))
                except ShortOverlap:
                    pass   # a shape never overlapped: the others tell the step work
        return pre, dec, o.budget_s - p.left_s()


def recheck(o: FitOptions, profile: Profile, spread: Spread) -> tuple[Profile, Spread, dict]:
    """(the profile scaled to the server now, its rounds likewise, the report)."""
    pre, dec, used_s = asyncio.run(_probe(o, profile))
    f = factors(profile, pre, dec)
    now = scaled(profile, f.prefill, f.decode)
    rounds = [scaled(r, f.prefill, f.decode) for r in spread.rounds]
    report = {"url": o.url, "prefill_scale": f.prefill, "decode_scale": f.decode, "se_log": f.se_log,
              "samples": f.samples, "rounds": o.rounds, "probe_s": round(used_s, 1),
              "coefficients_us": in_us(coefficients(now))}
    return now, Spread(rounds, spread.misfit_rel, f.se_log), report


def profile_text(now: Profile, spread: Spread, report: dict) -> str:
    """The rechecked profile's file: the scaled profile, its scaled [[rounds]], the fit's [fit] rms_rel, and
    [recheck] (the factors, se_log: what predict adds to the intervals)."""
    return to_toml(now, [
        f"Rechecked by `loadgen fit --recheck {report['profile_from']}` against {report['url']} ({report['samples']} "
        f"probes in {report['probe_s']} s): prompt work x{report['prefill_scale']:.4g}, step work "
        f"x{report['decode_scale']:.4g} (docs/twin.md, Recheck).",
        "[[rounds]]: the fit's round profiles scaled alike; [recheck] se_log widens predict's intervals."],
        rounds=[in_us(coefficients(r)) for r in spread.rounds],
        rms_rel=spread.misfit_rel,
        recheck={k: report[k] for k in ("prefill_scale", "decode_scale", "se_log", "samples")})


def to_text(report: dict) -> str:
    return (f"recheck: {report['url']} against {report['profile_from']}: prompt work x{report['prefill_scale']:.3f}, "
            f"step work x{report['decode_scale']:.3f} (standard error {report['se_log']:.1%}; "
            f"{report['samples']} probes in {report['probe_s']} s)\n")
