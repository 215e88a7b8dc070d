"""docs/cli.md's command block names every subcommand the parser has, and no other."""
import argparse
import re
from pathlib import Path

from loadgen.cli.main import build_parser

CLI_MD = Path(__file__).resolve().parents[2] / "docs" / "cli.md"


def _subcommands() -> set[str]:
    (sub,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return set(sub.choices)


def test_the_command_block_of_docs_cli_md_lists_every_subcommand():
    text = CLI_MD.read_text()
    block = text[text.index("```\n") + 4:text.index("\n```", text.index("```\n"))]
    named = re.findall(r"^loadgen ([a-z]+)\b", block, re.M)
    assert len(named) == len(set(named)), "a command listed twice"
    assert set(named) == _subcommands()
    for name in _subcommands():  # and each has its own section (or shares one: "## loadgen sweep, loadgen compare")
        assert re.search(rf"^## .*\bloadgen {name}\b", text, re.M), name
