"""The continuous-batching engine: a pure step loop after vLLM V1's scheduler, with no clock and
no I/O. The caller (driver.py in real time, or a test with virtual time) calls
`schedule(start_ns)` to plan one step, waits until `step.end_ns`, then calls `complete(step)`.

Times are real monotonic ns: a step's profile time (profiles.py) divided by `speed`.

Each step: running sequences first, oldest first, each gets the tokens it still needs (a decode
needs 1; a partly prefilled prompt the rest of it) within the token budget
`max_num_batched_tokens`; a sequence whose KV cannot grow preempts the most recently admitted
running one (its blocks are freed, it goes back to the head of the queue and recomputes its
prompt and generated tokens later). Then, if nothing was preempted, waiting requests are
admitted first-come-first-served while the budget, `max_num_seqs` and the KV pool allow; a
prompt larger than the remaining budget is split over steps (chunked prefill). KV is allocated
in blocks of BLOCK_SIZE tokens for the tokens computed so far. When a sequence's computed tokens
catch up with its tokens, it samples one output token (its first, after the prompt).

Scheduling policy (EngineConfig.policy, vLLM's `--scheduling-policy`): "fcfs" as above; "priority" orders
the waiting queue by (priority, arrival) as vLLM V1's PriorityRequestQueue (lower priority value first; a
preempted sequence goes back into that order, not to the head), admits the first of that order that has
arrived, and preempts the running sequence with the largest (priority, arrival) instead of the most recently
admitted one (vLLM's scheduler: `max(self.running, key=lambda r: (r.priority, r.arrival_time))`). Under
"fcfs" a request's priority is accepted and ignored.

Prefix caching (optional): full prompt blocks are named by a chain hash of their tokens; a
new or recomputed sequence skips computing the leading blocks already computed by anyone
(at least one token is always computed). Simplification: cached blocks save compute only, the
sequence still holds its own blocks in the pool; the cache remembers at most the pool's size in
blocks (LRU).

Truth bookkeeping per sequence: first scheduling time, preemptions, and stall_ns = time after
its first token lost to others: a step it decodes in counts (step - same step without the
prefill work in it), a step it is not decoding in (preempted, recomputing, left out) counts
whole, and an engine stall (fault) counts whole.
"""
from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from loadgen.sim.profiles import BLOCK_SIZE, Profile


@dataclass(frozen=True)
class EngineConfig:
    max_num_seqs: int
    max_num_batched_tokens: int
    kv_capacity_tokens: int
    prefix_caching: bool = False
    policy: str = "fcfs"   # fcfs | priority (vLLM's --scheduling-policy; module docstring)

    @classmethod
    def from_profile(cls, p: Profile, *, max_num_seqs=None, max_num_batched_tokens=None,
                     kv_capacity_tokens=None, prefix_caching=False, policy="fcfs") -> "EngineConfig":
        return cls(max_num_seqs or p.max_num_seqs, max_num_batched_tokens or p.max_num_batched_tokens,
                   kv_capacity_tokens or p.kv_capacity_tokens, prefix_caching, policy)

    @property
    def kv_blocks(self) -> int:
        return self.kv_capacity_tokens // BLOCK_SIZE


class Request(Protocol):
    # What the engine needs from a request (EngineGeneration in the server, twin/predict's _Req, or a
    # test double).
    request_id: str
    arrival_ns: int
    max_tokens: int
    scheduled_ns: int | None
    preemptions: int
    stall_ns: int
    cached_tokens: int
    priority: int   # read under the "priority" policy only (lower first)

    @property
    def prompt(self) -> Sequence[Any]:  # the prompt's tokens: words (tokenizer.words), or ids if sent as ids
        ...


@dataclass(eq=False)
class Seq:
    req: Request
    order: int  # admission order (preemption victim = highest)
    num_output: int = 0
    num_computed: int = 0
    blocks: int = 0
    is_running: bool = False
    block_hashes: list[int] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return len(self.req.prompt) + self.num_output


@dataclass
class Step:
    start_ns: int
    end_ns: int
    items: list[tuple[Seq, int]]  # (sequence, new tokens computed in this step)
    decode_only_ns: int  # the same step without its prefill work (for stall accounting)
    prefill_tokens: int
    decode_tokens: int
    preempted: list[Seq]


class Engine:
    def __init__(self, profile: Profile, cfg: EngineConfig, speed: float = 1.0):
        self.profile, self.cfg, self.speed = profile, cfg, speed
        self.waiting: deque[Seq] = deque()
        self.running: list[Seq] = []
        self.free_blocks = cfg.kv_blocks
        self._order = 0
        self._cache: OrderedDict[int, None] = OrderedDict()  # prefix-cache block hashes, LRU
        self.num_preemptions = 0
        self.prefix_queries = self.prefix_hits = 0
        self.last_end_ns: int | None = None

    # --- requests in and out
    def add(self, req: Request) -> Seq:
        self.check(req)
        seq = Seq(req, order=0)
        self.waiting.append(seq)
        return seq

    def check(self, req: Request) -> None:
        if len(req.prompt) + req.max_tokens > min(self.profile.max_model_len, self.cfg.kv_capacity_tokens):
            raise ValueError(f"prompt ({len(req.prompt)} tokens) + max_tokens ({req.max_tokens}) exceeds "
                             f"the model length / KV capacity "
                             f"({min(self.profile.max_model_len, self.cfg.kv_capacity_tokens)} tokens)")
        if len(req.prompt) == 0:
            raise ValueError("the prompt is empty (0 tokens)")

    def drop(self, seq: Seq) -> None:  # client gone
        if seq.is_running:
            self.running.remove(seq)
            seq.is_running = False
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self._free(seq)

    def has_work(self) -> bool:
        return bool(self.running or self.waiting)

    def kv_usage(self) -> float:
        return 1.0 - self.free_blocks / self.cfg.kv_blocks

    # --- one step
    def _blocks_for(self, tokens: int) -> int:
        return -(-tokens // BLOCK_SIZE)

    def _free(self, seq: Seq) -> None:
        self.free_blocks += seq.blocks
        seq.blocks = 0

    def _grow(self, seq: Seq, new_tokens: int) -> bool:
        need = self._blocks_for(seq.num_computed + new_tokens) - seq.blocks
        if need > self.free_blocks:
            return False
        self.free_blocks -= need
        seq.blocks += need
        return True

    def _preempt(self, seq: Seq) -> None:
        self.running.remove(seq)
        seq.is_running = False
        self._free(seq)
        seq.num_computed = 0
        seq.req.preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(seq)  # fcfs: the head; priority: _next_waiting picks by (priority, arrival)

    @property
    def _by_priority(self) -> bool:
        return self.cfg.policy == "priority"

    def _victim(self) -> Seq:
        if self._by_priority:
            return max(self.running, key=lambda s: (s.req.priority, s.req.arrival_ns))
        return self.running[-1]  # the most recently admitted

    def _next_waiting(self, start_ns: int) -> Seq | None:
        """The waiting sequence to admit next, if it has arrived: the head (fcfs), or the least
        (priority, arrival) of those arrived (priority)."""
        if not self.waiting:
            return None
        if not self._by_priority:
            head = self.waiting[0]
            return head if head.req.arrival_ns <= start_ns else None
        arrived = [s for s in self.waiting if s.req.arrival_ns <= start_ns]
        return min(arrived, key=lambda s: (s.req.priority, s.req.arrival_ns)) if arrived else None

    def _prefix_hit(self, seq: Seq) -> None:
        ids = seq.req.prompt
        if not seq.block_hashes:
            h = 0
            for k in range(len(ids) // BLOCK_SIZE):
                h = hash((h, tuple(ids[k * BLOCK_SIZE:(k + 1) * BLOCK_SIZE])))
                seq.block_hashes.append(h)
        hit = 0
        for h in seq.block_hashes:
            if h not in self._cache:
                break
            self._cache.move_to_end(h)
            hit += BLOCK_SIZE
        hit = min(hit, seq.num_tokens - 1)
        self.prefix_queries += len(ids)
        self.prefix_hits += hit
        if hit > seq.num_computed:
            seq.num_computed = hit
            seq.req.cached_tokens = max(seq.req.cached_tokens, hit)

    def schedule(self, start_ns: int) -> Step | None:
        budget = self.cfg.max_num_batched_tokens
        items: list[tuple[Seq, int]] = []
        preempted: list[Seq] = []
        for seq in list(self.running):  # in admission order
            if budget == 0:
                break
            if not seq.is_running:  # preempted by an earlier one in this loop
                continue
            n = min(seq.num_tokens - seq.num_computed, budget)
            while not self._grow(seq, n):
                victim = self._victim()
                self._preempt(victim)
                preempted.append(victim)
                if victim is seq:
                    break
            if seq.is_running:
                items.append((seq, n))
                budget -= n
        if not preempted:
            while budget > 0 and len(self.running) < self.cfg.max_num_seqs:
                nxt = self._next_waiting(start_ns)
                if nxt is None:
                    break
                seq = nxt
                if self.cfg.prefix_caching and seq.num_computed == 0:
                    self._prefix_hit(seq)
                n = min(seq.num_tokens - seq.num_computed, budget)
                if not self._grow(seq, n):
                    break
                self.waiting.remove(seq)
                self._order += 1
                seq.order = self._order
                self.running.append(seq)
                seq.is_running = True
                if seq.req.scheduled_ns is None:
                    seq.req.scheduled_ns = start_ns
                items.append((seq, n))
                budget -= n
        if not items:
            return None
        step = self._timed(start_ns, items, preempted)
        self._account_stalls(step)
        return step

    def _account_stalls(self, step: Step) -> None:
        # charged when the step is planned: every sequence with a token and not done loses the
        # gap since the last step (an engine stall) and, unless it decodes in this step, the
        # whole step; if it decodes, the step's extra time over a decode-only step
        dur = step.end_ns - step.start_ns
        gap = 0 if self.last_end_ns is None else max(0, step.start_ns - self.last_end_ns)
        self.last_end_ns = step.end_ns
        decoding = {id(s) for s, n in step.items if not self._in_prefill(s)}
        extra = dur - step.decode_only_ns
        for seq in self.running:
            if seq.num_output:
                seq.req.stall_ns += gap + (extra if id(seq) in decoding else dur)
        for seq in self.waiting:
            if seq.num_output:
                seq.req.stall_ns += gap + dur

    def _timed(self, start_ns: int, items: list[tuple[Seq, int]], preempted: list[Seq]) -> Step:
        def cost(sel: list[tuple[Seq, int]]) -> int:
            tokens = sum(n for _, n in sel)
            kv_read = sum(s.num_computed + n for s, n in sel)
            pairs = sum(n * s.num_computed + n * (n + 1) // 2 for s, n in sel)
            prefill = any(self._in_prefill(s) for s, _ in sel)
            return round(self.profile.step_ns(tokens, len(sel), kv_read, pairs, prefill) / self.speed) if sel else 0

        decodes = [(s, n) for s, n in items if not self._in_prefill(s)]
        dur = cost(items)
        return Step(start_ns, start_ns + dur, items, cost(decodes),
                    prefill_tokens=sum(n for s, n in items if self._in_prefill(s)),
                    decode_tokens=len(decodes), preempted=preempted)

    def _in_prefill(self, seq: Seq) -> bool:
        # computing prompt (or recomputing after preemption) rather than decoding one token
        return seq.num_tokens - seq.num_computed > 1 or seq.num_output == 0

    def complete(self, step: Step) -> list[tuple[Seq, bool]]:
        """Apply a step at its end; returns (sequence, finished) for each one that produced a
        token at step.end_ns."""
        out = []
        for seq, n in step.items:
            seq.num_computed += n
            if self.cfg.prefix_caching and seq.num_computed - n < len(seq.req.prompt):
                # prompt blocks completed by this step become cached
                lo = (seq.num_computed - n) // BLOCK_SIZE
                for h in seq.block_hashes[lo: min(seq.num_computed, len(seq.req.prompt)) // BLOCK_SIZE]:
                    self._cache[h] = None
                    self._cache.move_to_end(h)
                while len(self._cache) > self.cfg.kv_blocks:
                    self._cache.popitem(last=False)
            if seq.num_computed == seq.num_tokens:
                seq.num_output += 1
                done = seq.num_output >= seq.req.max_tokens
                if done:
                    self.running.remove(seq)
                    seq.is_running = False
                    self._free(seq)
                out.append((seq, done))
        return out
