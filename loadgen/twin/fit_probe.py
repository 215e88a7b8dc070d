"""Probes of a live server for `loadgen fit` (fit.py): what the server says about itself, and timed
streams in two shapes. Times are client stamps (time.monotonic_ns) of reads, so every figure includes
what a client sees (HTTP, tokenization, sampling), not only the engine's kernels.

  limits   GET /v1/models (id, max_model_len; llama.cpp's meta: n_params, size in bytes) and GET /props
           (llama.cpp: total_slots, default_generation_settings.n_ctx = tokens per slot), read by
           probe/discover.published_limits
  prefill  one stream at a time on an idle server, prompt of P token ids, 1 output token:
           PrefillSample(P, ttft_s = first token - request sent, server_prefill_s = llama.cpp's
           timings.prompt_ms when the stream carries it)
  decode   B streams started together, prompts of P token ids, N output tokens each (exact: ignore_eos):
           DecodeSample(B, P, N, step_s = mean token gap while all B streams decode); fewer than
           MIN_OVERLAP_STEPS x B such gaps raise ShortOverlap (fit.py then asks for longer streams)
  seats    where the server publishes no slot count (vLLM, SGLang): K streams sent together (16-token
           prompts, SEAT_TOKENS outputs) while its /metrics running and waiting gauges are read every
           SEAT_POLL_S; the most running at once, where others waited then, is the seat count (seats_seen).
           All K ran at once: K doubled, up to SEAT_MAX; the reads missed the peak: the outputs doubled
  mixed    B streams decoding (prompts of C token ids, N outputs); once each has MIXED_AFTER tokens, one
           prompt of P token ids with 1 output token: the engine runs that prompt in a step with the B
           decodes. MixedSample(B, context = the decodes' mean context then, P, step_s = the decodes' gap
           that ends with the prompt's first token), the step a run under load is made of and the two
           other shapes never show (a CPU engine pays the prompt's compute on top of the decodes' reads)

Prompts are lists of token ids (exact lengths, no tokenizer needed; ids drawn from [1000, 30000) so no
byte-fallback or control token), each request's ids distinct (no prefix cache hit); requests ask
`cache_prompt: false` and `ignore_eos: true` (llama.cpp; others ignore unknown fields or are told by
--extra-body) and leave sampling to the server's defaults, as a workload without sampling fields does:
sampling costs time per token on a CPU (llama.cpp's default sampler chain over a 32k vocabulary), so give
the workload's own sampling fields with --extra-body. The whole probe is bounded by a deadline: each
stream gets at most the time left. Every request carries the run options' headers and TLS choice
(--header, --insecure, --ca-bundle: config/client.py), as a run's do.
"""
from __future__ import annotations

import asyncio
import random
import statistics
from itertools import groupby
import ssl
import time
from dataclasses import dataclass, field

import aiohttp
import orjson

from loadgen.client.backends.sse import SSEParser
from loadgen.errors import LoadgenError
from loadgen.probe.discover import published_limits
from loadgen.probe.scrape import RUNNING, gauges, metrics_url

MIN_OVERLAP_STEPS = 8  # a decode probe needs this many steps (per stream) with every stream decoding
MIXED_AFTER = 8        # the mixed probe's prompt is sent once every decode stream has this many tokens
SEAT_START, SEAT_MAX = 8, 256   # the seat probe's first batch of streams, doubled up to this (then the flag)
SEAT_TOKENS, SEAT_MAX_TOKENS = 32, 512   # its outputs per stream, doubled while /metrics misses the peak
SEAT_PROMPT = 16
SEAT_POLL_S = 0.02   # the seat probe's /metrics reads (a CPU server's front end serves them too: not more often)


class ProbeFailed(LoadgenError):
    pass


class ShortOverlap(ProbeFailed):
    """The decode probe's streams overlapped for too few steps (fast steps, or streams started apart)."""


@dataclass(frozen=True)
class PrefillSample:
    prompt_tokens: int
    ttft_s: float
    server_prefill_s: float | None = None  # the server's own prompt time, if it says (llama.cpp timings)


@dataclass(frozen=True)
class DecodeSample:
    batch: int
    prompt_tokens: int
    output_tokens: int
    step_s: float   # mean gap between tokens while all `batch` streams decode


@dataclass(frozen=True)
class MixedSample:
    batch: int           # decoding streams in the step (the prompt's sequence is one more)
    context: float       # their mean context (prompt + tokens so far) in that step
    prompt_tokens: int   # the prompt run in the same step (one chunk: <= max_batched_tokens - batch)
    step_s: float        # the step's time: the decodes' token gap that ends with the prompt's first token


@dataclass(frozen=True)
class ServerLimits:
    model: str
    slots: int | None          # llama.cpp total_slots
    ctx_per_slot: int | None   # llama.cpp default_generation_settings.n_ctx, else /v1/models max_model_len
    n_params: int | None
    size_bytes: int | None


@dataclass
class _Stream:
    sent_ns: int = 0
    token_ns: list[int] = field(default_factory=list)
    completion_tokens: int | None = None
    server_prompt_ms: float | None = None
    first_ns: int | None = None  # the first chunk with a choice (a 1-token reply may be only its closing chunk)


class Prober:
    def __init__(self, url: str, deadline_s: float, extra_body: dict | None = None, seed: int = 0,
                 headers: dict[str, str] | None = None, tls: ssl.SSLContext | bool = True):
        self.url = url.rstrip("/")
        self.headers, self.tls = dict(headers or {}), tls  # tls: aiohttp's ssl= (ClientOptions.ssl_context)
        self.deadline_ns = time.monotonic_ns() + int(deadline_s * 1e9)
        self.extra = {"ignore_eos": True, "cache_prompt": False, **(extra_body or {})}
        self.rng = random.Random(seed)
        self.model = ""
        self.session: aiohttp.ClientSession | None = None
        self.last_error = ""

    async def __aenter__(self) -> "Prober":
        # a new connection per request: llama-server may close one after a stream, and a reused
        # connection closed under us fails the next request
        self.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, force_close=True, ssl=self.tls),
                                             headers=self.headers)
        return self

    async def __aexit__(self, *exc) -> None:
        await self._http().close()

    def _http(self) -> aiohttp.ClientSession:
        if self.session is None:
            raise RuntimeError("a Prober makes requests inside `async with` only")
        return self.session

    def left_s(self) -> float:
        return (self.deadline_ns - time.monotonic_ns()) / 1e9

    async def _get_json(self, path: str) -> dict | None:
        try:
            async with self._http().get(self.url + path, timeout=aiohttp.ClientTimeout(total=5)) as r:
                if r.status != 200:
                    return None
                return orjson.loads(await r.read())
        except (aiohttp.ClientError, asyncio.TimeoutError, orjson.JSONDecodeError, ValueError) as e:
            self.last_error = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
            return None

    async def limits(self) -> ServerLimits:
        models = await self._get_json("/v1/models")
        if not models or not models.get("data"):
            why = self.last_error or "no model listed (is this an OpenAI-compatible server?)"
            if "certificate" in why.lower():
                why += " (pass --ca-bundle FILE with the CA that signed it, or --insecure)"
            raise ProbeFailed(f"GET {self.url}/v1/models: {why}")
        m = models["data"][0]
        self.model = str(m.get("id", ""))
        meta = m.get("meta") or {}
        published = published_limits(models, await self._get_json("/props"))

        def whole(v):
            return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 else None
        return ServerLimits(self.model, published["slots"], published["ctx_per_slot"] or published["max_model_len"],
                            whole(meta.get("n_params")), whole(meta.get("size")))

    def _ids(self, n: int) -> list[int]:
        return [self.rng.randrange(1000, 30000) for _ in range(n)]

    async def _stream(self, prompt_tokens: int, max_tokens: int, out: _Stream | None = None) -> _Stream:
        body = orjson.dumps({"model": self.model, "prompt": self._ids(prompt_tokens), "max_tokens": max_tokens,
                             "stream": True, **self.extra})
        left = self.left_s()
        if left <= 0:
            raise ProbeFailed("the probe ran out of its time budget (--budget)")
        out = _Stream() if out is None else out  # the caller's, to watch the tokens as they come
        parser = SSEParser()
        try:
            out.sent_ns = time.monotonic_ns()
            async with self._http().post(self.url + "/v1/completions", data=body,
                                         headers={"Content-Type": "application/json"},
                                         timeout=aiohttp.ClientTimeout(total=left)) as r:
                if r.status != 200:
                    raise ProbeFailed(f"POST /v1/completions: HTTP {r.status}: {(await r.read())[:300]!r}")
                async for data in r.content.iter_any():
                    t = time.monotonic_ns()
                    for ev in parser.feed(data):
                        if ev.data == b"[DONE]":
                            continue
                        p = orjson.loads(ev.data)
                        if (p.get("usage") or {}).get("completion_tokens") is not None:
                            out.completion_tokens = p["usage"]["completion_tokens"]
                        if isinstance((p.get("timings") or {}).get("prompt_ms"), (int, float)):
                            out.server_prompt_ms = float(p["timings"]["prompt_ms"])
                        ch = p.get("choices") or []
                        # a token chunk: text, or none yet (llama.cpp holds back an incomplete UTF-8
                        # character but still sends the token's chunk) and not the closing one
                        if ch and out.first_ns is None:
                            out.first_ns = t
                        if ch and (ch[0].get("text") or ch[0].get("finish_reason") is None):
                            out.token_ns.append(t)
        except asyncio.TimeoutError:
            raise ProbeFailed("the probe ran out of its time budget (--budget) inside a request") from None
        except aiohttp.ClientError as e:
            raise ProbeFailed(f"POST {self.url}/v1/completions: {e}") from None
        if out.first_ns is None:
            raise ProbeFailed(f"POST /v1/completions ({prompt_tokens}-token prompt): the stream carried no token")
        return out

    async def prefill(self, prompt_tokens: int) -> PrefillSample:
        s = await self._stream(prompt_tokens, 1)
        assert s.first_ns is not None  # _stream raises for a stream without a token
        server = s.server_prompt_ms / 1e3 if s.server_prompt_ms is not None else None
        return PrefillSample(prompt_tokens, (s.first_ns - s.sent_ns) / 1e9, server)

    async def decode(self, batch: int, prompt_tokens: int, output_tokens: int) -> DecodeSample:
        # Only the window where all `batch` streams are decoding counts (after the last first token,
        # before the first last token): a stream admitted a step later must not charge its prefill to
        # the others. The step time is the mean gap in that window, what a run's TPOT is: a host's slow
        # steps and descheduling are part of the speed a run meets (a 10 %-trimmed mean, used before, read
        # llama-server's decodes 1-3 % faster than its own timings of the same requests, and every
        # validation's TPOT came out slower than predicted). A round disturbed far more than that is what
        # the trimmed center over the rounds (fit.center) leaves out.
        streams = await asyncio.gather(*(self._stream(prompt_tokens, output_tokens) for _ in range(batch)))
        for s in streams:
            if len(s.token_ns) < 2:
                raise ProbeFailed(f"decode probe: a stream of {output_tokens} tokens carried "
                                  f"{len(s.token_ns)} token chunks")
            n = s.completion_tokens or output_tokens
            if n != output_tokens:
                raise ProbeFailed(f"asked {output_tokens} output tokens, the server produced {n} "
                                  "(it must honour ignore_eos, or be told with --extra-body)")
        lo, hi = max(s.token_ns[0] for s in streams), min(s.token_ns[-1] for s in streams)
        gaps = [g for s in streams for g in token_gaps(s.token_ns, lo, hi)]
        if len(gaps) < MIN_OVERLAP_STEPS * batch or not any(gaps):
            raise ShortOverlap(f"decode probe ({batch} streams of {output_tokens} tokens): the streams hardly "
                               f"overlapped ({len(gaps)} gaps with all decoding)")
        return DecodeSample(batch, prompt_tokens, output_tokens, sum(gaps) / len(gaps) / 1e9)

    async def seats(self) -> int:
        """The sequences the server runs at once (its max_num_seqs, or fewer where its KV pool binds first), read
        from its running / waiting gauges while streams sent together run: SEAT_START of them, doubled while all
        ran at once; each batch's outputs doubled while the gauges' reads missed the peak."""
        if await self._gauges() is None:
            raise ProbeFailed(f"{self.url} publishes no slot count, and its /metrics no running and waiting gauges "
                              f"({', '.join(RUNNING)}): give --max-num-seqs")
        batch, tokens = SEAT_START, SEAT_TOKENS
        while True:
            seen = seats_seen(await self.seats_batch(batch, tokens), batch)
            if seen is None:
                if 2 * tokens > SEAT_MAX_TOKENS:
                    raise ProbeFailed(f"seat probe: /metrics never showed the {batch} streams of {tokens} tokens at "
                                      "their peak: give --max-num-seqs")
                tokens *= 2
            elif seen < batch:
                return seen
            elif batch >= SEAT_MAX:
                raise ProbeFailed(f"seat probe: the server ran all {batch} streams at once; give --max-num-seqs")
            else:
                batch *= 2

    async def _gauges(self) -> tuple[float, float] | None:
        """(running, waiting) from the server's /metrics; None without both gauges."""
        try:
            async with self._http().get(metrics_url(self.url), timeout=aiohttp.ClientTimeout(total=5)) as r:
                g = gauges(await r.text()) if r.status == 200 else {}
        except (aiohttp.ClientError, asyncio.TimeoutError, UnicodeDecodeError):
            return None
        return (g["running"], g["waiting"]) if "running" in g and "waiting" in g else None

    async def seats_batch(self, batch: int, tokens: int) -> list[tuple[float, float]]:
        """`batch` streams of `tokens` outputs sent together; the (running, waiting) gauges read while they ran."""
        streams = [asyncio.ensure_future(self._stream(SEAT_PROMPT, tokens)) for _ in range(batch)]
        reads: list[tuple[float, float]] = []
        try:
            while not all(s.done() for s in streams) and not any(s.done() and s.exception() for s in streams):
                if (g := await self._gauges()) is not None:
                    reads.append(g)
                await asyncio.wait(streams, timeout=SEAT_POLL_S, return_when=asyncio.FIRST_EXCEPTION)
            for s in streams:
                n = s.result().completion_tokens
                if (n or tokens) != tokens:
                    raise ProbeFailed(f"asked {tokens} output tokens, the server produced {n} "
                                      "(it must honour ignore_eos, or be told with --extra-body)")
        finally:
            for s in streams:
                s.cancel()
            await asyncio.gather(*streams, return_exceptions=True)
        return reads

    async def mixed(self, batch: int, context: int, prompt_tokens: int, output_tokens: int) -> MixedSample:
        # The prompt is sent once every decode stream has MIXED_AFTER tokens; the engine takes it into its
        # next step with the B decodes (a prompt that fits the step's token budget: one chunk). Each decode
        # stream times that step by its reads (mixed_step); the sample is the median over the streams.
        outs = [_Stream() for _ in range(batch)]
        decodes = [asyncio.ensure_future(self._stream(context, output_tokens, o)) for o in outs]
        try:
            while min(len(o.token_ns) for o in outs) < MIXED_AFTER:
                done = [d for d in decodes if d.done()]
                if done:
                    await asyncio.gather(*done)  # a failed stream raises its error here
                    raise ShortOverlap(f"mixed probe ({batch} streams of {output_tokens} tokens): a stream ended "
                                       f"before every stream had {MIXED_AFTER} tokens")
                await asyncio.sleep(0.0005)
            prompt = await self._stream(prompt_tokens, 1)
            await asyncio.gather(*decodes)
        except BaseException:
            for d in decodes:
                d.cancel()
            await asyncio.gather(*decodes, return_exceptions=True)
            raise
        assert prompt.first_ns is not None  # _stream raises for a stream without a token
        steps, contexts = [], []
        for o in outs:
            reads = _reads(o.token_ns)
            if (k := mixed_step(reads, prompt.sent_ns, prompt.first_ns)) is not None:
                steps.append((reads[k][0] - reads[k - 1][0]) / 1e9)
                contexts.append(context + sum(n for _, n in reads[:k]))
        if not steps:
            raise ShortOverlap(f"mixed probe ({batch} streams of {output_tokens} tokens, {prompt_tokens}-token "
                               "prompt): no stream's reads marked the prompt's step (they had ended, or carried "
                               "several tokens at once)")
        return MixedSample(batch, statistics.fmean(contexts), prompt_tokens, statistics.median(steps))


def seats_seen(reads: list[tuple[float, float]], batch: int) -> int | None:
    """The seat count from the (running, waiting) gauges read while `batch` streams sent together ran: the most
    running at once, where a read shows others waiting beside that many (the server held streams back: it
    had no seat for them; a KV pool that binds first gives the smaller count, the one a run meets); `batch`
    when that many ran at once (the seats are at least that); None when the reads say neither (they missed
    the peak). Waiting beside fewer running is no proof: a step budget admits a large batch over two steps."""
    most = max((r for r, _ in reads), default=0.0)
    if any(w > 0 and r == most for r, w in reads):
        return int(most)
    return batch if most >= batch else None


def mixed_step(reads: list[tuple[int, int]], sent_ns: int, first_ns: int) -> int | None:
    """The index k of the decode stream's read that ends the mixed step (the step began at read k - 1), given
    its reads (_reads) and the prompt's send and first-token stamps (ns); None where no read times it.

    Between the prompt's send and its first token the stream sees the end of the step the prompt arrived in,
    perhaps a decode step more (a prompt admitted a step late), then the mixed step, which runs the prompt's
    compute with the decodes: the longest of them. The read ending it lies near the prompt's first token, on
    either side (the server writes the streams' chunks in its own order, the client reads its sockets in
    another: on the simulator the decode's read came 0.1-0.8 ms before the prompt's, and the next decode
    step's read 0.8-2 ms after; "the read nearest the first token" picked that next read in about one probe
    of ten, a 1.5 ms "mixed step" that wrecked the fit). So the gaps ending within [send, first token +
    half the prompt's TTFT] are candidates (the mixed step is at most that TTFT, so a later decode gap in
    the window is shorter than it) and the longest wins. It is refused when its read carried several
    tokens (the client read late: the gap spans more than the step) or lies further from the first token
    than half the gap (no read of this stream lines up with the prompt's token: the stream had ended).
    """
    end = first_ns + (first_ns - sent_ns) // 2
    ks = [k for k in range(1, len(reads)) if sent_ns <= reads[k][0] <= end]
    if not ks:
        return None
    k = max(ks, key=lambda i: reads[i][0] - reads[i - 1][0])
    gap = reads[k][0] - reads[k - 1][0]
    if reads[k][1] > 1 or abs(reads[k][0] - first_ns) * 2 > gap:
        return None
    return k


def token_gaps(token_ns: list[int], lo: int, hi: int) -> list[float]:
    """The gap before each token stamped within [lo, hi] (ns), after the first read there. Tokens that came in
    one read share its stamp: each is given the time since the read before / how many it carried. (vLLM's
    API server, when behind its engine, writes several tokens' events at once: counted as gaps of 0 and one
    long one, they pulled a trimmed mean down, and a round's probe could read 0 ns a step.)"""
    reads = _reads([t for t in token_ns if lo <= t <= hi])
    return [(b - a) / n for (a, _), (b, n) in zip(reads, reads[1:]) for _ in range(n)]


def _reads(token_ns: list[int]) -> list[tuple[int, int]]:
    """(stamp, tokens) per read: tokens that came in one read share its stamp."""
    return [(t, len(list(g))) for t, g in groupby(token_ns)]
