"""`loadgen compare A B [C ...]`: the flags, the output and the exit code (the comparison itself:
loadgen/analysis/compare.py)."""
from __future__ import annotations

import sys
from pathlib import Path

import orjson

from loadgen.analysis.compare import EXIT_FAIL_IF, CompareError, compare, to_text
from loadgen.analysis.fail_if import FailIfError
from loadgen.cli.sweep_args import ArgError, fraction
from loadgen.results.folder import ResultsError


def compare_cli(args, slo_ms) -> int:
    try:
        resamples, seed = int(args.resamples), int(args.seed)
    except ValueError:
        raise CompareError(f"--resamples and --seed take whole numbers, got {args.resamples!r}, "
                           f"{args.seed!r}") from None
    if resamples < 100:
        raise CompareError(f"--resamples: must be >= 100, got {args.resamples!r}")
    try:
        result = compare(args.inputs, slo_ms, args.fail_if, resamples, seed,
                         fraction("--min-effect", args.min_effect, 0.0, 1.0))
    except (FailIfError, ArgError, ResultsError) as e:
        raise CompareError(str(e)) from None
    text = (orjson.dumps(result, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY).decode() + "\n"
            if args.format == "json" else to_text(result))
    if args.out:
        Path(args.out).write_text(text)
    else:
        sys.stdout.write(text)
    for c in result["comparisons"]:
        for d in c["same_work"]["differences"]:
            print(f"WARNING: {c['b']} did not offer the same work as {result['baseline']}: {d['field']} differs",
                  file=sys.stderr)
    return EXIT_FAIL_IF if result["failed_rules"] else 0
