"""How `--workers` splits a plan (loadgen/run/workers.py): whole sessions, round-robin, and `auto` by rate."""
import dataclasses

import numpy as np
import pytest

from loadgen.config import workload as config
from loadgen.plan.schedule import build
from loadgen.run.workers import WORKER_CHUNKS_PER_S, assign, count_for
from tests.integration.conftest import workload


def load(tmp_path, **kw):
    return config.load(workload(tmp_path, **kw))


def test_single_requests_are_dealt_round_robin_in_plan_order(tmp_path):
    s = build(load(tmp_path, requests=10))
    assert assign(s, 3).tolist() == [0, 1, 2, 0, 1, 2, 0, 1, 2, 0]


def test_every_session_stays_in_one_worker_and_the_shares_are_even(tmp_path):
    extra = '[session]\nturns = { dist = "uniform", min = 1, max = 5 }\nthink_ms = 100\n'
    s = build(load(tmp_path, requests=200, extra=extra))
    owner = assign(s, 4)
    sessions = {}
    for sess, w in zip(s.session.tolist(), owner.tolist()):
        sessions.setdefault(sess, set()).add(w)
    assert len(sessions) > 40 and all(len(ws) == 1 for ws in sessions.values())
    per_worker = np.bincount([next(iter(ws)) for ws in sessions.values()], minlength=4)
    assert per_worker.max() - per_worker.min() <= 1  # sessions dealt in turn


def test_auto_takes_one_worker_per_chunk_budget(tmp_path):
    c = load(tmp_path, rate="1000/s", requests=2000, max_tokens=64)  # 64 000 chunks/s
    s = build(c)
    want = int(np.ceil(s.offered_rate_per_s() * 64 / WORKER_CHUNKS_PER_S))
    assert count_for(dataclasses.replace(c, workers=0), s) == min(want, __import__("os").cpu_count())
    slow = load(tmp_path, rate="5/s", requests=20, max_tokens=64)
    assert count_for(dataclasses.replace(slow, workers=0), build(slow)) == 1
    assert count_for(dataclasses.replace(slow, workers=3), build(slow)) == 3


@pytest.mark.parametrize("value, want", [("auto", 0), ("1", 1), ("8", 8)])
def test_the_workers_flag(tmp_path, value, want):
    assert config.load(workload(tmp_path), {"--workers": value}).workers == want


@pytest.mark.parametrize("value", ["0", "-1", "two", "2000"])
def test_a_bad_workers_flag_names_the_flag(tmp_path, value):
    with pytest.raises(config.ConfigError) as e:
        config.load(workload(tmp_path), {"--workers": value})
    assert any(p.startswith("--workers:") for p in e.value.problems)


def test_ray_without_ray_says_how_to_get_it(tmp_path, monkeypatch):
    from loadgen.run import ray_workers

    from loadgen.run import launch

    monkeypatch.setattr(ray_workers, "available", lambda: False)
    c = config.load(workload(tmp_path), {"--ray": "auto"})  # Ray is looked for when the run starts
    with pytest.raises(config.ConfigError) as e:
        launch.run_workload(c, progress=None)
    assert "pip install 'loadgen[ray]'" in " ".join(e.value.problems)


def test_ray_defaults_to_auto_workers(tmp_path):
    c = config.load(workload(tmp_path), {"--ray": "10.0.0.1:6379"})
    assert c.ray == "10.0.0.1:6379" and c.workers == 0
