"""The simulator's aiohttp application: one serving path shared by every API surface.

Per request: stamp arrival, parse (surface), pick the request's fault, submit to the backend
(fixed timer or engine), then for each chunk of `tokens_per_chunk` tokens: build its bytes,
wait until its last token is due, read the clock (the token's send time), write. Finally the
truth row and the metrics. Surfaces (openai_api.py; native_apis.py for Ollama and llama.cpp) only parse
requests and format bytes.
"""
from __future__ import annotations

import socket
import struct
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable

import orjson
from aiohttp import web

from loadgen.sim import structured
from loadgen.sim.clock import sleep_until_ns
from loadgen.sim.faults import FaultPlan
from loadgen.sim.generation import Generation
from loadgen.sim.metrics import SimMetrics
from loadgen.sim.truth import TruthWriter, make_row

DEFAULT_MAX_TOKENS = 16   # a request that names no max_tokens / num_predict / n_predict, on every surface


class BadRequest(Exception):
    pass


@dataclass
class Parsed:
    prompt: list  # the prompt's tokens: words (tokenizer.words), or ids if sent as ids
    max_tokens: int
    stream: bool
    model: str
    include_usage: bool = False
    extra: dict[str, Any] = field(default_factory=dict)
    priority: int = 0   # the body's `priority` (OpenAI surfaces; vLLM's default 0)


@dataclass
class Context:
    request_id: str
    parsed: Parsed
    created_s: int
    gen: Generation | None = None


class Surface:
    # Subclasses: how an API's requests are read and its responses written.
    endpoint = ""
    content_type = "text/event-stream"

    def parse(self, body: Any, sim: "Sim") -> Parsed:
        raise NotImplementedError

    def opening_bytes(self, ctx: Context) -> bytes:  # sent as the response starts, before any token
        return b""

    def first_bytes(self, ctx: Context) -> bytes:  # sent with the first token
        return b""

    def token_bytes(self, ctx: Context, start: int, end: int) -> bytes:
        raise NotImplementedError

    def final_bytes(self, ctx: Context, sim: "Sim", token_ns: list[int]) -> bytes:  # after the last token
        raise NotImplementedError

    def full_response(self, ctx: Context, sim: "Sim", token_ns: list[int]) -> dict:
        raise NotImplementedError

    def malformed_bytes(self) -> bytes:
        return b'data: {"id": "malformed", "choices": [{"text": "tok \n\n'

    def error_body(self, status: int, message: str) -> dict:
        kind = {400: "BadRequestError", 404: "NotFoundError", 429: "RateLimitError", 500: "InternalServerError",
                503: "ServiceUnavailableError"}.get(status, "Error")
        return {"object": "error", "message": message, "type": kind, "param": None, "code": status}


def server_timings(gen: Generation, token_ns: list[int]) -> dict[str, float]:
    # vLLM's per-request metrics (ms), real elapsed time
    first, last = token_ns[0], token_ns[-1]
    sched = gen.scheduled_ns if gen.scheduled_ns is not None else gen.arrival_ns
    gen_ms = (last - first) / 1e6
    n = len(token_ns)
    return {"queue_time_ms": (sched - gen.arrival_ns) / 1e6,
            "time_to_first_token_ms": (first - sched) / 1e6,
            "generation_time_ms": gen_ms,
            "mean_itl_ms": gen_ms / (n - 1) if n > 1 else 0.0,
            "tokens_per_second": (n - 1) / (gen_ms / 1e3) if gen_ms > 0 else 0.0}


class Sim:
    def __init__(self, *, backend, model: str, mode: str, speed: float, faults: FaultPlan,
                 truth: TruthWriter | None, tokens_per_chunk: int, per_request_metrics: bool,
                 max_model_len: int):
        self.backend = backend  # .submit(request_id, arrival_ns, prompt, max_tokens) -> Generation
        self.model, self.mode, self.speed = model, mode, speed
        self.faults, self.truth = faults, truth
        self.tokens_per_chunk = tokens_per_chunk
        self.per_request_metrics = per_request_metrics
        self.max_model_len = max_model_len
        self.emulate = "vllm"  # vllm | llamacpp: the shapes of sim/tokenize_api.py (--emulate)
        self.chat_template = "none"  # none | sim: how chat messages become the prompt (--chat-template)
        self.reasoning_tokens = 0    # chat: the first R output tokens are reasoning (--reasoning-tokens)
        self.reasoning_field = "reasoning_content"  # or "reasoning" (--reasoning-field)
        self.tool_calls = False      # chat: the answer streams as tool_calls pieces (--tool-calls)
        self.ignore_disconnect = False  # a request whose client went away generates on (--ignore-disconnect)
        self.invalid_json_share = 0.0  # structured replies drawn invalid (--invalid-json-share, structured.py)
        self.tool_call_share = 1.0     # tool_choice auto: replies that call a tool (--tool-call-share, structured.py)
        self.embedding_dim = 8       # /v1/embeddings: floats per vector (--embedding-dim, pooling_apis.py)
        self.metrics = SimMetrics(model, speed, max_model_len)
        self.t0_ns = time.monotonic_ns()
        self.in_flight: dict[int, Callable[[], dict]] = {}  # rows for requests not yet finished
        self.process_index = 0  # which of `--processes N` this is (truth column sim_process)
        # --lora-modules: the adapter names served beside `model`; when any is given, a request naming
        # another model is refused with vLLM's 404 (without, any name is accepted and echoed)
        self.lora_names: tuple[str, ...] = ()

    def served(self, model: str) -> bool:
        return not self.lora_names or model == self.model or model in self.lora_names

    def record(self, row: dict) -> None:
        row["sim_process"] = self.process_index
        if self.truth is not None:
            self.truth.add(row)
        self.metrics.observe_request(row)
        for lat in row["lateness_ns"]:
            self.metrics.lateness.observe(lat / 1e9)

    def flush_in_flight(self) -> None:
        for make in list(self.in_flight.values()):
            self.record(make())
        self.in_flight.clear()

    async def serve(self, request: web.Request, surface: Surface) -> web.StreamResponse:
        arrival_ns = time.monotonic_ns()
        request_id = request.headers.get("X-Request-Id") or f"sim-{uuid.uuid4().hex}"
        headers = {"X-Request-Id": request_id}
        try:
            body = orjson.loads(await request.read())
            parsed = surface.parse(body, self)
        except (orjson.JSONDecodeError, BadRequest, ValueError, TypeError) as e:
            self.record(make_row(request_id=request_id, arrival_ns=arrival_ns, scheduled_ns=None,
                                 first_token_ns=None, finish_ns=time.monotonic_ns(), preemptions=0, stall_ns=0,
                                 token_ns=[], lateness_ns=[], speed=self.speed, mode=self.mode,
                                 endpoint=surface.endpoint, http_status=400, outcome="http_error", fault="",
                                 prompt_tokens=0))
            return web.json_response(surface.error_body(400, str(e) or "bad request"), status=400, headers=headers)
        ctx = Context(request_id, parsed, int(time.time()))
        if "structure" in parsed.extra:  # tools / response_format: the reply and its validity (structured.py)
            parsed.extra["reply"] = structured.plan(parsed.extra.pop("structure"), request_id, self.invalid_json_share,
                                                    self.tool_call_share)
        fault = self.faults.for_request(request_id)
        label = fault.label() if fault else ""
        row_args = dict(request_id=request_id, arrival_ns=arrival_ns, speed=self.speed, mode=self.mode,
                        endpoint=surface.endpoint, fault=label, prompt_tokens=len(parsed.prompt),
                        model=parsed.model, priority=parsed.priority,
                        tool_call_ids=parsed.extra.get("tool_results"))
        if not self.served(parsed.model):  # vLLM's answer to a model it does not serve
            self.record(make_row(scheduled_ns=None, first_token_ns=None, finish_ns=time.monotonic_ns(),
                                 preemptions=0, stall_ns=0, token_ns=[], lateness_ns=[],
                                 http_status=404, outcome="http_error", **row_args))
            served = ", ".join((self.model, *self.lora_names))
            return web.json_response(surface.error_body(404, f"The model `{parsed.model}` does not exist. "
                                                             f"Valid aliases: {served}."),
                                     status=404, headers=headers)
        if fault and fault.kind.startswith("http"):
            self.record(make_row(scheduled_ns=None, first_token_ns=None, finish_ns=time.monotonic_ns(),
                                 preemptions=0, stall_ns=0, token_ns=[], lateness_ns=[],
                                 http_status=fault.status, outcome="http_error", **row_args))
            return web.json_response(surface.error_body(fault.status, f"injected fault {label}"),
                                     status=fault.status, headers=headers)
        try:
            gen = self.backend.submit(request_id, arrival_ns, parsed.prompt, parsed.max_tokens, parsed.priority)
        except ValueError as e:
            self.record(make_row(scheduled_ns=None, first_token_ns=None, finish_ns=time.monotonic_ns(),
                                 preemptions=0, stall_ns=0, token_ns=[], lateness_ns=[],
                                 http_status=400, outcome="http_error", **row_args))
            return web.json_response(surface.error_body(400, str(e)), status=400, headers=headers)
        ctx.gen = gen
        pooled = bool(parsed.extra.get("pooling"))  # embeddings, rerank: prefill only (sim/pooling_apis.py)
        gen.pooling = pooled
        token_ns: list[int] = []
        lateness_ns: list[int] = []
        state = {"outcome": "interrupted", "finish_ns": None}

        def make() -> dict:
            return make_row(scheduled_ns=gen.scheduled_ns,
                            # a pooled answer's one stamp is its prefill's end: no output token is sent
                            first_token_ns=token_ns[0] if token_ns else None,
                            finish_ns=state["finish_ns"], preemptions=gen.preemptions,
                            stall_ns=gen.stall_ns, token_ns=[] if pooled else token_ns, lateness_ns=lateness_ns,
                            http_status=200, outcome=state["outcome"],
                            cached_tokens=gen.cached_tokens, reasoning=parsed.extra.get("reasoning", 0),
                            image_tokens=parsed.extra.get("image_tokens", 0),
                            reply_valid=_reply_valid(parsed, token_ns, state["outcome"]),
                            **{**row_args, "fault": ";".join(x for x in (label, "stall" if gen.stalled else "") if x)})

        key = id(ctx)
        self.in_flight[key] = make
        state["record_now"] = lambda: self.in_flight.pop(key, None) is not None and self.record(make())
        try:
            if fault and fault.kind == "slow_headers":
                await sleep_until_ns(arrival_ns + fault.delay_ns)
            if parsed.stream:
                resp = await self._stream(request, surface, ctx, fault, headers, token_ns, lateness_ns, state)
            else:
                resp = await self._whole(request, surface, ctx, fault, headers, token_ns, lateness_ns, state)
            return resp
        except ConnectionResetError:  # the client went away; aiohttp ignores a response it cannot send
            state["outcome"] = "client_gone"
            state["finish_ns"] = time.monotonic_ns()
            return web.Response(headers=headers)
        finally:
            if not (self.ignore_disconnect and state["outcome"] == "client_gone"):
                gen.cancel()   # (ignored: the engine keeps the request to its end, holding its slot)
            if self.in_flight.pop(key, None) is not None:
                self.record(make())

    async def _stream(self, request, surface, ctx, fault, headers, token_ns, lateness_ns, state):
        gen, n_max, k = ctx.gen, ctx.parsed.max_tokens, self.tokens_per_chunk
        resp = web.StreamResponse(headers={**headers, "Content-Type": surface.content_type,
                                           "Cache-Control": "no-cache"})
        await resp.prepare(request)
        opening = surface.opening_bytes(ctx)
        if opening:
            await resp.write(opening)
        reset_at = fault.after_tokens if fault and fault.kind == "reset_after" else None
        malformed_at = n_max // 2 if fault and fault.kind == "malformed" else None
        i = 0
        while i < n_max:
            if reset_at is not None and i >= reset_at:
                return self._reset(request, state)
            end = min(i + k, n_max)
            if reset_at is not None:
                end = min(end, max(reset_at, i + 1))
            data = surface.token_bytes(ctx, i, end)
            if i == 0:
                data = surface.first_bytes(ctx) + data
            if malformed_at is not None and i <= malformed_at < end:
                data = surface.malformed_bytes() + data
            await gen.wait_for(end)
            if len(gen.due_ns) < end:  # cancelled underneath us
                break
            t = time.monotonic_ns()
            for j in range(i, end):
                token_ns.append(t)
                lateness_ns.append(t - gen.due_ns[j])
            await resp.write(data)
            i = end
        if reset_at is not None and i >= reset_at:
            return self._reset(request, state)
        state["finish_ns"] = token_ns[-1] if token_ns else time.monotonic_ns()
        state["outcome"] = "ok"
        state["record_now"]()  # before the last bytes go out: a client that saw them finds the row
        await resp.write(surface.final_bytes(ctx, self, token_ns))  # finish/usage events, [DONE]
        await resp.write_eof()
        return resp

    async def _whole(self, request, surface, ctx, fault, headers, token_ns, lateness_ns, state):
        gen, n_max = ctx.gen, ctx.parsed.max_tokens
        reset = fault is not None and fault.kind == "reset_after"
        while len(token_ns) < n_max:
            await gen.wait_for(len(token_ns) + 1)
            if len(gen.due_ns) <= len(token_ns):
                break
            t = time.monotonic_ns()
            for j in range(len(token_ns), len(gen.due_ns)):
                token_ns.append(t)
                lateness_ns.append(t - gen.due_ns[j])
        if reset:
            return self._reset(request, state)
        body = orjson.dumps(surface.full_response(ctx, self, token_ns))
        if fault is not None and fault.kind == "malformed":
            body = body[: len(body) // 2]
        state["finish_ns"] = time.monotonic_ns()
        state["outcome"] = "ok"
        return web.Response(body=body, headers={**headers, "Content-Type": "application/json"})

    def _reset(self, request: web.Request, state: dict) -> web.StreamResponse:
        transport = request.transport
        if transport is not None:
            sock = transport.get_extra_info("socket")
            if sock is not None:  # SO_LINGER 0: close sends RST, the client sees a reset
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            transport.abort()
        state["finish_ns"] = time.monotonic_ns()
        state["outcome"] = "reset"
        return web.Response()  # never sent: the transport is gone (aiohttp ignores the error)


def _reply_valid(parsed: Parsed, token_ns: list[int], outcome: str) -> bool | None:
    # the truth's reply_valid: None without a structured reply; the answer tokens are those after reasoning
    reply = parsed.extra.get("reply")
    if reply is None:
        return None
    return reply.valid(len(token_ns) - min(parsed.extra.get("reasoning", 0), len(token_ns)), outcome == "ok")


def json_response(data: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(data), status=status, content_type="application/json")
