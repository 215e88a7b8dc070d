"""The kinds of value an option takes (options.py), each a parser and a check.

`parse(raw)` turns what the workload file or the flag gave (a TOML value, or the flag's text) into the
typed value RunConfig holds, raising ValueError with the message reported after the key or flag;
`check(value)` is the same rule on a typed value (with_overrides re-runs it on a value set after
loading), returning the problem or None. The messages are the ones users and tests see: keep them.
"""
from __future__ import annotations

import math
import os
import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeGuard

from urllib.parse import urlsplit, urlunsplit

from loadgen.config.credentials import bare_url_problems, redact_url
from loadgen.config.slo import SLO_METRICS, parse_slo, split_slo_key
from loadgen.config.units import parse_duration_ns, parse_rate_per_s


@dataclass(frozen=True)
class Kind:
    name: str                                    # the value's form, for docs and messages
    unit: str                                    # of the typed value: "ns", "" (a count or a ratio)
    parse: Callable[[Any], Any]                  # raw -> typed; ValueError names the problem
    check: Callable[[Any], str | None]           # typed -> the problem, None when it is fine


def is_number(v: Any) -> TypeGuard[int | float]:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def is_file(path: str | os.PathLike) -> bool:
    """Path(path).is_file(), False rather than an exception for a name the OS refuses (too long, a NUL)."""
    try:
        return os.path.isfile(path)
    except (OSError, ValueError):
        return False


def is_decimal(text: str) -> bool:
    """An integer written in ASCII digits, optionally signed ("²".isdigit() is True, but int() refuses it)."""
    return re.fullmatch(r"\s*[-+]?[0-9]+\s*", text) is not None


INT64_MAX = 2**63 - 1   # every integer option is stored as int64 (Parquet, the manifest's JSON, numpy)


def integer(minimum: int, maximum: int = INT64_MAX) -> Kind:
    def check(v: Any) -> str | None:
        if isinstance(v, bool) or not isinstance(v, int):
            return f"must be an integer, got {v!r}"
        if v < minimum:
            return f"must be >= {minimum}, got {v}"
        if v > maximum:
            return f"must be <= {maximum}, got {v}"
        return None

    def parse(v: Any) -> int:
        if isinstance(v, str) and is_decimal(v):  # flags arrive as text
            v = int(v)
        problem = check(v)
        if problem:
            raise ValueError(problem)
        return v

    return Kind(f"integer >= {minimum}", "", parse, check)


def _check_duration(ns: Any) -> str | None:
    if isinstance(ns, bool) or not isinstance(ns, int):
        return f"must be a duration in ns, got {ns!r}"
    return None if ns > 0 else f"must be > 0, got {ns!r}"


def _parse_duration(v: Any) -> int:
    ns = parse_duration_ns(v)
    if ns <= 0:
        raise ValueError(f"must be > 0, got {v!r}")
    return ns


DURATION = Kind("duration > 0", "ns", _parse_duration, _check_duration)

_ZERO = (0, "0")


def _parse_pause(v: Any) -> int:
    # "0s", "0ms", 0: no pause; any other duration must be > 0
    if v in _ZERO:
        return 0
    ns = parse_duration_ns(v)
    return 0 if ns == 0 else _parse_duration(v)


def _check_pause(ns: Any) -> str | None:
    return None if ns == 0 else _check_duration(ns)


PAUSE = Kind("duration >= 0", "ns", _parse_pause, _check_pause)


def _check_positive(v: Any) -> str | None:
    return None if is_number(v) and v > 0 and math.isfinite(v) else f"must be a number > 0, got {v!r}"


def _parse_positive(v: Any) -> float:
    if isinstance(v, str):
        try:
            v = float(v)
        except ValueError:
            pass
    problem = _check_positive(v)   # nan and inf are refused: no limit or scale is infinite
    if problem:
        raise ValueError(problem)
    return float(v)


POSITIVE = Kind("finite number > 0", "", _parse_positive, _check_positive)


def _parse_rate(v: Any) -> float:
    # "10/s", "600/m", or a bare number (per second); "inf" and 0 are refused (units.parse_rate_per_s)
    return parse_rate_per_s(v)


RATE = Kind("rate > 0, e.g. 10/s", "per_s", _parse_rate, _check_positive)


def _check_fraction(v: Any) -> str | None:
    return None if is_number(v) and 0 <= v <= 1 else f"must be a fraction from 0 to 1 (or a percentage), got {v!r}"


def _parse_fraction(v: Any) -> float:
    # 0.01 or "0.01" or "1%" (a flag's text, or a file's string)
    if isinstance(v, str):
        text = v.strip()
        try:
            v = float(text[:-1]) / 100 if text.endswith("%") else float(text)
        except ValueError:
            pass
    problem = _check_fraction(v)
    if problem:
        raise ValueError(problem)
    return float(v)


FRACTION = Kind("fraction 0..1 or N%", "", _parse_fraction, _check_fraction)


def choice(options: tuple[str, ...]) -> Kind:
    def check(v: Any) -> str | None:
        return None if v in options else f"must be one of {', '.join(options)}, got {v!r}"

    def parse(v: Any) -> str:
        problem = check(v)
        if problem:
            raise ValueError(problem)
        return v

    return Kind(" | ".join(options), "", parse, check)


def _check_flag(v: Any) -> str | None:
    return None if isinstance(v, bool) else f"must be true or false, got {v!r}"


def _checked(check: Callable[[Any], str | None]) -> Callable[[Any], Any]:
    # The parser of a kind whose value is taken as written: the value itself, once its check passes.
    def parse(v: Any) -> Any:
        problem = check(v)
        if problem:
            raise ValueError(problem)
        return v
    return parse


FLAG = Kind("true | false", "", _checked(_check_flag), _check_flag)


def _check_text(v: Any) -> str | None:
    return None if isinstance(v, str) and v else f"must be a non-empty string, got {v!r}"


TEXT = Kind("text", "", _checked(_check_text), _check_text)


def _any(v: Any) -> str | None:
    return None


def custom(name: str, unit: str = "") -> Kind:
    """A value its section parses itself (rates, lengths, files, SLOs): the table only documents it."""
    def parse(v: Any) -> Any:
        return v

    return Kind(name, unit, parse, _any)


def _check_workers(v: Any) -> str | None:
    ok = isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= 1024
    return None if ok else f"expected a number of processes (1-1024) or 0 (auto), got {v!r}"


def _parse_workers(v: Any) -> int:
    # "auto" is 0: the launcher picks the count by rate (run/workers.py)
    n = 0 if str(v) == "auto" else (int(v) if is_decimal(str(v)) else -1)
    if n < 0 or n > 1024 or (n == 0 and str(v) != "auto"):
        raise ValueError(f"expected a number of processes (1-1024) or auto, got {v!r}")
    return n


WORKERS = Kind("N | auto", "", _parse_workers, _check_workers)


def _parse_words(v: Any) -> tuple[str, ...]:
    # --sim-args: split as a shell would, so a quoted value with a space stays one argument
    if not isinstance(v, str):
        return tuple(v)
    try:
        return tuple(shlex.split(v))
    except ValueError as e:
        raise ValueError(f"{e}: {v!r}") from None


def _check_words(v: Any) -> str | None:
    ok = isinstance(v, tuple) and all(isinstance(w, str) for w in v)
    return None if ok else f"must be a tuple of strings, got {v!r}"


WORDS = Kind("shell words", "", _parse_words, _check_words)


def _parse_slo(v: Any) -> tuple[tuple[str, float], ...]:
    return tuple(parse_slo(v).items())


def _check_slo(v: Any) -> str | None:
    ok = isinstance(v, tuple) and all(isinstance(p, tuple) and len(p) == 2 and isinstance(p[0], str)
                                      and split_slo_key(p[0])[0] in SLO_METRICS
                                      and is_number(p[1]) and p[1] > 0 for p in v)
    return None if ok else f"must be (metric, bound ms) pairs, got {v!r}"


SLO = Kind("metric=duration,...", "ms", _parse_slo, _check_slo)


def _endpoint(url: str) -> str:
    # a URL without a path is an exporter's root: its samples are at /metrics (Prometheus' default path)
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path="/metrics")) if parts.path in ("", "/") else url


def _parse_endpoints(v: Any) -> tuple[str, ...]:
    # --scrape URL (repeated: argparse gives a list) or run.scrape = ["URL", ...]; each http(s), with a host
    if isinstance(v, str):   # the value is not shown as given: its URL may carry credentials
        raise ValueError(f"must be a list of http(s) URLs, e.g. [{redact_url(v)!r}], got a string")
    if not isinstance(v, (list, tuple)) or not all(isinstance(u, str) and u for u in v):
        raise ValueError(f"must be a list of http(s) URLs (non-empty strings), got a {type(v).__name__}"
                         + ("" if not isinstance(v, (list, tuple)) else " holding something else"))
    problems = [p for u in v for p in bare_url_problems(u)]
    if problems:
        raise ValueError("; ".join(problems))
    urls = tuple(_endpoint(u) for u in v)
    twice = sorted({redact_url(u) for u in urls if urls.count(u) > 1})
    if twice:
        raise ValueError(f"each endpoint once: {', '.join(twice)} given more than once")
    return urls


def _check_endpoints(v: Any) -> str | None:
    if not isinstance(v, tuple):
        return f"must be a tuple of URLs, got {v!r:.80}"
    try:
        _parse_endpoints(v)
    except ValueError as e:
        return str(e)
    return None


ENDPOINTS = Kind("http(s) URLs", "", _parse_endpoints, _check_endpoints)
