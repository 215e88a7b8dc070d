"""The option table (loadgen/config/options.py): every flag documented, every value validated with the workload,
all problems at once, run options through the same route as workload keys."""
import re
from dataclasses import MISSING, fields
from pathlib import Path

import pytest

from loadgen.config import workload as config
from loadgen.cli.main import build_parser
from loadgen.config.workload import ConfigError
from loadgen.config.options import OPTIONS, values
from loadgen.run import selfcheck
from tests.unit.test_config import GOOD, write


def test_every_option_has_help_and_reaches_its_parser():
    parser = build_parser()
    for o in OPTIONS:
        assert o.help and o.field and (o.flag or o.key), o   # a row sets a field, from a flag or a key
        assert o.flag is None or o.switch or o.metavar, o.flag
        assert o.flag is not None or o.commands == (), o.key
        for command in o.commands:
            where = ["--url", "http://h", "--out", "p.toml"] if command == "fit" else ["w.toml"]
            args = parser.parse_args([command, *where, o.flag] + ([] if o.switch else ["1"]))
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


CLI_MD = Path(__file__).resolve().parents[2] / "docs" / "cli.md"


def _doc_rows() -> dict[str, list[str]]:
    # docs/cli.md's flag tables: {flag: [cells]} of every row that starts with a flag in backticks
    out = {}
    for line in CLI_MD.read_text().splitlines():
        m = re.match(r"\| `(--[a-z0-9-]+)[^|]*\|", line)
        if m and m.group(1) not in out:
            out[m.group(1)] = [c.strip() for c in line.strip("|").split(" | ")]
    return out


def test_every_option_is_in_docs_cli_md_with_its_default():
    rows = _doc_rows()
    assert [o.flag for o in OPTIONS if o.flag and o.flag not in rows] == []
    for o in OPTIONS:
        shown = o.shown_default
        if o.flag is None or shown is None:
            continue
        cell = rows[o.flag][1]
        expected = "''" if shown == "" else shown
        assert re.match(rf"`?{re.escape(expected)}`?( |$)", cell), (o.flag, cell, expected)


def test_keys_without_a_flag_are_in_the_sample_workload_with_their_default():
    text = CLI_MD.read_text()
    for o in OPTIONS:
        if o.flag is None:
            leaf = o.key.rpartition(".")[2]
            value = f'"{o.default}"' if isinstance(o.default, str) else str(o.default)
            assert re.search(rf"^{leaf} = {re.escape(value)}", text, re.M), o.key


def test_run_config_defaults_are_the_tables(tmp_path):
    # RunConfig's (and its parts') field defaults are the table's; a default written twice would drift
    classes = {"": config.RunConfig, "trace": config.TraceSpec, "arrivals": config.Arrivals}
    checked = 0
    for o in OPTIONS:
        if o.client or (o.default is None and not o.switch):
            continue
        part, _, name = o.field.rpartition(".")
        f = next(f for f in fields(classes[part]) if f.name == name)
        if f.default is MISSING:  # a field every RunConfig names (api, seed): the loader gives the default
            assert getattr(config.load(write(tmp_path, GOOD_BARE)), name) == o.value, o.field
        else:
            assert f.default == o.value, o.field
        checked += 1
    assert checked >= 15
    assert config.RunConfig.__dataclass_fields__["max_send_lag_p99_ns"].default == 50_000_000
    assert selfcheck.Limits() == selfcheck.limits_of(config.load(write(tmp_path, GOOD)))


GOOD_BARE = GOOD.replace('api = "chat"\n', "").replace("seed = 1\n", "")


def test_help_shows_every_default():
    parser = build_parser()
    for command in ("run", "schedule", "sweep"):
        sub = parser._subparsers._group_actions[0].choices[command]
        text = " ".join(sub.format_help().split())
        for o in OPTIONS:
            if o.flag and command in o.commands and not o.switch and o.shown_default not in (None, ""):
                assert f"(default {o.shown_default})" in text, (command, o.flag)


def test_client_options_are_reported_with_the_workloads(tmp_path):
    # --header and --ca-bundle problems come in the same ConfigError as the file's and the flags'
    path = write(tmp_path, GOOD.replace("seed = 1", "seed = -1"))
    with pytest.raises(ConfigError) as e:
        config.load_run(path, {"--rate": "fast", "--header": ["no colon"], "--ca-bundle": str(tmp_path / "x.pem"),
                               "--insecure": True})
    text = "\n".join(e.value.problems)
    for needle in ("--rate:", "seed", "--header", "--insecure and --ca-bundle", "x.pem: no such file"):
        assert needle in text, needle
    cfg, client = config.load_run(write(tmp_path, GOOD), {"--header": ["X-A: 1"], "--insecure": True,
                                                          "--overwrite": True})
    assert (client.headers, client.insecure, client.overwrite) == ((("X-A", "1"),), True, True)


def test_every_sim_flag_is_documented_in_docs_cli_md():
    from loadgen.sim.cli import build_parser as sim_parser

    text = (Path(__file__).resolve().parents[2] / "docs" / "cli.md").read_text()
    flags = [f for a in sim_parser()._actions for f in a.option_strings if f.startswith("--") and f != "--help"]
    assert "--processes" in flags
    assert [f for f in flags if f"`{f}" not in text] == []
