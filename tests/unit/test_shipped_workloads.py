"""The shipped workloads run by name (config/shipped.py) and a run needs no file when the flags describe it
(config/workload.py FLAGS_ONLY). The wheel itself: tests/integration/test_install.py."""
import textwrap
from pathlib import Path

import pytest

from loadgen.cli.main import main
from loadgen.config import shipped
from loadgen.config.workload import ConfigError, load

ROOT = Path(__file__).resolve().parents[2]


def test_the_editable_install_reads_the_checkouts_workloads_folder():
    assert shipped.folder() == ROOT / "workloads"
    assert shipped.names() == sorted(p.stem for p in (ROOT / "workloads").glob("*.toml"))


def test_a_name_finds_the_shipped_file_and_an_existing_path_wins(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert shipped.resolve("quickstart") == ROOT / "workloads" / "quickstart.toml"
    assert shipped.resolve("quickstart.toml") == ROOT / "workloads" / "quickstart.toml"
    assert shipped.resolve("sub/quickstart.toml") == Path("sub/quickstart.toml")  # a path is never a name
    assert shipped.resolve("nonesuch") == Path("nonesuch")
    (tmp_path / "quickstart.toml").write_text('model = "m"\n[arrivals]\nrate = "1/s"\n[run]\nrequests = 3\n'
                                               '[prompt]\ntokens = 5\n[output]\ntokens = 2\n')
    assert shipped.resolve("quickstart.toml") == Path("quickstart.toml")
    assert load("quickstart.toml").requests == 3 and load("quickstart").requests == 80


def test_a_missing_name_lists_the_shipped_ones():
    with pytest.raises(ConfigError) as e:
        load("quickstrat")
    assert e.value.problems == [f"quickstrat: no such workload file (shipped workloads, by name: "
                                f"{', '.join(shipped.names())})"]


def test_describe_is_the_first_sentence_of_the_leading_comment(tmp_path):
    w = tmp_path / "w.toml"
    w.write_text(textwrap.dedent("""\
        # Long prompts, e.g. retrieved passages: prefill
        # dominates. Watch TTFT.
        name = "x"   # not this
        """))
    assert shipped.describe(w) == "Long prompts, e.g. retrieved passages: prefill dominates."
    w.write_text('name = "x"\n# later\n')
    assert shipped.describe(w) == ""


def test_loadgen_workloads_lists_every_shipped_one(capsys):
    assert main(["workloads"]) == 0
    out = capsys.readouterr()
    rows = [line.split(None, 1) for line in out.out.splitlines()]
    assert [r[0] for r in rows] == shipped.names()
    assert dict(rows)["quickstart"] == shipped.describe(ROOT / "workloads" / "quickstart.toml")
    assert all(len(r) == 2 and r[1] for r in rows)  # every shipped workload says what it is
    assert str(ROOT / "workloads") in out.err


def test_a_run_without_a_file_takes_the_flags(capsys):
    cfg = load(None, {"--rate": "10/s", "--prompt-tokens": "512", "--max-tokens": "128", "--requests": "200"})
    assert (cfg.name, cfg.source, cfg.arrivals.process, cfg.arrivals.rate_per_s) == ("random", "(flags)",
                                                                                       "poisson", 10.0)
    assert (cfg.prompt_tokens.value, cfg.output_tokens.value, cfg.requests, cfg.model) == (512, 128, 200, "")
    cfg = load(None, {"--concurrency": "4", "--prompt-tokens": "8", "--max-tokens": "2", "--requests": "9"})
    assert cfg.concurrency == 4 and cfg.requests == 9


@pytest.mark.parametrize("argv, missing", [
    ([], "--rate (or --concurrency), --prompt-tokens, --max-tokens, --requests or --duration"),
    (["--rate", "3/s", "--max-tokens", "4"], "--prompt-tokens, --requests or --duration"),
    (["--rate", "3/s", "--prompt-tokens", "4", "--max-tokens", "4"], "--requests or --duration"),
])
@pytest.mark.parametrize("command", ["run", "schedule"])
def test_a_run_without_a_file_names_the_missing_flags(capsys, argv, missing, command):
    assert main([command, *argv]) == 2
    err = capsys.readouterr().err
    assert f"no workload file: give one (a path, or a shipped workload's name: `loadgen workloads` lists them), " \
           f"or describe the workload with flags; missing: {missing}\n" in err
    assert "Traceback" not in err


def test_schedule_without_a_file(capsys):
    assert main(["schedule", "--rate", "5/s", "--prompt-tokens", "20", "--max-tokens", "3", "--requests", "4"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 4 and all('"prompt_tokens":20,"max_tokens":3' in line for line in lines)
