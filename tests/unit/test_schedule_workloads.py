"""The plan for production-shaped workloads: mixtures, prefixes, sessions, trace replay; and the keys'
validation (every problem at once, file and key named)."""
import textwrap
from pathlib import Path

import numpy as np
import pytest

from loadgen.config import workload as config
from loadgen.plan import traces
from loadgen.config.workload import ConfigError
from loadgen.plan.schedule import NONE, build, plan_records

ROOT = Path(__file__).resolve().parents[2]
BASE = """
model = "m"
api = "chat"
seed = 5
[arrivals]
process = "poisson"
rate = "4/s"
[run]
requests = 200
[prompt]
tokens = 300
[output]
tokens = 20
"""


def load(tmp_path, extra: str = "", base: str = BASE, overrides=None):
    p = tmp_path / "w.toml"
    p.write_text(textwrap.dedent(base) + textwrap.dedent(extra))
    return config.load(p, overrides)


def test_plan_is_reproducible(tmp_path):
    c = load(tmp_path, "[prefix]\ntokens = 100\ngroups = 3\nfraction = 0.5\n")
    a, b = build(c), build(c)
    for col in ("intended_ns", "prompt_tokens", "max_tokens", "prefix_group"):
        assert np.array_equal(getattr(a, col), getattr(b, col))


def test_shared_prefix_groups_and_fraction(tmp_path):
    s = build(load(tmp_path, "[prefix]\ntokens = 100\ngroups = 3\nfraction = 0.5\n"))
    shares = s.prefix_group != NONE
    assert set(s.prefix_group[shares].tolist()) == {0, 1, 2}
    assert abs(shares.mean() - 0.5) < 5 * np.sqrt(0.25 / 200)
    # the prefix counts inside the prompt: 300 tokens = 100 shared + 200 own
    assert np.all(s.new_tokens[shares] == 200) and np.all(s.new_tokens[~shares] == 300)
    assert np.all(s.prompt_tokens == 300) and s.prefix_tokens == 100


def test_sessions_chain_turns_and_carry_history(tmp_path):
    base = BASE.replace("requests = 200", "requests = 5")
    s = build(load(tmp_path, "[session]\nturns = 3\nthink_ms = 2000\n", base=base))
    assert len(s) == 15
    assert s.session.tolist() == [i // 3 for i in range(15)] and s.turn.tolist() == [i % 3 for i in range(15)]
    assert s.after.tolist() == [NONE if i % 3 == 0 else i - 1 for i in range(15)]
    assert np.all(s.intended_ns[s.turn > 0] == NONE) and np.all(s.think_ns[s.turn > 0] == 2_000_000_000)
    # turn t's planned prompt = the earlier user messages and replies + its own message
    first = s.prompt_tokens[0]
    assert s.prompt_tokens[1] == first + 20 + s.new_tokens[1]
    recs = plan_records(s)
    assert recs[1]["intended_ns"] is None and recs[1]["turn"] == 1 and recs[0]["after"] is None


def test_joint_mix_classes_draw_prompt_and_output_together(tmp_path):
    c = load(tmp_path, """
        [[mix]]
        weight = 0.7
        prompt = { dist = "uniform", min = 50, max = 100 }
        output = 300
        [[mix]]
        weight = 0.3
        prompt = { dist = "uniform", min = 4000, max = 5000 }
        output = 20
        """)
    s = build(c)
    long = s.prompt_tokens >= 4000
    assert np.all(s.max_tokens[long] == 20) and np.all(s.max_tokens[~long] == 300)
    assert abs(long.mean() - 0.3) < 5 * np.sqrt(0.21 / 200)


def test_empirical_from_one_trace_keeps_pairs(tmp_path):
    trace = ROOT / "workloads" / "traces" / "loadgen_synthetic.jsonl"
    base = BASE.replace("tokens = 300", f'tokens = {{ dist = "empirical", trace = "{trace}" }}').replace(
        "tokens = 20", f'tokens = {{ dist = "empirical", trace = "{trace}" }}')
    s = build(load(tmp_path, base=base))
    t = traces.read(trace)
    pairs = set(zip(t.prompt_tokens.tolist(), t.output_tokens.tolist()))
    assert all(p in pairs for p in zip(s.prompt_tokens.tolist(), s.max_tokens.tolist()))


@pytest.mark.parametrize("name", ["azure_synthetic.csv", "burstgpt_synthetic.csv", "mooncake_synthetic.jsonl",
                                  "loadgen_synthetic.jsonl"])
def test_trace_flag_replaces_arrivals_and_lengths(tmp_path, name):
    path = str(ROOT / "workloads" / "traces" / name)
    c = load(tmp_path, overrides={"--trace": path, "--time-scale": "2"})
    s = build(c)
    t = traces.read(path)
    assert len(s) == min(len(t), 200)  # run.requests still bounds the replay
    want = np.rint((t.timestamps_ns[:len(s)] - t.timestamps_ns[0]) * 2.0).astype(np.int64)
    assert np.array_equal(s.intended_ns, want)
    assert np.array_equal(s.prompt_tokens, t.prompt_tokens[:len(s)])
    if name.startswith("mooncake"):
        firsts = [b[0] for b in s.blocks]
        # a row's group is its first block id when another row starts with that block too, else null
        assert s.prefix_group.tolist() == [f if firsts.count(f) > 1 else NONE for f in firsts]
        assert (s.prefix_group != NONE).sum() > len(s) // 2


def test_trace_times_only_keeps_the_workload_lengths(tmp_path):
    path = ROOT / "workloads" / "traces" / "burstgpt_synthetic.csv"
    s = build(load(tmp_path, f'[trace]\nfile = "{path}"\nlengths = false\n'))
    assert np.all(s.prompt_tokens == 300) and np.all(s.max_tokens == 20) and len(s) == 200


def test_trace_target_rate_and_window(tmp_path):
    path = ROOT / "workloads" / "traces" / "azure_synthetic.csv"
    c = load(tmp_path, f'[trace]\nfile = "{path}"\nrate = "10/s"\nstart = "5s"\nlimit = 50\n',
             base=BASE.replace("[run]\nrequests = 200\n", "[run]\n"))
    s = build(c)
    assert len(s) == 50 and s.offered_rate_per_s() == pytest.approx(10.0, rel=1e-6)


def test_ramp_and_stages_from_the_file(tmp_path):
    ramp = load(tmp_path, base=BASE.replace('process = "poisson"', 'process = "ramp"\nrate_from = "1/s"\nramp = "30s"'))
    assert ramp.arrivals.ramp_ns == 30 * 10**9 and ramp.arrivals.rate_from_per_s == 1.0 and len(build(ramp)) == 200
    st = load(tmp_path, base=BASE.replace('process = "poisson"\nrate = "4/s"', 'process = "stages"\nbase = "constant"\n'
              'stages = [ { duration = "10s", rate = "2/s" }, { duration = "10s", rate = "0" }, '
              '{ duration = "5s", rate = "2/s", to = "6/s" } ]').replace("requests = 200\n", ""))
    s = build(st)
    assert len(s) == 20 + 20 and not np.any((s.intended_ns > 10 * 10**9) & (s.intended_ns < 20 * 10**9))


def test_abandon_draws_its_share_and_points_from_the_seed(tmp_path):
    c = load(tmp_path, '[abandon]\nshare = 0.25\nafter_ms = { dist = "uniform", min = 100, max = 900 }\n')
    a, b = build(c), build(c)
    assert (a.abandon_ns == b.abandon_ns).all() and (a.abandon_tokens == NONE).all()
    chosen = a.abandon_ns != NONE
    assert 30 < chosen.sum() < 70    # 200 draws at 0.25: 50 +- 3 sd
    ms = a.abandon_ns[chosen] / 1e6
    assert ms.min() >= 100 and ms.max() <= 900 and (ms == ms.astype(int)).all()
    rec = plan_records(a)
    assert [r["abandon_after_ns"] is not None for r in rec] == chosen.tolist()
    t = build(load(tmp_path, '[abandon]\nshare = 1\nafter_tokens = 7\n'))
    assert (t.abandon_tokens == 7).all() and (t.abandon_ns == NONE).all()
    assert (build(c).intended_ns == build(load(tmp_path)).intended_ns).all()   # the rest of the plan unchanged


@pytest.mark.parametrize("extra,expected", [
    ('[trace]\nfile = "missing.csv"\n', "w.toml: trace.file: no such file"),
    ('[trace]\nfile = "w.toml"\nformat = "csv"\n', "w.toml: trace.format: must be one of azure, mooncake"),
    ('[trace]\nfile = "w.toml"\ntime_scale = 1\nrate = "2/s"\n', "w.toml: trace: give time_scale or rate, not both"),
    ('[trace]\nfile = "w.toml"\nlimit = 0\n', "w.toml: trace.limit: must be an integer >= 1"),
    ('[prefix]\ngroups = 2\n', "w.toml: prefix.tokens: missing"),
    ('[prefix]\ntokens = 300\n', "w.toml: prefix.tokens: must be less than prompt.tokens (300)"),
    ('[prefix]\ntokens = 10\nfraction = 2\n', "w.toml: prefix.fraction: must be a number in [0, 1]"),
    ('[session]\nthink_ms = 5\n', "w.toml: session.turns: missing"),
    ('[session]\nturns = 0\n', "w.toml: session.turns: must be >= 1"),
    ('[[mix]]\nweight = -1\nprompt = 5\noutput = 5\n', "w.toml: mix[0].weight: must be a number > 0"),
    ('[[mix]]\nweight = 1\nprompt = 5\n', "w.toml: mix[0].output: missing"),
    ('[prompt.x]\n', "w.toml: prompt.x: unknown key"),
    ('[abandon]\nafter_ms = 100\n', "w.toml: abandon.share: must be a number in (0, 1]"),
    ('[abandon]\nshare = 1.5\nafter_ms = 100\n', "w.toml: abandon.share: must be a number in (0, 1]"),
    # its ns must fit an int64 (1e14 ms planned 7.8e18 ns, wrapped around, silently)
    ('[abandon]\nshare = 1\nafter_ms = 100000000000000\n',
     "w.toml: abandon.after_ms: draws up to 100000000000000 ms: at most 86400000 ms"),
    ('[abandon]\nshare = 0.5\n', "w.toml: abandon: give after_ms (time from dispatch) or after_tokens"),
    ('[abandon]\nshare = 0.5\nafter_ms = 100\nafter_tokens = 4\n', "w.toml: abandon: give after_ms"),
    ('[abandon]\nshare = 0.5\nafter_tokens = 0\n', "w.toml: abandon.after_tokens: must be >= 1"),
    ('[abandon]\nshare = 0.5\nafter_ms = 100\nwhen = 3\n', "w.toml: abandon.when: unknown key"),
])
def test_bad_new_keys_are_named(tmp_path, extra, expected):
    with pytest.raises(ConfigError) as e:
        load(tmp_path, extra)
    assert any(expected in p for p in e.value.problems), e.value.problems


def test_all_problems_at_once(tmp_path):
    with pytest.raises(ConfigError) as e:
        load(tmp_path, '[prefix]\ntokens = 0\nfraction = 9\n[session]\nturns = "x"\n')
    assert len(e.value.problems) == 3, e.value.problems
