"""Routes of the simulator and its process life cycle: bind, print the banner, serve until
SIGTERM/SIGINT, then write the truth of every request (finished or not) and return 0."""
from __future__ import annotations

import asyncio
import signal
import sys

from aiohttp import web

from loadgen.errors import ExitCode
from loadgen.sim.truth import FLUSH_EVERY_S
from loadgen.sim.clock import stop_ticker
from loadgen.sim.event_apis import Messages, Responses
from loadgen.sim.openai_api import ChatCompletions, Completions
from loadgen.sim.pooling_apis import Embeddings, Rerank
from loadgen.sim.server import Sim, json_response
from loadgen.sim.tokenize_api import routes as tokenize_routes


def build_app(sim: Sim, extra_routes=()) -> web.Application:
    app = web.Application(client_max_size=64 * 1024 * 1024)
    completions, chat, responses, messages = Completions(), ChatCompletions(), Responses(), Messages()
    embeddings, rerank = Embeddings(), Rerank()

    async def h_completions(request):
        return await sim.serve(request, completions)

    async def h_chat(request):
        return await sim.serve(request, chat)

    async def h_responses(request):
        return await sim.serve(request, responses)

    async def h_messages(request):
        return await sim.serve(request, messages)

    async def h_embeddings(request):
        return await sim.serve(request, embeddings)

    async def h_rerank(request):
        return await sim.serve(request, rerank)

    async def h_health(request):
        return web.Response(text="")

    async def h_models(request):
        llamacpp = getattr(sim, "emulate", "vllm") == "llamacpp"
        # vLLM publishes max_model_len per model; llama-server its whole context (all slots) as meta.n_ctx
        engine = getattr(sim.backend, "engine", None)
        slots = engine.cfg.max_num_seqs if engine is not None else 1
        limit = {"meta": {"n_ctx": sim.max_model_len * slots}} if llamacpp else {"max_model_len": sim.max_model_len}
        head = {"object": "model", "created": sim.t0_ns // 10**9, "owned_by": "llamacpp" if llamacpp else "loadgen-sim"}
        # --lora-modules: each adapter after the base model, its parent the base model (as vLLM lists them)
        return json_response({"object": "list", "data": [
            {"id": sim.model, **head, "root": sim.model, "parent": None, **limit},
            *({"id": name, **head, "root": name, "parent": sim.model, **limit} for name in sim.lora_names)]})

    async def h_ollama_tags(request):  # Ollama's model list
        return json_response({"models": [{"name": sim.model, "model": sim.model, "size": 0,
                                          "details": {"family": "loadgen-sim"}}]})

    async def h_metrics(request):
        for k, v in sim.backend.state().items():
            setattr(sim.metrics, k, v)
        return web.Response(text=sim.metrics.render(), content_type="text/plain", charset="utf-8",
                            headers={"X-Request-Id": request.headers.get("X-Request-Id", "")})

    app.router.add_post("/v1/completions", h_completions)
    app.router.add_post("/v1/chat/completions", h_chat)
    app.router.add_post("/v1/responses", h_responses)
    app.router.add_post("/v1/messages", h_messages)
    app.router.add_post("/v1/embeddings", h_embeddings)
    app.router.add_post("/v1/rerank", h_rerank)
    app.router.add_get("/health", h_health)
    app.router.add_get("/v1/models", h_models)
    app.router.add_get("/metrics", h_metrics)
    app.router.add_get("/api/tags", h_ollama_tags)
    for method, path, make_handler in tokenize_routes(getattr(sim, "emulate", "vllm")):
        app.router.add_route(method, path, make_handler(sim))
    for method, path, make_handler in extra_routes:
        app.router.add_route(method, path, make_handler(sim))
    return app


async def serve_forever(sim: Sim, app: web.Application, host: str, port: int, reuse_port: bool = False) -> int:
    # reuse_port: one of `--processes N` (multi.py): every process listens on the same port (SO_REUSEPORT)
    # and the kernel spreads the connections over them
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, host, port, reuse_address=True, reuse_port=reuse_port or None)
    await site.start()
    bound = site._server.sockets[0].getsockname()  # type: ignore[union-attr]
    engine_task = loop.create_task(sim.backend.run())
    flusher = loop.create_task(_flush_truth_periodically(sim))
    print(f"listening on http://{host}:{bound[1]}", flush=True)
    stop_wait = loop.create_task(stop.wait())
    pending = {stop_wait, engine_task}
    while stop_wait in pending:  # the backend's task may end at once (fixed mode); an error stops us
        done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        if engine_task in done and engine_task.exception() is not None:
            print(f"loadgen sim: engine failed: {engine_task.exception()!r}", file=sys.stderr)
            break
    sim.flush_in_flight()
    if sim.truth is not None:
        sim.truth.close()
    sim.backend.close()
    engine_task.cancel()
    stop_wait.cancel()
    flusher.cancel()
    await stop_ticker()
    try:
        await asyncio.wait_for(runner.cleanup(), 2.0)
    except (asyncio.TimeoutError, Exception):
        pass
    return ExitCode.OK


async def _flush_truth_periodically(sim: Sim) -> None:
    while True:
        await asyncio.sleep(FLUSH_EVERY_S)
        if sim.truth is not None:
            sim.truth.flush()
        log = getattr(sim.backend, "step_log", None)
        if log is not None:
            log.flush()
