"""Before any process of a run starts: the target (the built-in simulator started when there is no
--url, the model asked of the target when not given, the server kind detected), and the request bodies.

The launcher (launch.py) sets the target up once, in the driver, whatever the mode; every process of
the run (the single process, each worker, each Ray actor) gets the same Target and builds the bodies of
the whole plan from it (request_bodies), so the manifest's `workload` section is the same in every mode.
"""
from __future__ import annotations

import ssl
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TextIO

from loadgen.client.backends import make_backend
from loadgen.client.backends.openai import OpenAIBackend
from loadgen.config.client import ClientOptions
from loadgen.config.workload import ConfigError, RunConfig, redact_url, with_overrides
from loadgen.plan.bodies import Bodies
from loadgen.plan.datasets import load_sharegpt
from loadgen.plan.prompts import PromptMaker, verdict
from loadgen.plan.schedule import Schedule
from loadgen.plan.structured import body_fields
from loadgen.plan.context import fit_context
from loadgen.probe.discover import DISCOVER_TIMEOUT_S, check_model, context_limit, discover_model, served_models
from loadgen.probe.server_tokenizer import resolve as resolve_tokenizer
from loadgen.probe.servers import detect as detect_server
from loadgen.run.outcome import say, say_lengths


@dataclass(frozen=True)
class Target:
    """The target as every process of the run talks to it (picklable: it travels to workers and actors)."""
    config: RunConfig          # the model resolved (asked of the target when the workload gives none)
    url: str                   # without credentials (credentials.split_url)
    headers: dict[str, str]    # every header sent to the target (config.client.target_url_and_headers)
    client: ClientOptions      # TLS choice, --header
    builtin_sim: bool
    server: dict | None        # servers.detect: kind, version

    def backend(self):
        c = self.config
        backend = make_backend(c.backend, c.api, c.model, c.extra_body)
        fields = body_fields(c.structured, c.seed)
        if fields:
            if not isinstance(backend, OpenAIBackend):  # config/structured.py refuses such a workload
                raise ValueError(f"the {c.backend} backend sends no tools or response_format")
            backend.structure(fields)
        return backend


def default_out(config: RunConfig) -> Path:
    return Path("results") / f"{config.name}-{datetime.now().strftime('%Y%m%d-%H%M%S')}"


def resolve_target(config: RunConfig, url: str, headers: dict[str, str], client: ClientOptions,
                   builtin_sim: bool, progress: TextIO | None) -> Target:
    """The model (asked of the target when not given) and the server kind, once for the whole run."""
    if not config.model:
        say(progress, f"model not given: asking {redact_url(url)}/v1/models (up to {DISCOVER_TIMEOUT_S:g}s)")
        config = with_overrides(config, "/v1/models", model=discover_model(url, headers, client.ssl_context()))
        say(progress, f"model: {config.model} (the one the target serves)")
    server = detect_server(url, headers, progress=progress, tls=client.ssl_context())
    say(progress, f"server kind: {server['kind']}" + (f" {server['version']}" if server["version"] else ""))
    config = check_served(config, url, headers, client, server, progress)
    return Target(config, url, headers, client, builtin_sim, server)


def check_served(config: RunConfig, url: str, headers: dict[str, str], client: ClientOptions, server: dict,
                 progress: TextIO | None) -> RunConfig:
    """The model checked against the target's list (a model it does not serve: exit 2, naming what it
    serves), and the target's context limit put into the config (fit_plan fits the plan to it)."""
    tls = client.ssl_context()
    served = served_models(url, headers, tls)
    warning = check_model(config.model, served, server.get("kind"))
    if warning:
        say(progress, "WARNING: " + warning)
    problems = []
    for i, c in enumerate(config.mix):  # each class's own model (e.g. a LoRA adapter) must be served too
        if c.model is not None and c.model != config.model:
            try:
                check_model(c.model, served, server.get("kind"), key=f"{config.source}: mix[{i}].model")
            except ConfigError as e:
                problems += e.problems
    if problems:
        raise ConfigError(problems)
    limit, source = context_limit(url, headers, served, config.model, tls)
    say(progress, f"context limit: {limit} tokens per request ({source})" if limit else
                  f"context limit: unknown, {source}: over-long prompts are not caught before the run")
    return with_overrides(config, "target", context_limit=limit, context_source=source)


def fit_plan(schedule: Schedule, config: RunConfig, progress: TextIO | None) -> Schedule:
    """The plan fitted to the target's context limit (plan/context.py; exit 2 naming the rows that do not
    fit, unless --over-context clip or drop), and a line saying what was clipped or dropped."""
    fitted = fit_context(schedule, config)
    c = fitted.info["context"]
    if c["clipped"] or c["dropped"]:
        say(progress, f"--over-context {c['policy']}: {c['clipped'] or c['dropped']} of {c['requests_before']} "
                      f"planned requests {'clipped' if c['clipped'] else 'dropped'} to fit the context of "
                      f"{c['limit_tokens']} tokens ({c['source']})")
    return fitted


def request_bodies(config: RunConfig, schedule: Schedule, backend, url: str | None = None,
                   progress: TextIO | None = None,
                   headers: dict[str, str] | None = None,
                   tls: ssl.SSLContext | bool = True) -> tuple[list[bytes], Bodies, dict]:
    """Every body (later session turns are built at run time by Bodies.next_turn), and the manifest's
    `workload` section: tokenizer used (and any fallback warning), prompt length checks and verdict
    (`prompt_lengths`, prompts.verdict), trace counts. headers, tls: the run's (Target.headers,
    ClientOptions.ssl_context), which /tokenize gets as every request to the target does."""
    tokenizer, warning = resolve_tokenizer(config.tokenizer, url, config.tokenizer_file, config.api,
                                           config.model, progress, headers, tls)
    tools = body_fields(config.structured, config.seed).get("tools")
    if tools and hasattr(tokenizer, "tools"):  # the server's count of a prompt its template adds them to
        tokenizer.tools = tools
    maker = PromptMaker(tokenizer)
    convs = load_sharegpt(config.dataset) if config.dataset else None
    if config.image is not None and not (isinstance(backend, OpenAIBackend) and backend.api == "chat"):
        raise ConfigError([f"image: images are sent as OpenAI chat content parts; the {config.backend} backend "
                           f"of this target does not take them"])
    bodies = Bodies(schedule, backend, maker, config.seed, convs, salt=config.prompt_salt, mix=config.mix,
                    image_fill=config.image.fill if config.image else None)
    built = bodies.build_all()
    checks = maker.summary()
    info = {**schedule.info, "tokenizer": {**tokenizer.describe(), "requested": config.tokenizer,
                                           "warning": warning}, "prompt_checks": checks,
            "prompt_lengths": verdict(tokenizer, checks, config.tokenizer)}
    return built, bodies, info


def say_workload(progress: TextIO | None, workload: dict) -> None:
    """The tokenizer's fallback warning and the prompt-length verdict of request_bodies' `workload`."""
    if workload["tokenizer"]["warning"]:
        say(progress, "WARNING: " + workload["tokenizer"]["warning"])
    say_lengths(progress, workload["prompt_lengths"])
