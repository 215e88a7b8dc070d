"""The plan of a run: every request's intended send time and shape, computed up front from the config
and its seed as a pure function (no clock, no network). `loadgen schedule` prints it; the runner
executes it (or one slice of it).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from loadgen import arrivals
from loadgen.config import Lengths, RunConfig

# Sub-seeds per random stream, so changing one stream (e.g. output lengths) leaves the others intact.
_ARRIVAL_STREAM, _PROMPT_STREAM, _OUTPUT_STREAM, _TEXT_STREAM = 0, 1, 2, 3


@dataclass(frozen=True)
class Schedule:
    intended_ns: np.ndarray     # int64, sorted, ns from t0
    prompt_tokens: np.ndarray   # int64
    max_tokens: np.ndarray      # int64
    warmup: np.ndarray          # bool: sent, but left out of statistics
    seed: int

    def __len__(self) -> int:
        return len(self.intended_ns)

    def offered_rate_per_s(self) -> float:
        """The rate the plan offers: (n - 1) / span of intended times (nan below two requests)."""
        if len(self) < 2 or self.intended_ns[-1] == self.intended_ns[0]:
            return float("nan")
        return (len(self) - 1) * 1e9 / float(self.intended_ns[-1] - self.intended_ns[0])


def sub_seed(seed: int, stream: int) -> np.random.SeedSequence:
    return np.random.SeedSequence([seed, stream])


def build(config: RunConfig) -> Schedule:
    a = config.arrivals
    seed = int(np.random.default_rng(sub_seed(config.seed, _ARRIVAL_STREAM)).integers(2**63))
    bound = {"n": config.requests} if config.requests is not None else {"duration_ns": config.duration_ns}
    if a.process == "poisson":
        intended = arrivals.poisson(a.rate_per_s, seed=seed, **bound)
    elif a.process == "gamma":
        intended = arrivals.gamma(a.rate_per_s, a.burstiness, seed=seed, **bound)
    else:
        intended = arrivals.constant(a.rate_per_s, **bound)
    n = len(intended)
    warmup = np.zeros(n, dtype=bool)
    warmup[: min(config.warmup_requests, n)] = True
    return Schedule(
        intended_ns=intended,
        prompt_tokens=sample_lengths(config.prompt_tokens, n, sub_seed(config.seed, _PROMPT_STREAM)),
        max_tokens=sample_lengths(config.output_tokens, n, sub_seed(config.seed, _OUTPUT_STREAM)),
        warmup=warmup,
        seed=config.seed,
    )


def sample_lengths(spec: Lengths, n: int, seed: np.random.SeedSequence) -> np.ndarray:
    if spec.dist == "uniform":
        return np.random.default_rng(seed).integers(spec.min, spec.max + 1, n, dtype=np.int64)
    return np.full(n, spec.value, dtype=np.int64)


def text_seed(config: RunConfig) -> np.random.SeedSequence:
    return sub_seed(config.seed, _TEXT_STREAM)
