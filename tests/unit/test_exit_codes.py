"""One ExitCode enum (loadgen/errors.py): its meanings are the `--help` epilog and docs/cli.md's table."""
import re
import subprocess
import sys
from pathlib import Path

from loadgen.errors import EXIT_MEANINGS, ExitCode, exit_table

CLI_MD = Path(__file__).resolve().parents[2] / "docs" / "cli.md"


def test_the_codes():
    assert {c.name: c.value for c in ExitCode} == {"OK": 0, "ERROR": 1, "USAGE": 2, "INVALID": 3, "FAIL_IF": 4,
                                                    "STORAGE": 5, "INTERRUPTED": 130}
    assert set(EXIT_MEANINGS) == set(ExitCode)


def test_docs_cli_md_table_is_the_enums():
    section = CLI_MD.read_text().split("## Exit codes", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| (\d+) \| (.*) \|$", section, re.M)
    assert [(int(c), m) for c, m in rows] == [(c.value, m) for c, m in EXIT_MEANINGS.items()]


def test_help_lists_every_code():
    p = subprocess.run([sys.executable, "-m", "loadgen", "--help"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and exit_table() in p.stdout
    for code in ExitCode:
        assert re.search(rf"^  {code.value} +\S", p.stdout, re.M), code


def test_no_module_restates_an_exit_code():
    # the old constants are gone: EXIT_OK/EXIT_INVALID/EXIT_FAIL_IF/EXIT_CODES/EXIT_INEXACT
    root = Path(__file__).resolve().parents[2] / "loadgen"
    found = [str(p) for p in root.rglob("*.py") if re.search(r"\bEXIT_(OK|USAGE|INVALID|INTERRUPTED|FAIL_IF|"
                                                          r"CODES|INEXACT)\b", p.read_text())]
    assert found == []
