"""The plan of a run: every request's intended send time and shape, computed up front from the config
and its seed as a pure function (no clock, no network). `loadgen schedule` prints it; the runner
executes it (or one slice of it).

Rows are in plan order. A multi-turn session's first turn has an intended time from the arrival
process; its later turns have `after` = the index of the previous turn and intended_ns = -1 (unknown
until the run: previous turn's done + think_ns). They follow their first turn in the arrays.
With [session], the arrival process (and run.requests / run.duration) counts conversations.
A closed loop bounded by a duration plans a pool (pool.py): the rows its users may reach, not all sent.

Lengths: `prompt_tokens` is the planned full prompt, shared prefix included (with [session], [prompt]
draws each turn's new user message and the prefix is added to it); for a later turn it assumes
each earlier reply had its max_tokens (the run fills in the real history). `new_tokens` is the text this
request adds: the user message (minus the prefix, which is sent as its own part).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from loadgen import metrics
from loadgen.plan import arrivals
from loadgen.plan import lengths
from loadgen.plan import pool
from loadgen.config.options import POOLING_APIS
from loadgen.config.workload import Lengths, RunConfig
from loadgen.plan import datasets, traces
from loadgen.plan.traces import Trace

# Sub-seeds per random stream, so changing one stream (e.g. output lengths) leaves the others intact.
_ARRIVAL_STREAM, _PROMPT_STREAM, _OUTPUT_STREAM, _TEXT_STREAM = 0, 1, 2, 3
_MIX_STREAM, _PREFIX_STREAM, _TURNS_STREAM, _THINK_STREAM, _EMPIRICAL_STREAM, _DATASET_STREAM = 4, 5, 6, 7, 8, 9
_ABANDON_STREAM, _IMAGE_STREAM, _TOOL_LATENCY_STREAM, _TOOL_TOKENS_STREAM, _RERANK_STREAM = 10, 11, 12, 13, 14
NONE = -1  # "not set" in the int64 columns below
_UNSET = np.zeros(0, dtype=np.int64)  # a Schedule column not given (replaced in __post_init__, never kept)


def _unset() -> np.ndarray:
    return _UNSET


@dataclass(frozen=True)
class Schedule:
    intended_ns: np.ndarray     # int64, ns from t0; sorted over rows with after == -1; -1 for later turns
    prompt_tokens: np.ndarray   # int64, planned full prompt (prefix included)
    max_tokens: np.ndarray      # int64
    warmup: np.ndarray          # bool: sent, but left out of statistics
    seed: int
    # The columns below, when not given (or given as None), are filled by __post_init__: every row's
    # "not set" value, and new_tokens = prompt_tokens. So a built Schedule always holds all of them.
    prefix_group: np.ndarray = field(default_factory=_unset)  # int64, -1 = no shared prefix
    session: np.ndarray = field(default_factory=_unset)       # int64, -1 = not part of a conversation
    turn: np.ndarray = field(default_factory=_unset)          # int64, 0-based, -1 = not part of a conversation
    after: np.ndarray = field(default_factory=_unset)         # int64, index of the previous turn, -1 = by time
    think_ns: np.ndarray = field(default_factory=_unset)      # int64, wait after the previous reply (0 otherwise)
    new_tokens: np.ndarray = field(default_factory=_unset)    # int64, tokens this request's text adds (no prefix)
    prefix_tokens: int = 0
    blocks: list | None = None        # Mooncake replay: the prompt's 512-token block ids per row
    conversation: np.ndarray = field(default_factory=_unset)  # int64, ShareGPT conversation (-1 = synthetic)
    source_line: np.ndarray = field(default_factory=_unset)   # int64, the trace line of its lengths (-1 = none)
    abandon_ns: np.ndarray = field(default_factory=_unset)    # int64, cut off this long after dispatch (-1 = no)
    abandon_tokens: np.ndarray = field(default_factory=_unset)  # int64, cut off after this many tokens (-1 = no)
    images: np.ndarray = field(default_factory=_unset)        # int64, images the request carries (0 = none)
    image_width: np.ndarray = field(default_factory=_unset)   # int64, pixels of each of them (-1 = none)
    image_height: np.ndarray = field(default_factory=_unset)  # int64
    mix_class: np.ndarray = field(default_factory=_unset)     # int64, its [[mix]] class's index (-1 = no mix)
    # agentic sessions (a later turn of one): the tool latency it waits when it carries tool results, and
    # those results' tokens (-1 = not agentic); whether it does is known only at run time (plan/bodies.py)
    tool_latency_ns: np.ndarray = field(default_factory=_unset)  # int64
    tool_tokens: np.ndarray = field(default_factory=_unset)      # int64
    max_tool_rounds: int = 0          # tool-result requests in a row, at most (0 = not agentic)
    # api = "rerank": each row's document lengths (an int64 array per row; its query is new_tokens long and
    # prompt_tokens counts every (query, document) pair the server scores: documents x query + their tokens)
    document_tokens: list | None = None
    info: dict = field(default_factory=dict)  # for the manifest: trace rows read / skipped

    def __post_init__(self) -> None:
        n = len(self.intended_ns)
        for name, fill in (("prefix_group", NONE), ("session", NONE), ("turn", NONE), ("after", NONE),
                           ("think_ns", 0), ("conversation", NONE), ("source_line", NONE),
                           ("abandon_ns", NONE), ("abandon_tokens", NONE), ("mix_class", NONE), ("images", 0),
                           ("image_width", NONE), ("image_height", NONE), ("tool_latency_ns", NONE),
                           ("tool_tokens", NONE)):
            if getattr(self, name) is None or getattr(self, name) is _UNSET:
                object.__setattr__(self, name, np.full(n, fill, dtype=np.int64))
        if self.new_tokens is None or self.new_tokens is _UNSET:
            object.__setattr__(self, "new_tokens", self.prompt_tokens.copy())

    def __len__(self) -> int:
        return len(self.intended_ns)

    def offered_rate_per_s(self) -> float:
        """The rate the plan offers: (n - 1) / span of the timed intended times (nan below two)."""
        rate = metrics.rate_per_s(self.intended_ns[self.after == NONE])
        return float("nan") if rate is None else rate


def sub_seed(seed: int, stream: int, *more: int) -> np.random.SeedSequence:
    return np.random.SeedSequence([seed, stream, *more])


def _arrivals(config: RunConfig, trace: Trace | None) -> np.ndarray:
    a = config.arrivals
    seed = int(np.random.default_rng(sub_seed(config.seed, _ARRIVAL_STREAM)).integers(2**63))
    bound = {"n": config.requests} if config.requests is not None else {"duration_ns": config.duration_ns}
    if config.concurrency or a.rate_per_s == float("inf"):
        # Closed loop: all due at t0; a closed loop's runner re-times each row when a user
        # is free (closedloop.py), rate = inf leaves them to --max-concurrency. Bounded by a duration:
        # a pool of rows the users take from until the deadline (pool.py).
        if pool.is_pooled(config):  # (a closed loop of users, bounded by a duration)
            return np.zeros(pool.pool_requests(config), dtype=np.int64)
        if config.requests is None:
            raise ValueError("rate = inf needs run.requests")
        return np.zeros(config.requests, dtype=np.int64)
    if a.process == "trace":
        t = config.trace
        if t is None or trace is None:
            raise ValueError("arrivals.process \"trace\" needs a [trace] table with a file")
        return arrivals.replay(trace.timestamps_ns, time_scale=t.time_scale, rate_per_s=t.rate_per_s,
                               start_ns=t.start_ns,
                               limit=min(x for x in (t.limit, config.requests, 2**62) if x is not None),
                               duration_ns=config.duration_ns)
    if a.process == "stages":
        if config.requests is None and config.duration_ns is None:
            bound = {}
        return arrivals.stages(a.stages, seed=seed, base=a.base, **bound)
    if a.process == "ramp":
        return arrivals.ramp(a.rate_from_per_s, a.rate_per_s, a.ramp_ns, seed=seed, base=a.base, **bound)
    if a.process == "poisson":
        return arrivals.poisson(a.rate_per_s, seed=seed, **bound)
    if a.process == "gamma":
        return arrivals.gamma(a.rate_per_s, a.burstiness, seed=seed, **bound)
    return arrivals.constant(a.rate_per_s, **bound)


def build(config: RunConfig, trace=None) -> Schedule:
    """`trace`: an already read traces.Trace for config.trace (read here when None)."""
    s = _build(config, trace)
    if config.dataset is not None:
        s = _with_dataset(config, s, datasets.load_sharegpt(config.dataset))
    if config.abandon is not None:
        s = _with_abandon(config, s)
    if config.image is not None:
        s = _with_images(config, s)
    if config.api in POOLING_APIS:  # nothing is generated: no max_tokens is sent or recorded
        s = replace(s, max_tokens=np.zeros(len(s), dtype=np.int64))
    if config.rerank is not None:
        return _with_documents(config, s)  # (no context fit: the server's limit holds each pair, not the sum)
    if config.context_source:  # the target's context limit is known (run/prepare.py): every process fits alike
        from loadgen.plan.context import fit_context  # (context.py works on a Schedule: imported late)
        s = fit_context(s, config)
    return s


def _with_abandon(config: RunConfig, s: Schedule) -> Schedule:
    """[abandon]: which requests are abandoned (each with probability share) and at what point, drawn from
    the seed (the same plan every time, whatever the run's mode or worker count)."""
    a = config.abandon
    assert a is not None  # (build() calls this only then)
    spec = a.after_ms or a.after_tokens
    assert spec is not None  # (the config has exactly one: parts.abandon)
    n = len(s)
    chosen = np.random.default_rng(sub_seed(config.seed, _ABANDON_STREAM)).random(n) < a.share
    at = np.where(chosen, lengths.sample(spec, n, sub_seed(config.seed, _ABANDON_STREAM, 1)), NONE)
    if a.after_ms is not None:
        return replace(s, abandon_ns=np.where(chosen, at * 1_000_000, NONE))
    return replace(s, abandon_tokens=at)


def _with_images(config: RunConfig, s: Schedule) -> Schedule:
    """[image]: which requests carry images (each with probability share), how many and of what size."""
    m = config.image
    assert m is not None  # (build() calls this only then)
    n = len(s)
    carries = np.random.default_rng(sub_seed(config.seed, _IMAGE_STREAM)).random(n) < m.share
    draw = [lengths.sample(spec, n, sub_seed(config.seed, _IMAGE_STREAM, k))
            for k, spec in enumerate((m.count, m.width, m.height), start=1)]
    return replace(s, images=np.where(carries, draw[0], 0), image_width=np.where(carries, draw[1], NONE),
                   image_height=np.where(carries, draw[2], NONE))


def _with_documents(config: RunConfig, s: Schedule) -> Schedule:
    """[rerank]: each request's document count and every document's length, drawn from the seed; its
    planned prompt becomes what the server prefills, one sequence per (query, document) pair:
    documents x query tokens + the documents' tokens."""
    m = config.rerank
    assert m is not None  # (build() calls this only then)
    n = len(s)
    counts = lengths.sample(m.documents, n, sub_seed(config.seed, _RERANK_STREAM))
    flat = lengths.sample(m.document_tokens, int(counts.sum()), sub_seed(config.seed, _RERANK_STREAM, 1))
    docs = np.split(flat, np.cumsum(counts)[:-1]) if n else []
    prompt = counts * s.new_tokens + np.array([int(d.sum()) for d in docs], dtype=np.int64)
    return replace(s, document_tokens=docs, prompt_tokens=prompt)


def _with_dataset(config: RunConfig, s: Schedule, convs) -> Schedule:
    """Prompt text from ShareGPT human turns: a conversation per session (or request); the plan's
    lengths count its words (the run records the tokenizer's count in planned_prompt_tokens)."""
    units = s.session if config.session is not None else np.arange(len(s))
    pick = np.random.default_rng(sub_seed(config.seed, _DATASET_STREAM)).integers(0, len(convs), len(s))
    conv = pick[np.maximum(units, 0)]
    new = np.array([len(convs.human_turns[c][max(t, 0) % len(convs.human_turns[c])].split())
                    for c, t in zip(conv.tolist(), s.turn.tolist())], dtype=np.int64)
    prompt = np.where(s.prefix_group != NONE, s.prefix_tokens, 0) + new
    if config.session is not None:  # add the history: earlier messages and planned replies
        history = 0
        for r in range(len(s)):
            history = 0 if s.turn[r] == 0 else history
            prompt[r] += history
            history += int(new[r] + s.max_tokens[r])
    s.info["dataset"] = {"file": convs.source, "conversations": len(convs), "skipped": convs.skipped}
    return replace(s, prompt_tokens=prompt, new_tokens=new, conversation=conv.astype(np.int64))


def _build(config: RunConfig, trace=None) -> Schedule:
    cache: dict[str, object] = {}

    def read_trace(path: str, fmt: str):
        if path not in cache:
            cache[path] = traces.read(path, fmt, skip_bad_rows=bool(config.trace and config.trace.skip_bad_rows))
        return cache[path]

    info: dict = {}
    if config.trace is not None:
        trace = trace or read_trace(config.trace.file, config.trace.format)
        info["trace"] = trace.summary()
    starts = _arrivals(config, trace)
    n = len(starts)
    blocks = None
    group = np.full(n, NONE, dtype=np.int64)
    source_line: np.ndarray | None = None
    cls: np.ndarray | None = None  # the [[mix]] class of each row (None: no mix drawn)
    if config.trace is not None and config.trace.lengths:
        # replay() keeps a contiguous window of the trace: find where it starts to align the lengths.
        rel = trace.timestamps_ns - (trace.timestamps_ns[0] if len(trace) else 0)
        first = int(np.searchsorted(rel, config.trace.start_ns, side="left"))
        prompt = trace.prompt_tokens[first:first + n].clip(1)
        output = trace.output_tokens[first:first + n].clip(1)
        source_line = trace.lines[first:first + n] if trace.lines is not None else None
        if trace.hash_ids is not None:
            blocks = trace.hash_ids[first:first + n]
            # prefix_group = the first block id when another planned row starts with it too
            first_ids = np.array([b[0] if b else NONE for b in blocks], dtype=np.int64)
            ids, counts = np.unique(first_ids, return_counts=True)
            shared = np.isin(first_ids, ids[counts > 1]) & (first_ids != NONE)
            group = np.where(shared, first_ids, NONE).astype(np.int64)
        if trace.prefix_group is not None:
            group = trace.prefix_group[first:first + n].copy()
    else:
        prompt, output, cls = _sample_lengths(config, n, read_trace)
    info["requests_planned"] = int(n)
    if pool.is_pooled(config):  # the rows are a pool: the run schedules those its users reach (pool.py)
        info["pool"] = {"requests": int(n), "per_user": pool.per_user_requests(config),
                        "max_user_rate_per_s": config.max_user_rate_per_s}
    if config.session is None:
        prefix_tokens = 0
        if config.prefix is not None:
            group, new = _assign_prefix(config, prompt, n)
            prefix_tokens = config.prefix.tokens
        else:
            new = prompt
        return Schedule(starts, prompt, output, _warmup(config, n), config.seed, prefix_group=group,
                        new_tokens=new, prefix_tokens=prefix_tokens, blocks=blocks, info=info,
                        source_line=source_line if source_line is not None else _UNSET,
                        mix_class=cls if cls is not None else _UNSET)
    return _sessions(config, starts, prompt, output, cls, info, read_trace)


def _sample_lengths(config: RunConfig, n: int, read_trace,
                    *salt: int) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Prompt and output lengths of n rows, and each row's [[mix]] class (None without a mix).
    salt: extra sub-seed parts, so a second set of draws (later turns) is independent of the first."""
    pick_rows: dict[str, np.ndarray] = {}

    def trace_lengths(spec: Lengths, column: str) -> np.ndarray:
        tr = read_trace(spec.trace, spec.trace_format)
        return tr.prompt_tokens if column == "prompt" else tr.output_tokens

    def draw(spec: Lengths, stream: int, column: str) -> np.ndarray:
        if spec.dist == "empirical" and spec.trace:
            # Prompt and output from the same trace sample the same rows: the joint shape survives.
            col = trace_lengths(spec, column)
            if len(col) == 0:
                raise ValueError(f"{spec.trace}: the trace has no rows to sample lengths from")
            rows = pick_rows.setdefault(spec.trace, np.random.default_rng(
                sub_seed(config.seed, _EMPIRICAL_STREAM, *salt)).integers(0, len(col), n))
            return np.clip(col[rows], max(1, spec.min), spec.max or lengths.DEFAULT_MAX).astype(np.int64)
        return lengths.sample(spec, n, sub_seed(config.seed, stream, *salt),
                              lambda s: trace_lengths(s, column))

    if config.mix:
        cls = lengths.pick_classes(tuple(c.weight for c in config.mix), n, sub_seed(config.seed, _MIX_STREAM, *salt))
        prompt, output = np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64)
        for j, c in enumerate(config.mix):
            m = cls == j
            for out, spec, stream in ((prompt, c.prompt, _PROMPT_STREAM), (output, c.output, _OUTPUT_STREAM)):
                out[m] = lengths.sample(spec, n, lengths.child_seed(sub_seed(config.seed, stream, *salt), j))[m]
        return prompt, output, cls.astype(np.int64)
    return (draw(config.prompt_tokens, _PROMPT_STREAM, "prompt"), draw(config.output_tokens, _OUTPUT_STREAM, "output"),
            None)


def _assign_prefix(config: RunConfig, prompt: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Each request shares one of `groups` prefixes with probability `fraction`. The prefix is part of
    its prompt: a sharing request's prompt is raised to at least K + 1 so it adds >= 1 own token."""
    p = config.prefix
    assert p is not None  # called only with a [prefix]
    rng = np.random.default_rng(sub_seed(config.seed, _PREFIX_STREAM))
    shares = rng.random(n) < p.fraction
    group = np.where(shares, rng.integers(0, p.groups, n), NONE).astype(np.int64)
    np.maximum(prompt, np.where(shares, p.tokens + 1, 1), out=prompt)
    new = np.where(shares, prompt - p.tokens, prompt).astype(np.int64)
    return group, new


def _sessions(config: RunConfig, starts, first_prompt, first_output, first_cls, info, read_trace) -> Schedule:
    s = config.session
    assert s is not None  # called only with a [session]
    k = len(starts)
    turns = lengths.sample(s.turns, k, sub_seed(config.seed, _TURNS_STREAM))
    total = int(turns.sum())
    # Each turn's new user message and output length: a fresh draw per turn from [prompt]/[output]
    # (or [[mix]]); the first turn keeps the draws made for the arrivals.
    none = np.zeros(0, dtype=np.int64)
    more_p, more_o, more_c = _sample_lengths(config, total, read_trace, 1) if total else (none, none, None)
    think = lengths.sample(s.think_ms, total, sub_seed(config.seed, _THINK_STREAM)) * 1_000_000
    # Agentic: every later turn also draws a tool latency and a tool-result length, used when the reply
    # before it called tools (run time decides; the draws of the other streams stay as without them).
    tool_ns = tool_tok = np.full(total, NONE, dtype=np.int64)
    if s.agentic and s.tool_latency_ms is not None and s.tool_result_tokens is not None:
        # a latency of 0 ms is a tool that answers at once (lengths.sample clips to >= 1: undo for 0)
        tool_ns = _ms_ns(s.tool_latency_ms, total, sub_seed(config.seed, _TOOL_LATENCY_STREAM))
        tool_tok = lengths.sample(s.tool_result_tokens, total, sub_seed(config.seed, _TOOL_TOKENS_STREAM))
    prefix_tokens = config.prefix.tokens if config.prefix else 0
    # In a conversation, [prompt] tokens is every turn's new user message, the first one's included: the
    # shared prefix (a system prompt) and the history come on top of it.
    first_new = first_prompt
    if config.prefix is not None:
        group_of_session, _ = _assign_prefix(config, first_prompt.copy(), k)
    else:
        group_of_session = np.full(k, NONE, dtype=np.int64)
    cols = {c: np.zeros(total, dtype=np.int64) for c in
            ("intended", "prompt", "new", "out", "group", "session", "turn", "after", "think", "cls")}
    r = 0
    for i in range(k):
        history = 0
        for t in range(int(turns[i])):
            new = int(first_new[i]) if t == 0 else int(more_p[r])
            out = int(first_output[i]) if t == 0 else int(more_o[r])
            has_prefix = group_of_session[i] != NONE
            cols["intended"][r] = starts[i] if t == 0 else NONE
            cols["new"][r] = new
            # a later turn's upper bound: it carries a user message or (agentic) tool results, the longer
            longest = new if t == 0 else max(new, int(tool_tok[r]))
            cols["prompt"][r] = (prefix_tokens if has_prefix else 0) + history + longest
            cols["out"][r] = out
            cols["group"][r] = group_of_session[i]
            cols["session"][r], cols["turn"][r] = i, t
            cols["after"][r] = NONE if t == 0 else r - 1
            cols["think"][r] = 0 if t == 0 else think[r]
            # each turn's class is the one its lengths were drawn from (so its model and priority too)
            cols["cls"][r] = NONE if first_cls is None or more_c is None else int(first_cls[i] if t == 0 else more_c[r])
            history += longest + out
            r += 1
    info["sessions"] = k
    return Schedule(cols["intended"], cols["prompt"], cols["out"], _warmup(config, total), config.seed,
                    prefix_group=cols["group"], session=cols["session"], turn=cols["turn"],
                    after=cols["after"], think_ns=cols["think"], new_tokens=cols["new"],
                    prefix_tokens=prefix_tokens, info=info, mix_class=cols["cls"],
                    tool_latency_ns=np.where(cols["after"] == NONE, NONE, tool_ns),
                    tool_tokens=np.where(cols["after"] == NONE, NONE, tool_tok),
                    max_tool_rounds=s.max_tool_rounds)


def _ms_ns(spec: Lengths, n: int, seed: np.random.SeedSequence) -> np.ndarray:
    # ms draws as ns; a fixed 0 is allowed (lengths.sample's floor of 1 is for token counts)
    if spec.dist == "fixed" and spec.value == 0:
        return np.zeros(n, dtype=np.int64)
    return lengths.sample(spec, n, seed) * 1_000_000


def _warmup(config: RunConfig, n: int) -> np.ndarray:
    warmup = np.zeros(n, dtype=bool)
    warmup[: min(config.warmup_requests, n)] = True
    return warmup


def plan_records(s: Schedule) -> list[dict]:
    """The rows `loadgen schedule` prints (intended_ns null for turns timed by the previous reply)."""
    out = []
    for i in range(len(s)):
        out.append({"request_id": f"plan-{i:06d}",
                    "intended_ns": None if s.after[i] != NONE else int(s.intended_ns[i]),
                    "prompt_tokens": int(s.prompt_tokens[i]), "max_tokens": int(s.max_tokens[i]),
                    "prefix_group": _opt(s.prefix_group[i]), "session": _opt(s.session[i]),
                    "turn": _opt(s.turn[i]), "after": _opt(s.after[i]),
                    "think_ns": int(s.think_ns[i]) if s.after[i] != NONE else None,
                    "abandon_after_ns": _opt(s.abandon_ns[i]), "abandon_after_tokens": _opt(s.abandon_tokens[i]),
                    "images": int(s.images[i]), "image_width": _opt(s.image_width[i]),
                    "image_height": _opt(s.image_height[i]),
                    "mix_class": _opt(s.mix_class[i]), "warmup": bool(s.warmup[i]),
                    "tool_latency_ns": _opt(s.tool_latency_ns[i]), "tool_tokens": _opt(s.tool_tokens[i])})
        if s.document_tokens is not None:  # api = "rerank": the query's tokens and each document's
            out[-1] |= {"query_tokens": int(s.new_tokens[i]), "document_tokens": s.document_tokens[i].tolist()}
    return out


def _opt(v) -> int | None:
    return None if v == NONE else int(v)
