"""Prediction intervals of the twin (docs/twin.md, "Intervals").

`loadgen fit` fits the model to the rounds' centers (the profile) and, the same form, to each complete
probe round alone (the profile's [[rounds]] tables). A CPU server on a shared host runs in speed phases of
seconds to minutes, and prefill and decode move apart: the rounds disagree by that much. `loadgen predict`
runs the plan through the engine once with the profile (the point) and once per round's profile, and gives
each figure (a percentile, a completion rate, the capacity, the knee) an interval at a stated level:

    point x exp(+- t(level, n - 1) x sqrt(s^2 x (1 + 1/n) + m^2 + r^2))

s the standard deviation of the log of the n round predictions of that figure, t Student's quantile at
(1 + level) / 2: the prediction interval of one more draw (the run to come) from the distribution the
rounds sampled, its spread estimated from n draws. In logs, because speeds multiply; through the engine,
because a figure can amplify a speed change (a median between two modes, queueing near the knee) or damp it.
m = log(1 + the fit's rms relative residual over its probes) ([fit] rms_rel): the model's misfit, the same
in every round, which the rounds' spread cannot show; a figure is not known better than the probes are
described. r = a recheck's standard error ([recheck] se_log; 0 without one: twin/recheck.py), the
uncertainty of the speed it scaled the profile to. What the interval does not know: a phase longer than the
fit that the fit never saw (a longer --budget samples more), a server restarted or moved since the fit (a
recheck measures it), or a host that takes the server's CPU more than it did during the fit.
"""
from __future__ import annotations

import math
import statistics
import tomllib
from collections.abc import Sequence
from dataclasses import MISSING, dataclass
from pathlib import Path

from loadgen.analysis.repeats import t_quantile
from loadgen.sim.profiles import Profile
from loadgen.twin.fit_model import Coefficients, EngineLimits, to_profile

LEVEL = 0.8   # predict's default --level


def band(point: float | None, rounds: Sequence[float | None], level: float, misfit_rel: float = 0.0,
         recheck_se_log: float = 0.0) -> list[float] | None:
    """[low, high] around `point` from the rounds' predictions of the same figure and the fit's misfit (the
    module's rule); None without a point or with fewer than 2 positive round values."""
    v = [math.log(x) for x in rounds if x is not None and x > 0]
    if point is None or point <= 0 or len(v) < 2:
        return None
    spread = statistics.variance(v) * (1 + 1 / len(v)) + math.log1p(misfit_rel) ** 2 + recheck_se_log ** 2
    half = t_quantile((1 + level) / 2, len(v) - 1) * math.sqrt(spread)
    return [point * math.exp(-half), point * math.exp(half)]


@dataclass(frozen=True)
class Spread:
    """What a fitted profile says of its own uncertainty: each complete round's profile, the fit's rms
    relative residual over its probes, and a recheck's standard error (twin/recheck.py)."""
    rounds: list[Profile]
    misfit_rel: float = 0.0
    recheck_se_log: float = 0.0


def load_spread(path: str, profile: Profile) -> Spread:
    """The [[rounds]] of a profile file written by `loadgen fit`, each as a Profile with the file's limits,
    its [fit] rms_rel and its [recheck] se_log (none for a shipped profile or a file without them). ValueError
    naming the file, the round and the key."""
    if not path.endswith(".toml") and not Path(path).exists():
        return Spread([])   # a shipped profile's name
    data = tomllib.loads(Path(path).read_text())
    rms, se = _number(path, data, "fit", "rms_rel"), _number(path, data, "recheck", "se_log")
    return Spread(_rounds(path, data.get("rounds", []), profile), rms, se)


def _number(path: str, data: dict, table: str, key: str) -> float:
    v = (data.get(table) or {}).get(key, 0.0)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < 10:
        raise ValueError(f"{path}: [{table}] '{key}' must be a number from 0 to 10, got {v!r}")
    return float(v)


def _rounds(path: str, rounds: object, profile: Profile) -> list[Profile]:
    if not isinstance(rounds, list):
        raise ValueError(f"{path}: 'rounds' must be an array of tables ([[rounds]])")
    lim = EngineLimits(profile.model_name, profile.max_num_seqs, profile.max_num_batched_tokens,
                       profile.max_model_len, profile.params, profile.weight_bytes or None)
    out = []
    for i, r in enumerate(rounds, 1):
        values, problems = {}, []
        for name, f in Coefficients.__dataclass_fields__.items():
            v = r.get(f"{name}_us", None if f.default is MISSING else f.default * 1e6) if isinstance(r, dict) else None
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                problems.append(f"'{name}_us' must be a number >= 0, got {v!r}")
            else:
                values[name] = v * 1e-6
        if problems:
            raise ValueError(f"{path}: [[rounds]] #{i}: " + "; ".join(problems))
        out.append(to_profile(Coefficients(**values), lim, f"{profile.name} round {i}", profile.description,
                              profile.memory_compute))
    return out
