"""The optional sections of a workload ([trace], [[mix]], [prefix], [session]), the run options no
workload file holds (--url, --sim-args, --workers, ...), and the rules across sections. Each validates
itself through the Reader as sections.py's do, appending every problem it finds."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from loadgen.config.credentials import url_problems
from loadgen.config.kinds import INT64_MAX, is_file, is_number
from loadgen.config.lengths import DEFAULT_MAX, MAX_VALUE, Lengths
from loadgen.config.options import OPTIONS, POOLING_APIS, TRACE_FORMATS
from loadgen.config.runconfig import (IMAGE_FILLS, AbandonSpec, ImageSpec, MixClass, PrefixSpec, RunConfig,
                                      SessionSpec, TraceSpec)
from loadgen.config.sections import Reader
from loadgen.config.slo import split_slo_key
from loadgen.config.units import parse_duration_ns

MAX_WAIT_MS = 86_400_000   # [session] think_ms / tool_latency_ms, [abandon] after_ms: the longest wait, a day
MAX_TOOL_ROUNDS = 64        # [session] max_tool_rounds: tool-result requests in a row, at most
TOOL_LATENCY_MS = 200       # [session] tool_latency_ms when not given (an agentic session)
TOOL_RESULT_TOKENS = 64     # [session] tool_result_tokens when not given


def trace(r: Reader) -> TraceSpec | None:
    """[trace]: replay a trace file (its arrivals, and unless lengths = false its lengths)."""
    t = r.raw.get("trace")
    if not isinstance(t, dict):
        return None
    f = t.get("file")
    path = ""
    if f is None:
        r.bad("trace.file", "missing: a [trace] table (or --time-scale, --trace-format, --skip-bad-rows) "
              "needs a trace file: set trace.file or pass --trace FILE")
    elif not isinstance(f, str) or not f:
        r.bad("trace.file", f"must be a file name, got {f!r}")
    else:
        p = Path(f) if Path(f).is_absolute() else r.base_dir / f
        if not is_file(p):
            r.bad("trace.file", f"no such file {str(p)!r}")
        path = str(p)
    fmt = t.get("format", "")
    if fmt not in ("", *TRACE_FORMATS):
        r.bad("trace.format", f"must be one of {', '.join(TRACE_FORMATS)}, got {fmt!r}")
        fmt = ""
    ts = t.get("time_scale")
    if ts is not None and (not is_number(ts) or not 0 < ts < math.inf):
        r.bad("trace.time_scale", f"must be a number > 0, got {ts!r}")
        ts = None
    rate = r.rate("trace.rate", t["rate"]) if "rate" in t else None
    if ts is not None and rate is not None:
        r.bad("trace", "give time_scale or rate, not both")
    start_ns = 0
    if "start" in t:
        try:
            start_ns = parse_duration_ns(t["start"])
        except ValueError as e:
            r.bad("trace.start", str(e))
    limit = t.get("limit")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= INT64_MAX):
        r.bad("trace.limit", f"must be an integer >= 1 (at most {INT64_MAX}), got {limit!r}")
        limit = None
    skip = r.option("trace.skip_bad_rows")
    lengths = t.get("lengths", True)
    if not isinstance(lengths, bool):
        r.bad("trace.lengths", f"must be true or false, got {lengths!r}")
        lengths = True
    return TraceSpec(path, fmt, None if ts is None else float(ts), rate, start_ns, limit, skip, lengths)


MIX_KEYS = ("weight", "prompt", "output", "name", "model", "priority")
PRIORITY_MIN, PRIORITY_MAX = -(2**63), INT64_MAX   # the rows' int64 `priority` column holds any of them
# a class is named in --slo METRIC=BOUND@CLASS (config/slo.py) and in the reports' dotted summary paths
CLASS_NAME_FORBIDDEN = "@,=. "


def mix(r: Reader) -> tuple[MixClass, ...]:
    """[[mix]]: joint classes, each a weight and its prompt and output lengths, optionally its own model
    and priority (sent in each of its requests' bodies, plan/bodies.py)."""
    m = r.raw.get("mix")
    if m is None:
        return ()
    if not isinstance(m, list) or not m:
        r.bad("mix", "must be one or more [[mix]] tables")
        return ()
    classes, total, names = [], 0.0, set[str]()
    for i, c in enumerate(m):
        k = f"mix[{i}]"
        if not isinstance(c, dict):
            r.bad(k, "must be a table with weight, prompt, output")
            continue
        for extra in sorted(set(c) - set(MIX_KEYS)):
            r.bad(f"{k}.{extra}", f"unknown key (expected {', '.join(MIX_KEYS)})")
        w = c.get("weight")
        if not is_number(w) or not 0 < w < math.inf:
            r.bad(f"{k}.weight", f"must be a number > 0, got {w!r}")
            w = 1.0
        total += w
        name = _class_name(r, k, c.get("name", f"mix{i}"), names)
        # a pooling API generates nothing: a class gives no output length (config/pooling.py refuses one)
        pooling = r.api() in POOLING_APIS and c.get("output") is None
        output = Lengths(value=0) if pooling else r.lengths(f"{k}.output", c.get("output"))
        classes.append((float(w), r.lengths(f"{k}.prompt", c.get("prompt")), output, name,
                        _class_model(r, k, c.get("model")), _class_priority(r, k, c.get("priority"))))
    return tuple(MixClass(w / total, p, o, n, model, prio) for w, p, o, n, model, prio in classes)


def _class_name(r: Reader, k: str, name: Any, seen: set[str]) -> str:
    if not isinstance(name, str) or not name or any(ch in name for ch in CLASS_NAME_FORBIDDEN):
        r.bad(f"{k}.name", f"must be a non-empty string without spaces, '@', ',', '=' or '.' (a class is named "
              f"in --slo METRIC=BOUND@CLASS), got {name!r}")
        return k
    if name in seen:
        r.bad(f"{k}.name", f"{name!r} names another [[mix]] class too: each class needs its own name")
    seen.add(name)
    return name


def _class_model(r: Reader, k: str, model: Any) -> str | None:
    if model is not None and (not isinstance(model, str) or not model.strip()):
        r.bad(f"{k}.model", f"must be a non-empty string (a model the target serves, e.g. a LoRA adapter's "
              f"name), got {model!r}")
        return None
    return model


def _class_priority(r: Reader, k: str, prio: Any) -> int | None:
    if prio is None:
        return None
    if isinstance(prio, bool) or not isinstance(prio, int):
        r.bad(f"{k}.priority", f"must be an integer (vLLM: lower is served first), got {prio!r}")
        return None
    if not PRIORITY_MIN <= prio <= PRIORITY_MAX:
        r.bad(f"{k}.priority", f"must be an integer in [{PRIORITY_MIN}, {PRIORITY_MAX}], got {prio}")
        return None
    return prio


def prefix(r: Reader) -> PrefixSpec | None:
    """[prefix]: shared system prompts."""
    p = r.raw.get("prefix")
    if not isinstance(p, dict):
        return None  # absent, or reported as "must be a table"
    if "tokens" not in p:
        r.bad("prefix.tokens", "missing: the shared prefix's length in tokens")
    tokens = r.integer("prefix.tokens", 1, 1, maximum=MAX_VALUE) or 1
    groups = r.integer("prefix.groups", 1, 1) or 1
    fraction = p.get("fraction", 1.0)
    if not is_number(fraction) or not 0 <= fraction <= 1:
        r.bad("prefix.fraction", f"must be a number in [0, 1], got {fraction!r}")
        fraction = 1.0
    return PrefixSpec(tokens, groups, float(fraction))


def session(r: Reader) -> SessionSpec | None:
    """[session]: multi-turn conversations."""
    s = r.raw.get("session")
    if not isinstance(s, dict):
        return None
    turns = r.lengths("session.turns") if "turns" in s else None
    if turns is None:
        r.bad("session.turns", "missing: how many turns per conversation (e.g. 4 or a distribution)")
        turns = Lengths(value=1)
    think = _wait_ms(r, "session.think_ms", r.lengths("session.think_ms")) if "think_ms" in s else Lengths(value=1000)
    agentic = [k for k in ("max_tool_rounds", "tool_latency_ms", "tool_result_tokens") if k in s]
    if not agentic:
        return SessionSpec(turns, think)
    rounds = r.integer("session.max_tool_rounds", None, 1, maximum=MAX_TOOL_ROUNDS) if "max_tool_rounds" in s else None
    if "max_tool_rounds" not in s:
        r.bad("session.max_tool_rounds", f"missing: {' and '.join(agentic)} make an agentic session, which "
              f"needs max_tool_rounds (the most tool-result requests in a row, 1..{MAX_TOOL_ROUNDS})")
    latency = (_wait_ms(r, "session.tool_latency_ms", r.lengths("session.tool_latency_ms")) if "tool_latency_ms" in s
               else Lengths(value=TOOL_LATENCY_MS))
    results = (r.lengths("session.tool_result_tokens") if "tool_result_tokens" in s
               else Lengths(value=TOOL_RESULT_TOKENS))
    return SessionSpec(turns, think, rounds or 1, latency, results)


def _wait_ms(r: Reader, key: str, spec: Lengths) -> Lengths:
    """A wait in ms ([session] think_ms, tool_latency_ms; [abandon] after_ms): its largest draw at most
    MAX_WAIT_MS (its ns must fit an int64: a larger one wrapped around, silently)."""
    if spec.dist == "fixed":
        top = spec.value
    elif spec.dist == "uniform":
        top = spec.max
    elif spec.dist == "cycle":
        top = max(spec.values, default=0)
    else:  # every other draw is clipped to max (or the default bound, which is below the limit)
        top = min(max(spec.values, default=0), spec.max or DEFAULT_MAX) if spec.values else spec.max or DEFAULT_MAX
    if top > MAX_WAIT_MS:
        r.bad(key, f"draws up to {top} ms: at most {MAX_WAIT_MS} ms (a day) is allowed")
        return Lengths(value=1)
    return spec


def _agentic_across(r: Reader, config: RunConfig) -> None:
    """An agentic session sends the workload's tools to the chat API of the openai backend, which the
    model may call (tool_choice not "none")."""
    s = config.session
    if s is None or not s.agentic:
        return
    st = config.structured
    if config.backend != "openai" or config.api != "chat":
        r.bad("session.max_tool_rounds", f"tool rounds send tool calls and results as chat messages: needs "
              f"backend = \"openai\" and api = \"chat\" (got {config.backend}, {config.api})")
    if st is None or not st.has_tools:
        r.bad("session.max_tool_rounds", "an agentic session needs tools the model can call: set [request] "
              "tools (a file, or { generate = N, parameters = M })")
    elif st.tool_choice == "none":
        r.bad("session.max_tool_rounds", "tool_choice = \"none\" forbids every call: no tool round could happen "
              "(use \"auto\", \"required\" or a function's name)")
    if config.image is not None:
        r.bad("image", "images ride on a user message, and an agentic session's tool rounds send none: [image] "
              "and [session] max_tool_rounds cannot be combined")


def abandon(r: Reader) -> AbandonSpec | None:
    """[abandon]: a share of requests cut off after a drawn time (ms from dispatch) or number of tokens."""
    a = r.raw.get("abandon")
    if not isinstance(a, dict):
        return None
    share = a.get("share")
    if not is_number(share) or not 0 < share <= 1:
        r.bad("abandon.share", f"must be a number in (0, 1]: the share of requests abandoned, got {share!r}")
        share = 1.0
    after_ms = _wait_ms(r, "abandon.after_ms", r.lengths("abandon.after_ms")) if "after_ms" in a else None
    after_tokens = r.lengths("abandon.after_tokens") if "after_tokens" in a else None
    if (after_ms is None) == (after_tokens is None):
        r.bad("abandon", "give after_ms (time from dispatch) or after_tokens (output tokens received), one of them")
    return AbandonSpec(float(share), after_ms, after_tokens)


def image(r: Reader) -> ImageSpec | None:
    """[image]: chat requests with generated images, their count and size drawn like lengths."""
    m = r.raw.get("image")
    if not isinstance(m, dict):
        return None
    share = m.get("share", 1.0)
    if not is_number(share) or not 0 < share <= 1:
        r.bad("image.share", f"must be a number in (0, 1]: the share of requests with images, got {share!r}")
        share = 1.0
    count = r.lengths("image.count") if "count" in m else Lengths(value=1)
    sides = {}
    for k in ("width", "height"):
        if k not in m:
            r.bad(f"image.{k}", "missing: the images' size in pixels (a number or a distribution)")
        sides[k] = r.lengths(f"image.{k}") if k in m else Lengths(value=1)  # drawn sizes: plan/limits.py
    fill = m.get("fill", "noise")
    if fill not in IMAGE_FILLS:
        r.bad("image.fill", f"must be one of {', '.join(IMAGE_FILLS)}, got {fill!r}")
        fill = "noise"
    if r.api() != "chat":
        r.bad("image", "images are sent as chat message parts: needs api = \"chat\"")
    return ImageSpec(float(share), count, sides["width"], sides["height"], fill)


def run_options(r: Reader, given: dict[str, Any]) -> dict[str, Any]:
    """The run options no workload file holds ({field: value given}; None = not given), each parsed by its
    row's kind; a bad value is reported under its flag."""
    out: dict[str, Any] = {}
    for o in OPTIONS:
        if o.key or o.client or not o.field:
            continue
        v = given.get(o.field)
        if v is None or v == ():
            out[o.field] = o.value
        elif o.switch:
            out[o.field] = (not v) if o.invert else bool(v)
        else:
            try:
                out[o.field] = o.kind.parse(v)
            except ValueError as e:
                r.problems.append(f"{o.flag}: {e}")
                out[o.field] = o.value
    if out["ray"] is not None and given.get("workers") is None:
        out["workers"] = 0  # --ray without --workers: auto
    if out["url"] is not None:
        r.problems.extend(url_problems(out["url"]))
    return out


def across(r: Reader, config: RunConfig) -> None:
    """Rules between sections, on the built config."""
    skip_lengths = bool(config.mix) or (config.trace is not None and config.trace.lengths)
    if config.prefix is not None and config.session is None and not skip_lengths \
            and config.prompt_tokens.dist == "fixed" and config.prompt_tokens.value <= config.prefix.tokens:
        r.bad("prefix.tokens", f"must be less than prompt.tokens ({config.prompt_tokens.value}): "
              f"the prefix is part of the prompt")
    _mix_across(r, config)
    _agentic_across(r, config)


def _mix_across(r: Reader, config: RunConfig) -> None:
    """A class's model and priority need a server API that carries them, and lengths drawn from the mix;
    a per-class SLO names a class of the mix."""
    for i, c in enumerate(config.mix):
        if c.priority is not None and config.api in ("responses", "messages"):
            r.bad(f"mix[{i}].priority", f"api = \"{config.api}\" sends no priority field (only completions and chat "
                  f"do, as vLLM's `priority`)")
        elif c.priority is not None and config.backend != "openai":
            r.bad(f"mix[{i}].priority", f"the {config.backend} backend's API has no priority field (only the "
                  f"openai backend sends one, as vLLM's `priority`): remove it or use backend = \"openai\"")
        if c.model is not None and config.backend == "llamacpp":
            r.bad(f"mix[{i}].model", "llama.cpp's /completion serves the one model it loaded (no model field): "
                  "remove it, or use backend = \"openai\" (its /v1 endpoints)")
        if (c.model is not None or c.priority is not None) and config.trace is not None and config.trace.lengths:
            r.bad(f"mix[{i}]", "a trace replay takes its lengths from the trace, so no request is drawn from a "
                  "[[mix]] class and its model/priority would never be sent: set trace.lengths = false")
    if any(c.priority is not None for c in config.mix) and "priority" in config.extra_body:
        r.bad("request.extra_body.priority", "[[mix]] classes set the priority of their requests: remove it "
              "from extra_body (a class without one sends none)")
    names = {c.name for c in config.mix}
    for key, _ in config.slo or ():
        metric, cls = split_slo_key(key)
        if cls is not None and cls not in names:
            known = (f"the workload's classes: {', '.join(sorted(names))}" if names
                     else "the workload has no [[mix]] classes")
            r.problems.append(f"--slo: {metric}@{cls}: no [[mix]] class named {cls!r} ({known})")
