"""The Python API's overrides (loadgen/api.py): `loadgen.run("quickstart", rate="4/s", duration="5s")`.

A keyword is an option's flag without its dashes, `-` written `_` (`--max-tokens` -> `max_tokens`): the
same options as the command's flags (options.py, docs/cli.md), taking the same values as the flag's text
or the workload key's TOML value ("4/s", 8, "64..512", {dist = ...} as a dict). to_flags() turns them into
the {flag: value} that workload.load_run() reads, so a keyword is validated exactly as its flag; the
problems then name the keyword instead of the flag (as_keywords()).
"""
from __future__ import annotations

import difflib
import os
import re
from typing import Any

from loadgen.config.options import OPTIONS, Option


def keyword(flag: str) -> str:
    """--max-tokens -> max_tokens."""
    return flag[2:].replace("-", "_")


def options_of(command: str) -> dict[str, Option]:
    """{keyword: option row} of a command's flags (options.py `commands`)."""
    return {keyword(o.flag): o for o in OPTIONS if o.flag and command in o.commands}


def to_flags(command: str, overrides: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """{keyword: value} -> ({flag: value} for load_run(), None = not given; the problems: every unknown
    keyword, with the nearest known one, and every value of the wrong Python type, each left out)."""
    known = options_of(command)
    flags: dict[str, Any] = {}
    problems = []
    for name, value in overrides.items():
        o = known.get(name)
        if o is None or o.flag is None:
            near = difflib.get_close_matches(name, list(known), n=1)
            problems.append(f"{name}: not an option of {command}" + (f" (did you mean {near[0]}?)" if near else "")
                            + f"; the options are the flags of `loadgen {command} --help` as keywords: without "
                              f"the leading dashes, each - written _")
            continue
        if value is None:
            continue
        value = os.fspath(value) if isinstance(value, os.PathLike) else value
        if o.switch and not isinstance(value, bool):
            problems.append(f"{name}: must be True or False, got {value!r}")
        elif o.repeat:
            items = [value] if isinstance(value, str) else value
            if not isinstance(items, (list, tuple)) or not all(isinstance(v, str) for v in items):
                problems.append(f"{name}: must be a string or a list of strings, got {value!r}")
            else:
                flags[o.flag] = list(items)
        else:
            flags[o.flag] = value
    return flags, problems


_FLAG = re.compile(r"(?<![\w-])--([a-z][a-z0-9]*(?:-[a-z0-9]+)*)")


def as_keywords(problems: list[str], flags: set[str]) -> list[str]:
    """The problems with each of `flags` (a command's, e.g. {"--rate", ...}) written as its keyword: what a
    Python caller passed (`--rate: must be ...` -> `rate: must be ...`)."""
    def spell(m: re.Match[str]) -> str:
        return keyword(m.group(0)) if m.group(0) in flags else m.group(0)

    return [_FLAG.sub(spell, p) for p in problems]
