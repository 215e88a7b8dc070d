"""`loadgen sim`: parse flags into a simulator, run it until SIGTERM/SIGINT. Exit 2 on bad flags."""
from __future__ import annotations

import argparse
import sys

from loadgen.sim.faults import __doc__ as FAULTS_DOC
from loadgen.sim.faults import parse_faults
from loadgen.config.units import parse_duration_ns
from loadgen.errors import ExitCode

EPILOG = """\
token rule: a token is a maximal run of non-whitespace characters; output token i is "tok ".

--faults SPEC (comma-separated kind=value parts):
""" + FAULTS_DOC.split("SPEC is a comma-separated list of `kind=value` parts:", 1)[1].split("Which request", 1)[0] + """
examples:
  loadgen sim --mode fixed --ttft 50ms --itl 10ms --port 8000 --truth truth.jsonl
  loadgen sim --profile h100-sxm --speed 0.1 --max-num-batched-tokens 512
  loadgen sim --profile tiny --kv-capacity-tokens 4096 --faults 'http500=0.05,reset_after=5:0.05,stall=2s@10s'
"""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # usage errors: a clear line, exit 2, no traceback
        self.print_usage(sys.stderr)
        print(f"loadgen sim: error: {message}", file=sys.stderr)
        raise SystemExit(ExitCode.USAGE)


def _positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be >= 1")
    return v


def _duration(text: str) -> int:
    try:
        return parse_duration_ns(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _speed(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not v > 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be > 0")
    return v


def _collect(errors: list[str] | None, flag: str, convert):
    # With an errors list, a bad value is recorded (and the parse goes on) so that every bad flag is
    # reported at once; without one, argparse reports the first and exits.
    if errors is None:
        return convert

    def wrapped(text: str):
        try:
            return convert(text)
        except (argparse.ArgumentTypeError, ValueError) as e:
            errors.append(f"{flag}: {e}")
            return None
    wrapped.__name__ = getattr(convert, "__name__", flag)
    return wrapped


def build_parser(errors: list[str] | None = None) -> argparse.ArgumentParser:
    from loadgen.sim.profiles import shipped_profiles

    epilog = f"shipped profiles: {', '.join(shipped_profiles())}\n" + EPILOG
    def c(flag: str, convert):
        return _collect(errors, flag, convert)

    p = _Parser(prog="loadgen sim", description="Simulated LLM inference server (OpenAI, Ollama, "
                "llama.cpp surfaces) with ground truth.", epilog=epilog,
                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mode", choices=["fixed", "engine"], default="engine",
                   help="fixed: constant TTFT/ITL, unlimited concurrency; engine: continuous batching (default)")
    p.add_argument("--ttft", type=c("--ttft", _duration), default=50_000_000, metavar="DURATION",
                   help="fixed mode TTFT (default 50ms; divided by --speed)")
    p.add_argument("--itl", type=c("--itl", _duration), default=10_000_000, metavar="DURATION",
                   help="fixed mode ITL (default 10ms; divided by --speed)")
    p.add_argument("--profile", default="tiny", metavar="NAME|FILE",
                   help="engine profile: a shipped name or a TOML file (default tiny)")
    p.add_argument("--speed", type=c("--speed", _speed), default=1.0, metavar="X",
                   help="time dilation: real time = profile time / X (default 1)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=c("--port", int), default=8000, help="0 = a free port (printed on stdout)")
    p.add_argument("--max-num-seqs", type=c("--max-num-seqs", _positive_int), default=None, metavar="N")
    p.add_argument("--max-num-batched-tokens", type=c("--max-num-batched-tokens", _positive_int), default=None,
                   metavar="N",
                   help="per-step token budget (chunked prefill)")
    p.add_argument("--kv-capacity-tokens", type=c("--kv-capacity-tokens", _positive_int), default=None, metavar="N",
                   help="KV pool size in tokens (blocks of 16)")
    p.add_argument("--prefix-caching", action="store_true")
    p.add_argument("--tokens-per-chunk", type=c("--tokens-per-chunk", _positive_int), default=1, metavar="K",
                   help="tokens per streamed chunk (default 1)")
    p.add_argument("--per-request-metrics", action="store_true",
                   help="vLLM's `metrics` object in the final usage chunk")
    p.add_argument("--truth", default=None, metavar="FILE", help="ground truth per request (.jsonl or .parquet)")
    p.add_argument("--step-log", default=None, metavar="FILE",
                   help="engine mode: one JSON line per engine step (times, tokens, batch, KV blocks)")
    p.add_argument("--faults", default="", metavar="SPEC", help="inject faults (see below)")
    p.add_argument("--seed", type=c("--seed", int), default=0, metavar="N")
    p.add_argument("--model", default=None, help="model name to report (default: the profile's)")
    p.add_argument("--lora-modules", nargs="+", default=(), metavar="NAME[=PATH]",
                   help="adapter names served beside --model (the path, as vLLM takes it, is ignored): listed in "
                        "/v1/models with the model as parent; with any given, a request naming another model "
                        "gets vLLM's 404 (without, any model name is accepted and echoed)")
    p.add_argument("--scheduling-policy", choices=["fcfs", "priority"], default="fcfs",
                   help="engine mode: the waiting queue's order, as vLLM's flag: fcfs (default), or priority: "
                        "by (request priority, arrival), lower first, preempting the largest (priority, "
                        "arrival) (sim/engine.py); the body's `priority` is accepted either way")
    p.add_argument("--max-model-len", type=c("--max-model-len", _positive_int), default=None, metavar="N",
                   help="context limit in tokens (prompt + max_tokens), published in /v1/models and /props "
                        "and enforced with HTTP 400 (default: the profile's; fixed mode: 1048576)")
    p.add_argument("--processes", type=c("--processes", _positive_int), default=1, metavar="N",
                   help="fixed mode: N processes on one port (SO_REUSEPORT), so that capacity tests are not "
                        "bound by one simulator core; one truth file; /metrics per process (sim/multi.py; "
                        "default 1)")
    p.add_argument("--emulate", choices=["vllm", "llamacpp"], default="vllm",
                   help="whose shapes the tokenize endpoints, /props, /v1/models and the OpenAI stream's last "
                        "chunk take (sim/tokenize_api.py; default vllm)")
    p.add_argument("--chat-template", choices=["none", "sim"], default="none",
                   help="how chat messages become the prompt: none (their contents, no extra tokens) or sim "
                        "(a role marker and an end marker per message and a generation prompt, 2 tokens a "
                        "message + 2, as a real template adds; sim/tokenizer.py; default none)")
    p.add_argument("--reasoning-tokens", type=c("--reasoning-tokens", int), default=0, metavar="R",
                   help="chat, /v1/responses, /v1/messages: the first R output tokens of every request stream as "
                        "reasoning (chat: reasoning deltas; responses: response.reasoning_text.delta; messages: "
                        "a thinking block), the rest as the answer; the usage counts them where the API has a "
                        "field for it (default 0)")
    p.add_argument("--reasoning-field", choices=["reasoning_content", "reasoning"], default="reasoning_content",
                   help="the delta field reasoning streams in: reasoning_content, or reasoning as vLLM >= 0.19.1 "
                        "names it (default reasoning_content)")
    p.add_argument("--ignore-disconnect", action="store_true",
                   help="keep generating a request whose client closed its connection, to its end (a server "
                        "that does not abort on disconnect: its slot stays taken)")
    p.add_argument("--tool-calls", action="store_true",
                   help="chat: the answer streams as delta.tool_calls pieces (one call, its arguments), not "
                        "content; finish_reason tool_calls")
    p.add_argument("--tool-call-share", type=c("--tool-call-share", float), default=1.0, metavar="P",
                   help="a request that sends tools under tool_choice auto (or none sent) is answered with a "
                        "tool call with probability P, else in plain text (seeded by its request id; "
                        "sim/structured.py; default 1)")
    p.add_argument("--embedding-dim", type=c("--embedding-dim", int), default=8, metavar="D",
                   help="/v1/embeddings: floats in each embedding vector (deterministic, from the input's text; "
                        "a body's `dimensions` overrides it; sim/pooling_apis.py; default 8)")
    p.add_argument("--invalid-json-share", type=c("--invalid-json-share", float), default=0.0, metavar="P",
                   help="a request that sends tools or response_format gets an invalid reply with probability P "
                        "(seeded by its request id; the truth's reply_valid says which; sim/structured.py; "
                        "default 0)")
    return p


def main(argv: list[str]) -> int:
    errors: list[str] = []
    args = build_parser(errors).parse_args(argv)
    faults = None
    try:
        faults = parse_faults(args.faults, args.seed or 0)
    except ValueError as e:
        errors.append(str(e))
    if args.port is not None and not 0 <= args.port <= 65535:
        errors.append(f"--port {args.port} out of range")
    if args.scheduling_policy == "priority" and args.mode == "fixed":
        errors.append("--scheduling-policy priority needs --mode engine (fixed mode has no queue to order)")
    lora = [n.partition("=")[0] for n in args.lora_modules]
    if any(not n for n in lora):
        errors.append(f"--lora-modules: each must be NAME or NAME=PATH, got {' '.join(args.lora_modules)!r}")
    if args.processes is not None and args.processes > 1 and args.mode != "fixed":
        # engine mode's batch is one shared state: N processes would be N independent engines
        errors.append(f"--processes {args.processes} needs --mode fixed (engine mode is one shared batch)")
    if errors:  # every bad flag at once
        for e in errors:
            print(f"loadgen sim: error: {e}", file=sys.stderr)
        return ExitCode.USAGE
    from loadgen.sim.multi import child_config

    child = child_config()
    if args.processes > 1 and child is None:
        return _run_parent(argv, args)
    try:
        sim, extra_routes = _make_sim(args, faults, child)
    except (OSError, ValueError) as e:
        return _bad_file(e)
    from loadgen.sim.app import build_app, serve_forever
    from loadgen.sim.clock import new_event_loop

    loop = new_event_loop()
    try:
        app = build_app(sim, extra_routes)
        port = child["port"] if child else args.port
        return loop.run_until_complete(serve_forever(sim, app, args.host, port, reuse_port=child is not None))
    except OSError as e:
        print(f"loadgen sim: error: cannot listen on {args.host}:{args.port}: {e}", file=sys.stderr)
        return ExitCode.USAGE
    finally:
        loop.close()


def _bad_file(e: OSError | ValueError) -> int:
    # a truth / profile / step-log file that cannot be opened, or a bad name for one: exit 2, no traceback
    print(f"loadgen sim: error: {f'{e.filename}: {e.strerror}' if isinstance(e, OSError) else e}", file=sys.stderr)
    return ExitCode.USAGE


def _run_parent(argv: list[str], args) -> int:
    # `--processes N`, N > 1: hold the port, start the children (sim/multi.py), finish the one truth file.
    import asyncio

    from loadgen.sim.multi import reserve_port, run_parent
    from loadgen.sim.truth import finish_shared, start_shared

    try:
        if args.truth:
            start_shared(args.truth)
    except (OSError, ValueError) as e:
        return _bad_file(e)
    try:
        sock = reserve_port(args.host, args.port)
    except OSError as e:
        print(f"loadgen sim: error: cannot listen on {args.host}:{args.port}: {e}", file=sys.stderr)
        return ExitCode.USAGE
    try:
        return asyncio.run(run_parent(argv, args.host, sock.getsockname()[1], args.processes))
    finally:
        sock.close()
        if args.truth:
            finish_shared(args.truth)


def _make_sim(args, faults, child=None):
    import time
    from dataclasses import replace

    from loadgen.sim.server import Sim
    from loadgen.sim.truth import TruthWriter

    truth = TruthWriter(args.truth, shared=child is not None) if args.truth else None
    t0_ns = child["t0_ns"] if child else time.monotonic_ns()
    if args.mode == "fixed":
        from loadgen.sim.generation import FixedBackend

        backend = FixedBackend(args.ttft, args.itl, args.speed, faults.stalls, t0_ns)
        model, max_model_len = args.model or "loadgen-sim-fixed", args.max_model_len or 1 << 20
        backend.max_model_len = args.max_model_len
    else:
        from loadgen.sim.driver import EngineBackend
        from loadgen.sim.engine import EngineConfig
        from loadgen.sim.profiles import load_profile

        profile = load_profile(args.profile)
        if args.max_model_len:
            profile = replace(profile, max_model_len=args.max_model_len)
        cfg = EngineConfig.from_profile(profile, max_num_seqs=args.max_num_seqs,
                                        max_num_batched_tokens=args.max_num_batched_tokens,
                                        kv_capacity_tokens=args.kv_capacity_tokens,
                                        prefix_caching=args.prefix_caching, policy=args.scheduling_policy)
        backend = EngineBackend(profile, cfg, args.speed, faults.stalls, t0_ns)
        if args.step_log:
            try:
                backend.step_log = open(args.step_log, "wb")  # noqa: SIM115 (closed at exit)
            except OSError as e:
                raise ValueError(f"--step-log {args.step_log}: {e.strerror}") from None
        model, max_model_len = args.model or profile.model_name, profile.max_model_len
    sim = Sim(backend=backend, model=model, mode=args.mode, speed=args.speed, faults=faults, truth=truth,
              tokens_per_chunk=args.tokens_per_chunk, per_request_metrics=args.per_request_metrics,
              max_model_len=max_model_len)
    sim.t0_ns = t0_ns
    sim.process_index = child["index"] if child else 0
    sim.emulate = args.emulate
    sim.chat_template = args.chat_template
    if args.reasoning_tokens < 0:
        raise ValueError(f"--reasoning-tokens {args.reasoning_tokens}: must be >= 0")
    sim.reasoning_tokens, sim.reasoning_field = args.reasoning_tokens, args.reasoning_field
    sim.tool_calls = args.tool_calls
    sim.ignore_disconnect = args.ignore_disconnect
    sim.lora_names = tuple(n.partition("=")[0] for n in args.lora_modules)
    if not 0 <= args.invalid_json_share <= 1:
        raise ValueError(f"--invalid-json-share {args.invalid_json_share}: must be a share in [0, 1]")
    sim.invalid_json_share = args.invalid_json_share
    if not 0 <= args.tool_call_share <= 1:
        raise ValueError(f"--tool-call-share {args.tool_call_share}: must be a share in [0, 1]")
    sim.tool_call_share = args.tool_call_share
    if not 1 <= args.embedding_dim <= 65536:
        raise ValueError(f"--embedding-dim {args.embedding_dim}: must be in 1..65536")
    sim.embedding_dim = args.embedding_dim
    backend.metrics = sim.metrics
    from loadgen.sim.native_apis import routes as native_routes

    return sim, native_routes()
