"""docs/cli.md's command block names every subcommand the parser has, and no other; every subcommand's
--help lists every exit code (loadgen.errors.ExitCode)."""
import argparse
import re
from pathlib import Path

from loadgen.cli.main import build_parser
from loadgen.errors import ExitCode, exit_table

CLI_MD = Path(__file__).resolve().parents[2] / "docs" / "cli.md"


def _parsers() -> dict[str, argparse.ArgumentParser]:
    (sub,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


def _subcommands() -> set[str]:
    return set(_parsers())


def test_the_command_block_of_docs_cli_md_lists_every_subcommand():
    text = CLI_MD.read_text()
    block = text[text.index("```\n") + 4:text.index("\n```", text.index("```\n"))]
    named = re.findall(r"^loadgen ([a-z]+)\b", block, re.M)
    assert len(named) == len(set(named)), "a command listed twice"
    assert set(named) == _subcommands()
    for name in _subcommands():  # and each has its own section (or shares one: "## loadgen sweep, loadgen compare")
        assert re.search(rf"^## .*\bloadgen {name}\b", text, re.M), name


def test_every_subcommands_help_lists_every_exit_code():
    for name, parser in _parsers().items():
        if name == "sim":  # the simulator parses its own flags and has its own codes (docs/cli.md)
            continue
        text = parser.format_help()
        assert exit_table() in text, name
        for code in ExitCode:
            assert re.search(rf"^  {code.value} +\S", text, re.M), (name, code)
