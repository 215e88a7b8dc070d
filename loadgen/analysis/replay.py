"""When did the server schedule each request? A replay of a FCFS continuous-batching scheduler on the
engine steps the client saw (steps.py), fitted to the first-token steps it saw.

Model (vLLM V1's scheduler; loadgen/sim/engine.py): at the start of every step, requests already
admitted get their tokens first (a decode needs 1, a partly prefilled prompt the rest of it) within a
token budget of T tokens per step; then waiting requests are admitted first-come-first-served while
budget is left and fewer than S requests hold a seat; a prompt larger than the budget left is split
over steps (chunked prefill). A request's first token comes at the end of the step that computes its
last prompt token; it holds its seat until its last token.

The client knows every request's send time (its arrival, to the network delay), prompt tokens, and the
clusters of stamps that mark step ends (B_i, steps.boundaries): cluster kf[r] holds r's first token,
kl[r] its last. Replaying that model over the observed steps for a budget T and a seat count S gives
each request's admission step and its predicted first-token cluster. Decodes are not replayed: the
step starting at B_i decodes every request r with kf[r] <= i < kl[r] (observed), and a seat frees at
kl[r]. An engine with nothing to do starts its next step when the next request arrives.

(T, S) is unknown to the client (engine flags), so `fit` tries a grid (budgets BUDGETS, seats from the
smallest count the stamps allow upwards) and keeps the pair whose replay puts the most first tokens in
their observed cluster. A request whose replayed first token lands in the observed cluster is `matched`:
its admission time is then known to the step (the replay reproduced what the client saw). Queue and
prefill of the others stay the step-excess walk's estimate (steps.scheduled_ns): something the model
leaves out held them (KV capacity, preemption, an invisible step).

All times are client CLOCK_MONOTONIC ns from t0 (int64).
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

# Token budgets tried (vLLM's max_num_batched_tokens: 8192 for chunked prefill by default, 512-2048 in
# latency-tuned deployments; the last stands for "no chunking").
BUDGETS = (256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 1 << 40)
NO_LIMIT = 1 << 40


@dataclass(frozen=True)
class Replay:
    sched_ns: np.ndarray     # replayed admission time per request (ns); -1 where never admitted
    first_idx: np.ndarray    # replayed cluster of the first token; -1 where the replay never finished it
    budget_tokens: int
    seats: int
    matched: np.ndarray      # bool: first_idx == the observed cluster
    budget_bound: bool       # the budget held someone back (a larger budget may replay differently)
    seats_bound: bool        # so did the seats


def clusters(B: np.ndarray, t_ns: np.ndarray) -> np.ndarray:
    """Index of the cluster (B sorted cluster starts) holding each stamp: the latest B_i <= t."""
    return np.searchsorted(B, t_ns, side="right") - 1


def seats_lower_bound(kf: np.ndarray, kl: np.ndarray) -> int:
    """The fewest seats the stamps allow: the most requests decoding in one step (r decodes in the steps
    after cluster kf[r] up to its last token's cluster kl[r], and holds a seat meanwhile)."""
    if len(kf) == 0:
        return 1
    kf_sorted, kl_sorted = np.sort(kf), np.sort(kl)
    holding = np.searchsorted(kf_sorted, kf, side="right") - np.searchsorted(kl_sorted, kf, side="right")
    return max(1, int(holding.max()))


def replay(B: np.ndarray, sent_ns: np.ndarray, prompt_tokens: np.ndarray, kf: np.ndarray, kl: np.ndarray,
           budget_tokens: int, seats: int) -> Replay:
    """Requests sorted by sent_ns (the FCFS order). B: sorted cluster starts (ns)."""
    n, nb = len(sent_ns), len(B)
    sched = np.full(n, -1, dtype=np.int64)
    first = np.full(n, -1, dtype=np.int64)
    idx = np.arange(-1, nb)  # per boundary index i (from -1: before the first), at offset i + 1
    dec_at = (np.searchsorted(np.sort(kf), idx, side="right")
              - np.searchsorted(np.sort(kl), idx, side="right")).tolist()  # decoding in the step from B_i
    fin_at = np.searchsorted(np.sort(kl), idx, side="right").tolist()     # last tokens by B_i
    budget_bound = seats_bound = False

    def start_after_idle(a: int) -> tuple[int, int]:
        # (step start, its boundary index) for a request arriving at `a` to an engine with no prefill to
        # do: a step in progress (someone decodes) ends at the next boundary, which starts the next
        # step; else a step starts at once
        i = int(np.searchsorted(B, a, side="right")) - 1
        return (int(B[i + 1]), i + 1) if i + 1 < nb and dec_at[i + 1] > 0 else (a, i)

    queue: deque[list[int]] = deque()  # [request, prompt tokens left], FCFS; admitted ones first
    nxt = 0       # next request (by send time) not yet in the queue
    admitted = 0  # requests admitted so far (seat holders + finished)
    t, i = start_after_idle(int(sent_ns[0])) if n else (0, -1)
    while nxt < n or queue:
        while nxt < n and sent_ns[nxt] <= t:
            queue.append([nxt, int(prompt_tokens[nxt])])
            nxt += 1
        budget = max(budget_tokens - max(dec_at[i + 1], 0), 0)
        seats_free = seats - (admitted - fin_at[i + 1])
        for item in queue:  # consumption is in order: the items completed form a prefix
            if budget <= 0:
                budget_bound = True
                break
            r = item[0]
            if sched[r] < 0:
                if seats_free <= 0:
                    seats_bound = True
                    break  # FCFS: the head waits for a seat, and so does everyone behind it
                sched[r] = t
                admitted += 1
                seats_free -= 1
            take = min(item[1], budget)
            item[1] -= take
            budget -= take
            if item[1] == 0:
                first[r] = i + 1
            else:
                budget_bound = True  # chunked
        if i + 1 >= nb:
            break  # no step end after t: the stamps stop here
        while queue and queue[0][1] == 0:
            queue.popleft()
        if queue or dec_at[i + 2] > 0 or (nxt < n and sent_ns[nxt] <= B[i + 1]):
            t, i = int(B[i + 1]), i + 1
        elif nxt < n:
            t, i = start_after_idle(int(sent_ns[nxt]))
        else:
            break
    first[first >= nb] = -1
    return Replay(sched, first, budget_tokens, seats, first == kf, budget_bound, seats_bound)


def fit(B: np.ndarray, sent_ns: np.ndarray, prompt_tokens: np.ndarray, first_ns: np.ndarray,
        last_ns: np.ndarray) -> Replay | None:
    """The best (budget, seats) on the grid: most matched first tokens; ties go to the larger budget and
    then the larger seat count (the fewer limits the data needs). Requests sorted by sent_ns."""
    if len(B) < 2 or len(sent_ns) == 0:
        return None
    kf, kl = clusters(B, first_ns), clusters(B, last_ns)
    s_min = seats_lower_bound(kf, kl)
    best: Replay | None = None

    def better(a: Replay) -> bool:
        return best is None or (int(a.matched.sum()), a.budget_tokens, a.seats) > (
            int(best.matched.sum()), best.budget_tokens, best.seats)

    def budgets(seats: int) -> None:
        nonlocal best
        for budget in BUDGETS:
            rp = replay(B, sent_ns, prompt_tokens, kf, kl, budget, seats)
            if better(rp):
                best = rp
            if not rp.budget_bound:
                break  # no budget held anyone back: a larger one replays the same

    budgets(NO_LIMIT)  # the budget alone first
    assert best is not None  # budgets() keeps its first replay at least
    # then the seat limit at that budget: the bound and just above it (a binding limit is usually
    # reached by the decoders alone), then doubling
    seats = [s_min, s_min + 1, s_min + 2]
    while seats[-1] * 2 < len(sent_ns):
        seats.append(seats[-1] * 2)
    at_budget = best.budget_tokens
    for s in seats:
        rp = replay(B, sent_ns, prompt_tokens, kf, kl, at_budget, s)
        if better(rp):
            best = rp
        if not rp.seats_bound:
            break
    if best.seats != NO_LIMIT:
        budgets(best.seats)  # a small budget can mimic a seat limit: the budget again, at those seats
    return best


def window(B: np.ndarray, sent_ns: np.ndarray, first_ns: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The scheduling times the stamps alone allow, per request: from the first step start at or after
    its send (the send itself when no boundary lies between send and first token) to the start of the
    step that produced its first token (the send when that step started before it)."""
    if len(B) == 0:
        return sent_ns.copy(), sent_ns.copy()
    kf = clusters(B, first_ns)
    hi = np.maximum(sent_ns, B[np.clip(kf - 1, 0, None)])
    hi = np.where(kf >= 1, hi, sent_ns)
    j = np.searchsorted(B, sent_ns, side="left")
    lo = np.where(j < kf, B[np.clip(j, 0, len(B) - 1)], sent_ns)
    return np.minimum(lo, hi), hi
