"""A field changed after loading (the sweep's rate, the discovered model, the worker count) is validated
again (config.workload.with_overrides): a bad one is a ConfigError naming the field and who set it."""
import subprocess
import sys
from dataclasses import replace

import pytest

from loadgen.config import workload as config
from loadgen.config.workload import ConfigError, with_overrides
from loadgen.run.sweep import SweepSpec, run_sweep
from tests.unit.test_config import GOOD, write


@pytest.fixture
def cfg(tmp_path):
    return config.load(write(tmp_path, GOOD))


@pytest.mark.parametrize("rate, expected", [
    (0.0, "sweep: arrivals.rate_per_s: bad rate 0.0: must be > 0"),
    (-2.0, "sweep: arrivals.rate_per_s: bad rate -2.0: must be > 0"),
    (float("nan"), "sweep: arrivals.rate_per_s: bad rate nan: must be > 0"),
    (1e-9, "below 1e-06/s"),
])
def test_a_bad_rate_is_named(cfg, rate, expected):
    with pytest.raises(ConfigError) as e:
        with_overrides(cfg, "sweep", arrivals=replace(cfg.arrivals, rate_per_s=rate))
    assert any(expected in p for p in e.value.problems), e.value.problems


@pytest.mark.parametrize("changes, expected", [
    ({"workers": 2000}, "--workers: workers: expected a number of processes (1-1024)"),
    ({"model": ""}, "--workers: model: must be a non-empty string"),
    ({"request_timeout_ns": 0}, "--workers: request_timeout_ns: must be > 0"),
    ({"warmup_requests": 10}, "--workers: warmup_requests: must be less than requests (10), got 10"),
    ({"url": "localhost:8000"}, "--workers: url: must start with http://"),
    ({"no_such_field": 1}, "no_such_field"),
])
def test_bad_fields_are_named(cfg, changes, expected):
    with pytest.raises((ConfigError, TypeError)) as e:
        with_overrides(cfg, "--workers", **changes)
    assert expected in str(e.value), str(e.value)


def test_good_changes_pass_and_every_problem_is_reported(cfg):
    new = with_overrides(cfg, "sweep", arrivals=replace(cfg.arrivals, rate_per_s=float("inf")), workers=0,
                         model="m2", out="results/x", calibrate=False)
    assert (new.arrivals.rate_per_s, new.workers, new.model, new.calibrate) == (float("inf"), 0, "m2", False)
    with pytest.raises(ConfigError) as e:
        with_overrides(cfg, "", workers=-1, max_cv_deviation=0.0)
    assert len(e.value.problems) == 2


def test_a_sweep_with_a_bad_rate_stops_before_any_point(cfg, tmp_path):
    ran = []
    with pytest.raises(ConfigError, match=r"sweep: arrivals.rate_per_s: bad rate 0.0: must be > 0"):
        run_sweep(cfg, SweepSpec(rates=(0.0, 2.0)), tmp_path / "sw", progress=None,
                  run_point=lambda c, progress=None: ran.append(c))
    assert ran == [] and not (tmp_path / "sw").exists()


@pytest.mark.parametrize("rates, expected", [
    ("0,2", "--rates: bad rate '0/s': must be > 0"),
    ("-1,2", "--rates: bad rate '-1/s'"),
])
def test_the_sweep_cli_names_a_bad_rate(tmp_path, rates, expected):
    p = subprocess.run([sys.executable, "-m", "loadgen", "sweep", str(write(tmp_path, GOOD)), f"--rates={rates}",
                        "--out", str(tmp_path / "sw")], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and expected in p.stderr and "Traceback" not in p.stderr, p.stderr
    assert not (tmp_path / "sw").exists()
