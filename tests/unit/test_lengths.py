"""Length distributions: reproducible by seed, right moments, clipped to their bounds."""
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loadgen.config import lengths as length_spec
from loadgen.plan import lengths
from loadgen.config.lengths import Lengths


def seed(s: int) -> np.random.SeedSequence:
    return np.random.SeedSequence([s, 1])


def parse(v, base_dir=Path(".")):
    problems = []
    spec = length_spec.parse(v, "prompt.tokens", lambda k, m: problems.append(f"{k}: {m}"), base_dir)
    return spec, problems


SPECS = [
    Lengths("uniform", min=5, max=50),
    Lengths("normal", mean=300, sd=80, min=1, max=1000),
    Lengths("lognormal", median=200, sigma=0.8, min=1, max=8192),
    Lengths("empirical", values=(3, 9, 27)),
    Lengths("mixture", weights=(0.7, 0.3), components=(Lengths(value=100), Lengths("uniform", min=1000, max=2000))),
]


@settings(max_examples=25, deadline=None)
@given(s=st.integers(0, 2**32), which=st.integers(0, len(SPECS) - 1))
def test_same_seed_same_lengths_within_bounds(s, which):
    spec = SPECS[which]
    a = lengths.sample(spec, 300, seed(s))
    assert np.array_equal(a, lengths.sample(spec, 300, seed(s)))
    assert a.dtype == np.int64 and a.min() >= max(1, spec.min) and a.max() <= (spec.max or length_spec.DEFAULT_MAX)


@settings(max_examples=15, deadline=None)
@given(s=st.integers(0, 2**32), mean=st.floats(200, 2000), sd=st.floats(1, 50))
def test_normal_mean_and_sd(s, mean, sd):
    # Far from the clip bounds: the sample mean is within 5 standard errors, the sd within 10 %.
    a = lengths.sample(Lengths("normal", mean=mean, sd=sd, min=1, max=10**6), 20_000, seed(s))
    assert abs(a.mean() - mean) < 5 * sd / math.sqrt(20_000) + 0.5
    assert abs(a.std() - sd) < 0.1 * sd + 0.5


@settings(max_examples=15, deadline=None)
@given(s=st.integers(0, 2**32), median=st.floats(50, 2000), sigma=st.floats(0.1, 1.5))
def test_lognormal_median_and_log_sd(s, median, sigma):
    a = lengths.sample(Lengths("lognormal", median=median, sigma=sigma, min=1, max=10**7), 20_000, seed(s))
    logs = np.log(a)
    assert abs(np.median(a) / median - 1) < 0.05 + 1 / median
    assert abs(logs.std() - sigma) < 0.05 * sigma + 0.02


def test_normal_is_clipped_to_its_bounds():
    # mean at the lower bound: about half the mass piles onto min.
    a = lengths.sample(Lengths("normal", mean=10, sd=20, min=10, max=30), 10_000, seed(0))
    assert a.min() == 10 and a.max() == 30 and 0.4 < np.mean(a == 10) < 0.6


def test_mixture_weights():
    a = lengths.sample(SPECS[4], 20_000, seed(3))
    share = np.mean(a == 100)
    assert abs(share - 0.7) < 5 * math.sqrt(0.7 * 0.3 / 20_000)
    assert np.all((a == 100) | ((a >= 1000) & (a <= 2000)))


def test_empirical_resamples_only_given_values_in_proportion():
    a = lengths.sample(Lengths("empirical", values=(3, 9, 9, 27)), 20_000, seed(1))
    assert set(a.tolist()) == {3, 9, 27}
    assert abs(np.mean(a == 9) - 0.5) < 0.03


@pytest.mark.parametrize("raw,expected", [
    # unknown key for the chosen dist
    ({"dist": "normal", "mean": 5, "sd": 1, "median": 3}, "prompt.tokens.median: unknown key for dist 'normal'"),
    # missing parameter
    ({"dist": "lognormal", "sigma": 1}, "prompt.tokens.median: missing"),
    # sd must not be negative
    ({"dist": "normal", "mean": 5, "sd": -1}, "prompt.tokens.sd: must be a number >= 0"),
    # empirical: values or trace, not neither
    ({"dist": "empirical"}, "prompt.tokens: empirical needs exactly one of values"),
    ({"dist": "empirical", "values": [1, 0]}, "prompt.tokens.values: must be a non-empty list of integers >= 1"),
    ({"dist": "empirical", "trace": "nope.csv"}, "prompt.tokens.trace: no such file"),
    ({"dist": "empirical", "trace": "x.csv", "format": "tsv"}, "prompt.tokens.format: must be one of azure"),
    ({"dist": "cycle", "values": []}, "prompt.tokens.values: must be a non-empty list"),
    # mixture weights must be positive, components must not nest
    ({"dist": "mixture", "components": [{"weight": 0, "value": 3}]}, "components[0].weight: must be a number > 0"),
    ({"dist": "mixture", "components": [{"weight": 1, "dist": "mixture", "components": []}]},
     "a mixture cannot nest another mixture"),
    ({"dist": "uniform", "min": 9, "max": 3}, "prompt.tokens: min (9) must be <= max (3)"),
    ({"dist": "zipf"}, "prompt.tokens.dist: must be one of"),
])
def test_bad_specs_name_the_key(raw, expected):
    _, problems = parse(raw)
    assert any(expected in p for p in problems), problems


def test_good_specs_parse_without_problems():
    spec, problems = parse({"dist": "mixture", "components": [
        {"weight": 7, "dist": "lognormal", "median": 150, "sigma": 0.6},
        {"weight": 3, "dist": "normal", "mean": 3000, "sd": 500, "max": 8000}]})
    assert problems == [] and spec.weights == (0.7, 0.3) and spec.components[1].max == 8000
