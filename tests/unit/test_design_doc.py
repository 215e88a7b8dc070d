"""docs/design.md's Layout lists every module of the pipeline, and nothing that is gone; loadgen/sim/README.md
lists the simulator's. (A module added or moved without its line fails here.)"""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "loadgen"


def _layout_modules() -> set[str]:
    # The Layout's code block: `<indent>name/  ...` opens a folder, `<indent>name.py  ...` is a module of the
    # folder one level (two spaces) up; the indentation says where each belongs.
    text = (ROOT / "docs" / "design.md").read_text()
    block = text[text.index("## Layout"):]
    block = block[block.index("```\n") + 4:]
    block = block[block.index("\nloadgen/\n") + 1:block.index("```")]
    stack: list[str] = []
    out = set()
    for line in block.splitlines()[1:]:
        m = re.match(r"^( +)([a-z_]+)(\.py|/)\s", line + " ")
        if not m:
            continue
        depth = len(m.group(1)) // 2 - 1          # 0 = directly under loadgen/
        del stack[depth:]
        if m.group(3) == "/":
            stack.append(m.group(2))
        else:
            out.add("/".join([*stack, m.group(2) + ".py"]))
    return out


def _modules(root: Path, skip: str | None = None) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*.py")
            if p.name not in ("__init__.py", "__main__.py") and not (skip and p.is_relative_to(root / skip))}


def test_design_layout_lists_every_pipeline_module():
    listed, present = _layout_modules(), _modules(PKG, skip="sim")
    assert present - listed == set(), "modules missing from docs/design.md's Layout"
    assert listed - present == set(), "docs/design.md's Layout names modules that do not exist"


def test_sim_readme_lists_every_simulator_module():
    table = (PKG / "sim" / "README.md").read_text()
    named = set(re.findall(r"^\| `([a-z_]+\.py)`", table, re.M)) | set(re.findall(r"`([a-z_]+\.py)`,", table))
    present = _modules(PKG / "sim")
    assert present - named == set(), "simulator modules missing from loadgen/sim/README.md"
