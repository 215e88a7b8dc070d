"""The option table (loadgen/config/options.py): every flag documented, every value validated with the workload,
all problems at once, run options through the same route as workload keys."""
from pathlib import Path

import pytest

from loadgen.config import workload as config
from loadgen.cli.main import build_parser
from loadgen.config.workload import ConfigError
from loadgen.config.options import OPTIONS, values
from tests.unit.test_config import GOOD, write


def test_every_option_has_help_and_reaches_its_parser():
    parser = build_parser()
    for o in OPTIONS:
        assert o.help and (o.switch or o.metavar), o.flag
        assert (o.key is None) != (o.field is None), o.flag   # a workload key or a run option, not both
        for command in o.commands:
            args = parser.parse_args([command, "w.toml", o.flag] + ([] if o.switch else ["1"]))
            assert values(args)[o.flag] in (True, "1", ["1"]), (command, o.flag)


def test_run_options_and_workload_flags_are_reported_together(tmp_path):
    # A bad workload flag, a bad run option and a bad key in the file: one ConfigError names all three.
    path = write(tmp_path, GOOD.replace("seed = 1", "seed = -1"))
    with pytest.raises(ConfigError) as e:
        config.load(path, {"--rate": "fast", "--scrape-interval": "0ms", "--sim-args": "'unbalanced"})
    text = "\n".join(e.value.problems)
    for needle in ("--rate:", "--scrape-interval: must be > 0", "--sim-args: No closing quotation", "seed"):
        assert needle in text, needle


@pytest.mark.parametrize("flags,expected", [
    # run options map onto RunConfig fields
    ({"--no-calibrate": True, "--scrape-metrics": True, "--scrape-interval": "2s"},
     {"calibrate": False, "scrape_metrics": True, "scrape_interval_ns": 2_000_000_000}),
    # --sim-args is split as a shell would, so a quoted value with a space stays one argument
    ({"--sim-args": "--faults 'http500=0.1' --ttft 20ms"},
     {"sim_args": ("--faults", "http500=0.1", "--ttft", "20ms")}),
    # the self-check's tolerances are workload keys with flags
    ({"--max-rate-deviation": "0.5", "--max-cv-deviation": "2"},
     {"max_rate_deviation": 0.5, "max_cv_deviation": 2.0}),
    # nothing given: the defaults
    ({}, {"calibrate": True, "scrape_metrics": False, "sim_args": (), "max_rate_deviation": 0.02}),
])
def test_flags_land_in_the_run_config(tmp_path, flags, expected):
    c = config.load(write(tmp_path, GOOD), flags)
    assert {k: getattr(c, k) for k in expected} == expected


def test_every_option_is_documented_in_docs_cli_md():
    text = (Path(__file__).resolve().parents[2] / "docs" / "cli.md").read_text()
    assert [o.flag for o in OPTIONS if f"`{o.flag}" not in text] == []


def test_every_sim_flag_is_documented_in_docs_cli_md():
    from loadgen.sim.cli import build_parser as sim_parser

    text = (Path(__file__).resolve().parents[2] / "docs" / "cli.md").read_text()
    flags = [f for a in sim_parser()._actions for f in a.option_strings if f.startswith("--") and f != "--help"]
    assert "--processes" in flags
    assert [f for f in flags if f"`{f}" not in text] == []
