"""`loadgen fit --url URL --out profile.toml`: probe a live server (fit_probe.py), fit the simulator's
step model (fit_model.py), write a profile `loadgen sim --profile FILE` and `loadgen predict` take.

The plan, in rounds (a round = every prefill length once, every decode shape once, every mixed shape once), at most
--rounds rounds (default ROUNDS), each probe bounded by the budget (--budget, default 60 s): round 1 must
finish, later rounds stop at the deadline (what they measured is kept). Per shape, the rounds' center is
fitted (`center`: the median of fewer than 5, else the mean of all but the fastest and slowest tenth).
The mean, because a CPU server on a shared host runs in phases (measured here: 256-token prefills of ~71
and ~90 ms in stretches of seconds to a minute, on a quiet 2-core VM) and a run of minutes sees their
mixture, which a median of a short fit misses by the slow share; trimmed, because one round disturbed by
a descheduling should not move it. A prefill shape's TTFT is, where the server reports its prompt time,
that time's center plus the request overhead (below), so client-side noise stays out.

  limits   what the server publishes (probe/discover.published_limits): slots (max_num_seqs) from
           llama.cpp's /props, tokens per slot (max_model_len) from its /props or from /v1/models
           (vLLM, SGLang, the simulator); --max-num-seqs / --max-model-len override them; slots that nothing
           publishes (vLLM, SGLang) are probed (fit_probe: seats; report `max_num_seqs_from`); the per-step
           token budget max_num_batched_tokens from --max-batched-tokens (default 2048, llama.cpp's
           n_batch: no server publishes it)
  prefill  PREFILL_PROMPTS (those that fit in a slot with one output token), one at a time
  decode   batches 1, 2, 4, 8 (<= slots) x contexts 16, max_model_len / 16 and / 4, DECODE_TOKENS outputs; a
           shape whose streams overlap for too few steps (fit_probe.ShortOverlap: steps of a fast engine,
           as the simulator's default profile's ~1.5 ms, against the time a busy client takes to start
           B streams) is asked again with twice the outputs, up to DECODE_MAX_TOKENS, and keeps that length;
           one that does not overlap even then is left out of that round, not the fit (report
           `decode_left_out`: shape -> rounds without it; a CPU vLLM beside busy neighbours once served the
           streams of a shape one after another); with no decode shape timed at all the fit fails
  mixed    a prompt of MIXED_PROMPTS tokens (those that fit one step with the decodes) sent into B = 1 and
           min(4, slots - 1) decoding streams (contexts 16 and max_model_len / 4, MIXED_TOKENS outputs,
           lengthened like a decode shape's): the step that runs both, which a server under load is made
           of, and which tells the forms apart (max: the prompt hides the decodes' reads; sum: it adds to
           them). A shape no stream could time even at the longest outputs is left out of that round
           (fit_probe.mixed says why), not the fit: the other probes do not need it
  request overhead: median(TTFT - server prompt time) when the server reports it, else fitted (the mixed
           probe's steps are timed without it, a prefill's TTFT with it), else 0

On this repository's 2-core machine against llama-server (2 slots, 4096 tokens each) one round takes
~6-9 s: the default budget fits the default 8 rounds.
"""
from __future__ import annotations

import asyncio
import ssl
import statistics
from dataclasses import dataclass

from loadgen.twin.fit_model import EngineLimits, FitResult, fit, in_us, to_toml
from loadgen.twin.fit_probe import DecodeSample, MixedSample, PrefillSample, Prober, ProbeFailed, ShortOverlap

PREFILL_PROMPTS = (16, 64, 256, 512, 1024, 1536, 2048, 3072)
DECODE_TOKENS = 48
DECODE_MAX_TOKENS = 768
MIXED_PROMPTS = (256, 1024)
MIXED_TOKENS = 64
ROUNDS = 8


@dataclass(frozen=True)
class FitOptions:
    url: str
    budget_s: float = 60.0
    max_num_seqs: int | None = None
    max_model_len: int | None = None
    max_batched_tokens: int = 2048
    extra_body: dict | None = None
    name: str = "fitted"
    rounds: int = ROUNDS
    headers: tuple[tuple[str, str], ...] = ()   # --header, as a run sends them
    tls: ssl.SSLContext | bool = True           # --insecure / --ca-bundle (ClientOptions.ssl_context)


@dataclass
class Round:
    """Samples as the fit takes them: one complete round's own, or every shape's center over the rounds."""
    prefill: list[PrefillSample]
    decode: list[DecodeSample]
    mixed: list[MixedSample]


async def _probe(o: FitOptions) -> tuple[EngineLimits, Round, list[Round], dict]:
    """(limits, the rounds' centers per shape, each complete round's own samples, info)."""
    async with Prober(o.url, o.budget_s, o.extra_body, headers=dict(o.headers), tls=o.tls) as p:
        srv = await p.limits()
        ctx = o.max_model_len or srv.ctx_per_slot
        if not ctx:
            raise ProbeFailed(f"{o.url}: the server does not publish its context per slot (llama.cpp's /props "
                              "n_ctx, or max_model_len in /v1/models): give --max-model-len")
        await p.prefill(16)  # warm-up (first request of a fresh server: allocations, caches)
        # the slots: the flag, else what the server publishes (llama.cpp), else probed (vLLM, SGLang publish none)
        slots, slots_from = ((o.max_num_seqs, "--max-num-seqs") if o.max_num_seqs else
                             (srv.slots, "published") if srv.slots else (await p.seats(), "probed"))
        lim = EngineLimits(srv.model, slots, o.max_batched_tokens, ctx, srv.n_params, srv.size_bytes)
        prompts = [n for n in PREFILL_PROMPTS if n + 2 <= ctx]
        batches = sorted({b for b in (1, 2, 4, 8) if b <= slots})
        contexts = sorted({16, decode_context_in(ctx, ctx // 4)})
        # the decodes also at a middle context: llama.cpp's one-stream step is concave in the context (2.01,
        # 2.13, 2.34, 2.49, 2.77, 2.89 ms at 16, 128, 256, 512, 768, 1024 tokens: up to 5 % above the line
        # through the ends), and a workload's contexts are mostly between the two
        decode_contexts = sorted({*contexts, decode_context_in(ctx, ctx // 16)})
        mixes = [(b, c, n) for b in sorted({1, min(4, slots - 1)}) if b >= 1 for c in contexts
                 for n in MIXED_PROMPTS if n + b <= o.max_batched_tokens and n + 2 <= ctx]
        for b in batches:    # each batch size once (a fresh vLLM on a CPU stalls on each new shape)
            try:
                await p.decode(b, 16, DECODE_TOKENS)
            except ShortOverlap:
                pass
        pre: dict[int, list[PrefillSample]] = {}
        dec: dict[tuple[int, int], dict[int, DecodeSample]] = {}       # shape -> round -> sample
        untimed: dict[tuple[int, int], str] = {}  # a decode shape's last ShortOverlap (its streams never overlapped)
        mix: dict[tuple[int, int, int], dict[int, MixedSample]] = {}   # shape -> round -> sample
        outputs: dict[tuple, int] = {}  # a shape's output tokens, once lengthened
        rounds = 0
        try:
            for _ in range(o.rounds):
                for n in prompts:
                    pre.setdefault(n, []).append(await p.prefill(n))
                for b in batches:
                    for c in decode_contexts:
                        try:
                            dec.setdefault((b, c), {})[rounds] = await decode_probe(p, b, c, ctx, outputs)
                        except ShortOverlap as e:  # left out of this round, as an untimed mixed shape is
                            untimed[(b, c)] = str(e)
                for b, c, n in mixes:
                    if (m := await _mixed(p, b, c, n, ctx, outputs)) is not None:
                        mix.setdefault((b, c, n), {})[rounds] = m
                rounds += 1
        except ProbeFailed as e:
            if p.left_s() > 0:
                raise  # a real failure, not the deadline
            if rounds == 0:
                raise ProbeFailed(f"one round of probes did not fit in --budget {o.budget_s:g}s: "
                                  f"give more ({e})") from None
        used_s = o.budget_s - p.left_s()
    r_s = request_overhead_s([s for v in pre.values() for s in v])
    prefill = [_prefill_sample(n, v, r_s) for n, v in pre.items()]
    if not any(dec.values()):
        raise ProbeFailed(f"no decode shape could be timed: {'; '.join(untimed.values())}")
    decode = [DecodeSample(b, c, next(iter(v.values())).output_tokens, center([s.step_s for s in v.values()]))
              for (b, c), v in dec.items() if v]
    done = [{k: m for k, m in v.items() if k < rounds} for v in mix.values()]  # complete rounds' samples
    mixed = [MixedSample(b, statistics.fmean(s.context for s in v.values()), n, center([s.step_s for s in v.values()]))
             for (b, _, n), v in zip(mix, done) if v]
    each = [Round([_prefill_sample(n, [v[k]], r_s) for n, v in pre.items()], [v[k] for v in dec.values() if k in v],
                  [v[k] for v in done if k in v]) for k in range(rounds)]
    return lim, Round(prefill, decode, mixed), each, {
        "rounds": rounds, "probe_s": round(used_s, 1), "budget_s": o.budget_s, "max_num_seqs_from": slots_from,
        "decode_left_out": {f"{b}x{c}": sum(k not in dec.get((b, c), {}) for k in range(rounds))
                            for b, c in untimed}}


def decode_context_in(ctx: int, want: int) -> int:
    """A decode probe's context: `want`, at least 16, leaving room in a slot of `ctx` tokens for its outputs."""
    return max(16, min(want, ctx - DECODE_TOKENS - 2))


async def _lengthened(probe, key: tuple, first: int, longest: int, outputs: dict[tuple, int]):
    """probe(n) with n output tokens: `first`, or the length this shape kept in an earlier round (outputs[key]);
    on ShortOverlap (streams that overlapped too briefly) asked again with twice the outputs, kept for the
    shape's later rounds, while n <= longest; then ShortOverlap is raised."""
    n = outputs.get(key, first)
    while True:
        try:
            return await probe(n)
        except ShortOverlap:
            if 2 * n > longest:
                raise
            n = outputs[key] = 2 * n


async def decode_probe(p: Prober, batch: int, context: int, ctx: int, outputs: dict[tuple, int]) -> DecodeSample:
    """One decode probe of the shape, lengthened while the outputs fit in the slot and DECODE_MAX_TOKENS."""
    return await _lengthened(lambda n: p.decode(batch, context, n), (batch, context), DECODE_TOKENS,
                             min(DECODE_MAX_TOKENS, ctx - context - 2), outputs)


async def _mixed(p: Prober, batch: int, context: int, prompt: int, ctx: int,
                 outputs: dict[tuple, int]) -> MixedSample | None:
    """One mixed probe of the shape, its decodes lengthened as decode_probe's are; None when no stream could time
    the step even at the longest outputs (a server whose reads carry several tokens)."""
    try:
        return await _lengthened(lambda n: p.mixed(batch, context, prompt, n), ("mixed", batch, context, prompt),
                                 MIXED_TOKENS, min(DECODE_MAX_TOKENS, ctx - context - 2), outputs)
    except ShortOverlap:
        return None


def _prefill_sample(prompt_tokens: int, v: list[PrefillSample], r_s: float | None) -> PrefillSample:
    # Where the server reports its own prompt time, the shape's TTFT is that (center over rounds) plus
    # the request overhead measured over every probe: a busy client host delays one probe's first token,
    # not the server's clock.
    server = [s.server_prefill_s for s in v if s.server_prefill_s is not None]
    if not server or r_s is None:
        return PrefillSample(prompt_tokens, center([s.ttft_s for s in v]), None)
    server_s = center(server)
    return PrefillSample(prompt_tokens, server_s + r_s, server_s)


def center(v: list[float]) -> float:
    """The median of fewer than 5 values, else the mean without the lowest and highest tenth (at least one
    each)."""
    if len(v) < 5:
        return statistics.median(v)
    k = max(1, len(v) // 10)
    return statistics.fmean(sorted(v)[k:len(v) - k])


def request_overhead_s(prefill: list[PrefillSample]) -> float | None:
    """Measured from the server's own prompt times; None where it reports none (the fit then fits it)."""
    gaps = [s.ttft_s - s.server_prefill_s for s in prefill if s.server_prefill_s is not None]
    return max(0.0, statistics.median(gaps)) if gaps else None


def run_fit(o: FitOptions) -> tuple[FitResult, dict]:
    lim, c, each, info = asyncio.run(_probe(o))
    r_s = request_overhead_s(c.prefill)
    res = fit(c.prefill, c.decode, lim, r_s, name=o.name, mixed=c.mixed,
              description=f"fitted by loadgen fit to {lim.model_name} at {o.url}")
    # The same form fitted to each complete round alone: how far the server's speed moved during the fit,
    # which `loadgen predict` turns into intervals (twin/intervals.py). Fewer than 2 rounds: no interval.
    each = [r for r in each if r.decode]  # a round whose every decode shape went untimed fits nothing alone
    per_round = [fit(r.prefill, r.decode, lim, r_s, forms=(res.form,), mixed=r.mixed).coefficients
                 for r in each] if len(each) >= 2 else []
    report = {"url": o.url, "form": res.form, "rms_rel": res.rms_rel, "max_abs_rel": res.max_abs_rel,
              "alternatives_rms_rel": res.alternatives, "request_overhead_source":
              "server timings" if r_s is not None else "fitted (mixed probes)" if c.mixed else "none (0)",
              "limits": {"max_num_seqs": lim.max_num_seqs, "max_model_len": lim.max_model_len,
                         "max_num_batched_tokens": lim.max_num_batched_tokens},
              "coefficients_us": in_us(res.coefficients),
              "residuals": res.residuals,
              "rounds_coefficients_us": [in_us(c) for c in per_round], **info}
    return res, report


def profile_text(res: FitResult, report: dict) -> str:
    c = report["coefficients_us"]
    return to_toml(res.profile, [
        f"Fitted by `loadgen fit` to {report['url']} ({report['rounds']} probe rounds, {report['probe_s']} s).",
        f"Form: {res.form}; residuals rms {res.rms_rel:.1%}, max {res.max_abs_rel:.1%} (docs/twin.md).",
        "Effective coefficients (us): " + ", ".join(f"{k} {v:.4g}" for k, v in c.items()) + ".",
        "Only ratios matter: weight_bytes / weight_bandwidth, kv_bytes_per_token / kv_bandwidth, params and",
        "layers * hidden / compute_tflops; max_num_batched_tokens is "
        f"{report['limits']['max_num_batched_tokens']} (--max-batched-tokens).",
        "[[rounds]]: the same form fitted to each probe round alone (effective coefficients, us); `loadgen predict`",
        "turns their spread into intervals (docs/twin.md)."], rounds=report["rounds_coefficients_us"],
        rms_rel=res.rms_rel)


def to_text(res: FitResult, report: dict) -> str:
    lines = [f"fit: {report['url']}: {report['rounds']} rounds of probes in {report['probe_s']} s "
             f"(budget {report['budget_s']:g} s)",
             f"form: {res.form} (rms relative residual {res.rms_rel:.1%}, max {res.max_abs_rel:.1%}; "
             + ", ".join(f"{k} {v:.1%}" for k, v in res.alternatives.items()) + ")",
             "limits: " + ", ".join(f"{k} {v}" for k, v in report["limits"].items()),
             "coefficients (us): " + ", ".join(f"{k} {v:.4g}" for k, v in report["coefficients_us"].items()),
             f"request overhead from: {report['request_overhead_source']}",
             f"{'probe':<28} {'measured ms':>12} {'predicted ms':>13} {'error':>7}"]
    for r in res.residuals:
        what = (f"prefill {r['prompt_tokens']} tokens" if r["kind"] == "prefill"
                else f"decode batch {r['batch']}, ctx {r['prompt_tokens']}" if r["kind"] == "decode"
                else f"{r['prompt_tokens']} + {r['batch']} dec. ctx {r['context']:.0f}")
        lines.append(f"{what:<28} {r['measured_ms']:12.2f} {r['predicted_ms']:13.2f} {r['error_rel']:+7.1%}")
    return "\n".join(lines) + "\n"
