"""The `fit` and `predict` commands' flags and handlers (cli/main.py dispatches here; docs/twin.md)."""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any

import orjson

from loadgen.config.options import add_options
from loadgen.errors import ExitCode, InputError


def add_parsers(sub) -> None:
    f = sub.add_parser("fit", help="probe a live server and write a simulator profile of it (docs/twin.md)")
    f.add_argument("--url", required=True, help="server base URL (OpenAI-compatible /v1/completions)")
    f.add_argument("--out", required=True, metavar="FILE.toml", help="the profile to write")
    f.add_argument("--budget", default="60s", metavar="DURATION", help="time bound of the probes (default 60s)")
    f.add_argument("--rounds", type=int, metavar="N",  # default: fit.ROUNDS (imported lazily: a fast start)
                   help="rounds of probes at most (default 8, with --recheck 3; fewer when the budget ends first)")
    f.add_argument("--recheck", metavar="PROFILE.toml",
                   help="measure the server's speed now against this profile (a few seconds) and write it scaled")
    f.add_argument("--max-num-seqs", type=int, metavar="N",
                   help="slots (default: llama.cpp's /props total_slots, else probed: vLLM and SGLang publish none)")
    f.add_argument("--max-model-len", type=int, metavar="N",
                   help="tokens per slot (default: llama.cpp's /props, else max_model_len in /v1/models)")
    f.add_argument("--max-batched-tokens", type=int, default=2048, metavar="N",
                   help="tokens per engine step (llama.cpp -b, default 2048)")
    f.add_argument("--extra-body", metavar="JSON", help="fields added to every probe request (JSON object)")
    f.add_argument("--name", default=None, help="the profile's name (default: the file's stem)")
    f.add_argument("--format", choices=("text", "json"), default="text")
    add_options(f, "fit")  # --header, --insecure, --ca-bundle: the rows a run has (config/options.py)
    p = sub.add_parser("predict", help="a workload's latency at other rates, from a profile (docs/twin.md)")
    p.add_argument("workload", help="workload file (TOML)")
    p.add_argument("--profile", required=True, metavar="NAME|FILE", help="a shipped profile or a TOML file")
    p.add_argument("--rates", required=True, metavar="R1,R2,...", help="request rates, e.g. 0.5,1,2/s")
    p.add_argument("--requests", metavar="N", help="number of requests per rate (replaces the file's)")
    p.add_argument("--format", choices=("text", "json"), default="text")
    p.add_argument("--out", metavar="FILE.json", help="also write the prediction as JSON")
    p.add_argument("--level", default="0.8", metavar="L",
                   help="the intervals' level, 0 < L < 1 (default 0.8; a profile written by loadgen fit has them)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="what if: predict with an engine setting changed (" + ", ".join(SETTABLE) + "); repeatable")


# predict --set: the engine's configuration, what a deployment chooses (not the hardware's speed)
SETTABLE = ("max_num_seqs", "max_num_batched_tokens", "kv_capacity_tokens", "max_model_len")


def parse_sets(items: list[str]) -> tuple[dict[str, Any], list[str]]:
    """({key: value}, problems) of --set KEY=VALUE items: a key of SETTABLE, a whole number >= 1."""
    out: dict[str, Any] = {}
    problems = []
    for item in items:
        key, eq, text = item.partition("=")
        key = key.strip()
        if not eq or key not in SETTABLE:
            problems.append(f"--set {item!r}: give KEY=VALUE with KEY one of {', '.join(SETTABLE)}")
        elif not text.strip().isdigit() or int(text) < 1:
            problems.append(f"--set {key}: {text.strip()!r} must be a whole number >= 1")
        else:
            out[key] = int(text)
    return out, problems


def parse_rates(text: str) -> list[float]:
    out = []
    for part in text.split(","):
        t = part.strip().removesuffix("/s")
        try:
            v = float(t)
        except ValueError:
            raise InputError([f"--rates: {part.strip()!r} is not a rate (e.g. 0.5,1,2/s)"]) from None
        if not v > 0:
            raise InputError([f"--rates: {part.strip()!r} must be > 0"])
        out.append(v)
    return sorted(out)


def fit_command(args: argparse.Namespace) -> int:
    from loadgen.twin.fit import ROUNDS, FitOptions, profile_text, run_fit, to_text
    from loadgen.config.units import parse_duration_ns

    from loadgen.config.client import client_options

    client, problems = client_options(args.header, args.insecure, args.ca_bundle)
    try:
        budget_s = parse_duration_ns(args.budget) / 1e9
    except ValueError as e:
        problems.append(f"--budget: {e}")
    extra = None
    if args.extra_body:
        try:
            extra = orjson.loads(args.extra_body)
            if not isinstance(extra, dict):
                raise ValueError
        except ValueError:
            problems.append(f"--extra-body: {args.extra_body!r} is not a JSON object")
    for flag, v in (("--max-num-seqs", args.max_num_seqs), ("--max-model-len", args.max_model_len),
                    ("--max-batched-tokens", args.max_batched_tokens), ("--rounds", args.rounds)):
        if v is not None and v < 1:
            problems.append(f"{flag}: must be >= 1")
    out = Path(args.out)
    if out.suffix != ".toml":
        problems.append(f"--out {args.out}: must end in .toml")
    elif not out.parent.is_dir():
        problems.append(f"--out {args.out}: no folder {out.parent}")
    if args.recheck and not Path(args.recheck).is_file():
        problems.append(f"--recheck {args.recheck}: no such file (a profile written by loadgen fit)")
    if args.recheck:
        problems += [f"{flag}: not with --recheck (the profile's limits are kept; `predict --set` changes them)"
                     for flag, v in (("--max-num-seqs", args.max_num_seqs), ("--max-model-len", args.max_model_len))
                     if v is not None]
    if problems:
        raise InputError(problems)
    if args.recheck:
        return _recheck(args, budget_s, extra, client, out)
    res, report = run_fit(FitOptions(args.url, budget_s, args.max_num_seqs, args.max_model_len,
                                     args.max_batched_tokens, extra, args.name or out.stem,
                                     ROUNDS if args.rounds is None else args.rounds, client.headers,
                                     client.ssl_context()))
    out.write_text(profile_text(res, report))
    report["profile"] = str(out)
    sys.stdout.write(orjson.dumps(report, option=orjson.OPT_INDENT_2).decode() + "\n" if args.format == "json"
                     else to_text(res, report) + f"wrote {out}\n")
    return ExitCode.OK


def _recheck(args: argparse.Namespace, budget_s: float, extra: dict | None, client, out: Path) -> int:
    from loadgen.sim.profiles import load_profile
    from loadgen.twin.fit import FitOptions
    from loadgen.twin.intervals import load_spread
    from loadgen.twin.recheck import RECHECK_ROUNDS, profile_text, recheck, to_text

    try:
        profile = load_profile(args.recheck)
        spread = load_spread(args.recheck, profile)
    except ValueError as e:
        raise InputError([f"--recheck: {e}"]) from None
    o = FitOptions(args.url, budget_s, extra_body=extra, rounds=args.rounds or RECHECK_ROUNDS, headers=client.headers,
                   tls=client.ssl_context())
    now, spread, report = recheck(o, profile, spread)
    report["profile_from"] = args.recheck
    out.write_text(profile_text(now, spread, report))
    report["profile"] = str(out)
    sys.stdout.write(orjson.dumps(report, option=orjson.OPT_INDENT_2).decode() + "\n" if args.format == "json"
                     else to_text(report) + f"wrote {out}\n")
    return ExitCode.OK


def predict_command(args: argparse.Namespace) -> int:
    from loadgen.twin.intervals import load_spread
    from loadgen.twin.predict import predict, to_text, with_settings
    from loadgen.sim.profiles import load_profile

    rates = parse_rates(args.rates)
    sets, problems = parse_sets(args.set)
    try:
        level = float(args.level)
    except ValueError:
        level = math.nan
    if not 0 < level < 1:
        problems.append(f"--level: {args.level!r} must be a number between 0 and 1 (e.g. 0.8)")
    if problems:
        raise InputError(problems)
    try:
        profile = load_profile(args.profile)
        spread = load_spread(args.profile, profile)
    except ValueError as e:
        raise InputError([str(e)]) from None
    profile, spread = with_settings(profile, spread, sets)
    d = predict(args.workload, profile, rates, {"--requests": args.requests}, spread, level)
    if sets:
        d["set"] = sets
    if args.out:
        Path(args.out).write_bytes(orjson.dumps(d, option=orjson.OPT_INDENT_2))
    sys.stdout.write(orjson.dumps(d, option=orjson.OPT_INDENT_2).decode() + "\n" if args.format == "json"
                     else to_text(d))
    return ExitCode.OK
