"""`loadgen compare A B [C ...]`: the flags, the output and the exit code (the comparison itself:
loadgen/analysis/compare.py)."""
from __future__ import annotations

import argparse
import sys

from loadgen.cli.common import RAW, SLO_HELP, add_out, out_file, slo, write_out
from loadgen.config.kinds import is_decimal
from loadgen.errors import ExitCode

COMPARE_EXAMPLES = """\
examples:
  loadgen compare results/vllm results/sglang
  loadgen compare results/base results/new --fail-if "p99 ttft > +10%" --fail-if "throughput < -5%"
  loadgen compare results/sweep-a results/sweep-b --format json
  loadgen compare results/base results/interrupted --fail-if "p99 ttft > +10%" --allow-invalid
"""


def add_parser(sub) -> None:
    cmp = sub.add_parser("compare", help="compare runs or sweeps: same-work check, CIs, verdicts",
                         description="A is the baseline; each other input is compared with it.",
                         epilog=COMPARE_EXAMPLES, formatter_class=RAW)
    cmp.add_argument("inputs", nargs="+", metavar="RUN_OR_SWEEP", help="results folders or sweep folders (2+)")
    cmp.add_argument("--format", choices=("text", "json"), default="text")
    add_out(cmp, "write the comparison to this file instead of stdout")
    cmp.add_argument("--fail-if", action="append", default=[], metavar="RULE",
                     help=f"e.g. 'p99 ttft > +10%%' or 'throughput < -5%%' or 'p50 itl > +2ms'; exit "
                          f"{ExitCode.FAIL_IF.value} when a rule holds, {ExitCode.INVALID.value} when an input is "
                          f"invalid (the rules are not evaluated; see --allow-invalid) (repeatable)")
    cmp.add_argument("--allow-invalid", action="store_true",
                     help=f"evaluate --fail-if rules even when an input run is invalid or interrupted (by "
                          f"default they are not, and compare exits {ExitCode.INVALID.value}); the input is "
                          f"still named as invalid first in every format")
    cmp.add_argument("--slo", help=SLO_HELP)
    cmp.add_argument("--resamples", default="1000", help="bootstrap resamples (default 1000)")
    cmp.add_argument("--seed", default="0", help="bootstrap seed (default 0)")
    cmp.add_argument("--min-effect", default="5%", help="smaller changes are called indistinguishable even "
                                                        "when resolved (default 5%%: run-to-run noise)")


def command(args: argparse.Namespace) -> int:
    from loadgen.analysis.compare import CompareError  # lazy: polars, numpy (a fast start)

    try:
        return compare_cli(args, slo(args))
    except CompareError as e:
        print(f"error: {e}", file=sys.stderr)
        return ExitCode.USAGE


def _whole(flag: str, text: str) -> int:
    """text as an integer; else a CompareError naming the flag (exit 2). Its range: compare() checks it."""
    from loadgen.analysis.compare import CompareError  # lazy: polars, numpy

    if not is_decimal(text):
        raise CompareError(f"{flag}: must be a whole number, got {text!r}")
    return int(text)


def compare_cli(args, slo_ms) -> int:
    # lazy: the bootstrap and the results reader pull in polars, numpy (a fast start)
    import orjson

    from loadgen.analysis.compare import CompareError, compare, exit_code, invalid_lines, to_text
    from loadgen.analysis.fail_if import FailIfError
    from loadgen.run.sweep_args import ArgError, fraction
    from loadgen.results.folder import ResultsError

    out = out_file(args)  # before the bootstrap: never over a run's own files
    resamples, seed = _whole("--resamples", args.resamples), _whole("--seed", args.seed)
    try:
        result = compare(args.inputs, slo_ms, args.fail_if, resamples, seed,
                         fraction("--min-effect", args.min_effect, 0.0, 1.0), args.allow_invalid)
    except (FailIfError, ArgError, ResultsError) as e:
        raise CompareError(str(e)) from None
    text = (orjson.dumps(result, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY).decode() + "\n"
            if args.format == "json" else to_text(result))
    if out:
        write_out(out, text.encode())
    else:
        sys.stdout.write(text)
    for c in result["comparisons"]:
        for d in c["same_work"]["differences"]:
            print(f"WARNING: {c['b']} did not offer the same work as {result['baseline']}: {d['field']} differs",
                  file=sys.stderr)
    for line in invalid_lines(result):
        print(f"WARNING: {line}", file=sys.stderr)
    code = exit_code(result)
    if code == ExitCode.INVALID:
        print(f"error: --fail-if not evaluated: an input is invalid (above); pass --allow-invalid to evaluate "
              f"the rules anyway (exit {code.value})", file=sys.stderr)
    return code
