"""The plan against the target's context limit, before anything is sent: a request whose prompt +
max_tokens exceeds the model's context is answered HTTP 400 by vLLM (and cut or refused by others), so
sending it measures nothing.

A row fits when prompt_tokens + max_tokens <= limit (vLLM's rule; llama.cpp's per-slot n_ctx is taken
the same way). A later session turn's prompt_tokens is the plan's upper bound (every earlier reply at its
max_tokens). The limit and its source are asked of the target once per run (probe/discover.py
context_limit, run/prepare.py) and carried in the config (context_limit, context_source), so every
process of the run fits the plan alike (schedule.build). `--over-context` says what happens to the rows
that do not fit:

    error  (default) an input error, exit 2, before anything is sent: the first SHOW rows named (request
           index; trace file and line when its lengths came from a trace; conversation and turn), with
           prompt + output = total tokens, their count, the limit and where it was read
    clip   each row is cut to fit: its own prompt text first (down to 1 token; a shared prefix and a
           session's history stay), then max_tokens (down to 1). A later turn of the conversation is
           planned on the shortened history. A row that cannot fit even so (prefix or history alone too
           long; ShareGPT text, whose words are fixed) is an input error as above.
    drop   the rows are removed from the plan before t0 (a session turn with the rest of its
           conversation): they are never scheduled, so they have no row in requests.parquet; every
           request that remains has its one row. A plan with nothing left is an input error.

The manifest's `workload.context` records it: limit_tokens (None: the target publishes none, nothing is
checked), source, policy, longest_tokens (the plan's largest prompt + output before fitting), over (rows
that did not fit as planned), clipped, dropped, and requests_before (the plan's rows before dropping).
"""
from __future__ import annotations

from dataclasses import fields, replace
from typing import TYPE_CHECKING

import numpy as np

from loadgen.config.workload import ConfigError, RunConfig

if TYPE_CHECKING:
    from loadgen.plan.schedule import Schedule

NONE = -1  # schedule.NONE
SHOW = 10


def fit_context(s: Schedule, config: RunConfig) -> Schedule:
    """The plan fitted to config.context_limit by config.over_context (module docstring), with its
    `context` info; raises ConfigError naming the rows that do not fit (policy error, or unclippable)."""
    limit, policy = config.context_limit, config.over_context
    need = s.prompt_tokens + s.max_tokens
    info = {"limit_tokens": limit, "source": config.context_source, "policy": policy,
            "longest_tokens": int(need.max()) if len(s) else 0, "over": 0, "clipped": 0, "dropped": 0,
            "requests_before": len(s)}
    over = need > limit if limit is not None else np.zeros(len(s), dtype=bool)
    info["over"] = int(over.sum())
    if not over.any():
        return _with_info(s, info)
    if policy == "error":
        raise ConfigError(_problems(s, np.flatnonzero(over), config, "do not fit"))
    if policy == "drop":
        return _drop(s, over, info, config)
    return _clip(s, info, config)


def _with_info(s: Schedule, info: dict) -> Schedule:
    return replace(s, info={**s.info, "context": info})


def _row(s: Schedule, r: int, config: RunConfig) -> str:
    where = f"request {r}"
    if s.source_line[r] != NONE and config.trace is not None:
        where += f" ({config.trace.file}:{int(s.source_line[r])})"
    if s.session[r] != NONE:
        where += f" (conversation {int(s.session[r])}, turn {int(s.turn[r])})"
    p, o = int(s.prompt_tokens[r]), int(s.max_tokens[r])
    return f"{where}: prompt {p} + output {o} = {p + o} tokens"


def _problems(s: Schedule, rows: np.ndarray, config: RunConfig, what: str) -> list[str]:
    head = (f"--over-context {config.over_context}: {len(rows)} of {len(s)} planned requests {what} the target's "
            f"context of {config.context_limit} tokens (prompt + max tokens; {config.context_source})")
    named = [_row(s, int(r), config) for r in rows[:SHOW]]
    more = [f"... and {len(rows) - SHOW} more"] if len(rows) > SHOW else []
    fix = ("pass --over-context clip (shorten them) or drop (leave them out), or plan shorter prompts or "
           "outputs (--prompt-tokens, --max-tokens)" if config.over_context == "error" else
           "pass --over-context drop (leave them out), or plan shorter shared prefixes / fewer turns")
    return [head, *named, *more, fix]


def _drop(s: Schedule, over: np.ndarray, info: dict, config: RunConfig) -> Schedule:
    keep = ~over
    for r in np.flatnonzero(s.after != NONE).tolist():  # turns follow the turn they answer (schedule.py)
        if not keep[s.after[r]]:
            keep[r] = False   # its history holds a dropped turn: the rest of the conversation goes too
    if not keep.any():
        raise ConfigError(_problems(s, np.flatnonzero(over), config, "do not fit (nothing would be left)"))
    info["dropped"] = int((~keep).sum())
    return _with_info(take(s, keep), info)


def take(s: Schedule, keep: np.ndarray) -> Schedule:
    """The rows where keep is True, in plan order; `after` renumbered (a kept row's previous turn is kept)."""
    n = len(s)
    new_index = np.cumsum(keep, dtype=np.int64) - 1
    changes: dict = {}
    for f in fields(s):
        v = getattr(s, f.name)
        if isinstance(v, np.ndarray) and len(v) == n:
            changes[f.name] = v[keep]
    changes["after"] = np.where(s.after[keep] == NONE, NONE, new_index[np.maximum(s.after[keep], 0)])
    if s.blocks is not None:
        changes["blocks"] = [b for b, k in zip(s.blocks, keep.tolist()) if k]
    return replace(s, **changes)


def _clip(s: Schedule, info: dict, config: RunConfig) -> Schedule:
    limit = config.context_limit
    assert limit is not None  # only called when some row is over it
    prompt, new, out = s.prompt_tokens.copy(), s.new_tokens.copy(), s.max_tokens.copy()
    lost: dict[int, int] = {}   # conversation -> tokens its earlier turns were shortened by
    unfit, clipped = [], 0
    rows = np.flatnonzero((prompt + out > limit) | (s.session != NONE))
    for r in rows.tolist():
        conv = int(s.session[r])
        if conv != NONE:
            prompt[r] -= lost.get(conv, 0)   # the history it is planned on holds the earlier cuts
        excess = int(prompt[r] + out[r]) - limit
        if excess <= 0:
            continue
        own = min(excess, int(new[r]) - 1) if s.conversation[r] == NONE else 0
        reply = min(excess - own, int(out[r]) - 1)
        if own + reply < excess:
            unfit.append(r)
            continue
        new[r] -= own
        prompt[r] -= own
        out[r] -= reply
        clipped += 1
        if conv != NONE:
            lost[conv] = lost.get(conv, 0) + own + reply
    if unfit:
        raise ConfigError(_problems(s, np.array(unfit), config, "cannot be clipped to"))
    info["clipped"] = clipped
    return _with_info(replace(s, prompt_tokens=prompt, new_tokens=new, max_tokens=out), info)
