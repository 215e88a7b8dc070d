"""Bounds on what a plan may allocate, checked before anything big is built: a typo such as
`--requests 2000000000` or `--prompt-tokens 500000000` is a named input error (exit 2), not an
out-of-memory kill or a traceback.

Before the plan is built (`check_config`): the number of requests (`run.requests`, or the peak rate
times `run.duration`) is at most MAX_PLAN_REQUESTS. After (`check_schedule`, before prompt text and
bodies exist): each prompt is at most MAX_PROMPT_TOKENS (the synthetic text's distinct words, plan/prompts.py),
each output at most MAX_TOKENS_PER_REQUEST, and the estimated memory of
rows and bodies (BYTES_PER_REQUEST + BYTES_PER_PROMPT_TOKEN per prompt token) is at most half of the
machine's physical memory.
"""
from __future__ import annotations

import os

import numpy as np

from loadgen.config.workload import ConfigError, RunConfig
from loadgen.plan import pool
from loadgen.plan.prompts import MAX_PROMPT_WORDS

MAX_PLAN_REQUESTS = 10_000_000
MAX_TOKENS_PER_REQUEST = 4_194_304      # 4 Mi tokens: beyond any context served today
MAX_PROMPT_TOKENS = MAX_PROMPT_WORDS    # 1,048,573: a prompt's text is that many distinct words at most
BYTES_PER_REQUEST = 2_048               # row object, plan arrays, body framing
BYTES_PER_PROMPT_TOKEN = 6              # synthetic prompt text: a short word and a space per token
_FIX = "lower --requests / --duration / --rate (a closed loop's pool: --concurrency / --max-user-rate)"


def _physical_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def check_config(config: RunConfig) -> None:
    if config.trace is not None:
        return  # a trace's rows are bounded by its file (and trace.limit)
    if config.requests is not None:
        n, what = config.requests, f"{config.requests} requests"
    elif pool.is_pooled(config):
        n = pool.pool_requests(config)
        what = (f"a pool of {n} requests ({config.concurrency} users x {pool.per_user_requests(config)}: "
                f"--max-user-rate {config.max_user_rate_per_s:g}/s for {(config.duration_ns or 0) / 1e9:g}s)")
    elif config.duration_ns is not None:
        a = config.arrivals
        peak = max([a.rate_per_s, a.rate_from_per_s, *(r for _, lo, hi in a.stages for r in (lo, hi))])
        n = int(peak * config.duration_ns / 1e9)
        what = f"about {n} requests ({peak:g}/s for {config.duration_ns / 1e9:g}s)"
    else:
        return
    if n > MAX_PLAN_REQUESTS:  # session turns multiply it: check_schedule counts them
        raise ConfigError([f"the plan would hold {what}; at most {MAX_PLAN_REQUESTS:,} are allowed in one run: "
                           f"{_FIX}"])


def check_schedule(prompt_tokens: np.ndarray, max_tokens: np.ndarray) -> None:
    problems = []
    n = len(prompt_tokens)
    if n > MAX_PLAN_REQUESTS:
        problems.append(f"the plan holds {n:,} requests; at most {MAX_PLAN_REQUESTS:,} are allowed: {_FIX}")
    for name, flag, arr, limit in (("prompt", "--prompt-tokens", prompt_tokens, MAX_PROMPT_TOKENS),
                                   ("output", "--max-tokens", max_tokens, MAX_TOKENS_PER_REQUEST)):
        top = int(arr.max()) if n else 0
        if top > limit:
            problems.append(f"{flag}: a planned {name} of {top:,} tokens exceeds the {limit:,} allowed per request")
    need = n * BYTES_PER_REQUEST + int(prompt_tokens.sum(dtype=np.int64) if n else 0) * BYTES_PER_PROMPT_TOKEN
    have = _physical_bytes()
    if have and need > have // 2 and not problems:
        problems.append(f"the plan's requests and prompt text need about {need / 2**30:.1f} GiB; at most half "
                        f"of this machine's memory ({have / 2**31:.1f} GiB) is allowed: {_FIX}, or shorter prompts")
    if problems:
        raise ConfigError(problems)


MAX_IMAGE_SIDE = 8192      # pixels
MAX_IMAGES_PER_REQUEST = 64


def check_images(s) -> None:
    """[image]: the drawn sizes and counts within bounds, and the images' bytes (base64 PNG, built with the
    bodies before t0: ~4 bytes per pixel for `noise`) within half of this machine's memory."""
    if not s.images.any():
        return
    problems = []
    for key, arr, limit in (("image.width", s.image_width, MAX_IMAGE_SIDE),
                            ("image.height", s.image_height, MAX_IMAGE_SIDE),
                            ("image.count", s.images, MAX_IMAGES_PER_REQUEST)):
        if int(arr.max()) > limit:
            problems.append(f"{key}: drawn up to {int(arr.max()):,}, at most {limit:,} (bound the distribution "
                            f"with max)")
    need = int((s.images * np.maximum(s.image_width, 0) * np.maximum(s.image_height, 0)).sum(dtype=np.int64)) * 4
    have = _physical_bytes()
    if have and need > have // 2 and not problems:
        problems.append(f"the plan's images need about {need / 2**30:.1f} GiB as request bodies; at most half of "
                        f"this machine's memory ({have / 2**31:.1f} GiB) is allowed: fewer or smaller images, "
                        f"image.fill = \"flat\", or {_FIX}")
    if problems:
        raise ConfigError(problems)
