"""`loadgen schedule WORKLOAD`: the plan, without sending anything (JSON lines, or a .jsonl/.parquet file)."""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from loadgen.cli.common import EXAMPLES, RAW, WORKLOAD_HELP, workload_config
from loadgen.config.options import add_options
from loadgen.errors import ExitCode


def add_parser(sub) -> None:
    sch = sub.add_parser("schedule", help="dry run: print the planned requests as JSON lines",
                         epilog=EXAMPLES, formatter_class=RAW)
    sch.add_argument("workload", nargs="?", help=WORKLOAD_HELP)
    add_options(sch, "schedule")
    sch.add_argument("--out", help="write the plan to FILE.jsonl or FILE.parquet instead of stdout")


def command(args: argparse.Namespace) -> int:
    # lazy: planning pulls in numpy, polars (a fast start for the other commands)
    import orjson

    from loadgen.plan.limits import check_schedule
    from loadgen.plan.schedule import build, plan_records

    schedule = build(workload_config(args)[0])
    check_schedule(schedule.prompt_tokens, schedule.max_tokens)
    records = plan_records(schedule)
    if args.out:
        out = Path(args.out)
        if out.suffix == ".parquet":
            import polars as pl

            pl.DataFrame(records, schema={"request_id": pl.String, "intended_ns": pl.Int64,
                                          "prompt_tokens": pl.Int64, "max_tokens": pl.Int64,
                                          "prefix_group": pl.Int64, "session": pl.Int64, "turn": pl.Int64,
                                          "after": pl.Int64, "think_ns": pl.Int64,
                                          "warmup": pl.Boolean}).write_parquet(out)
        elif out.suffix == ".jsonl":
            out.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))
        else:
            print(f"--out: {out}: must end in .jsonl or .parquet", file=sys.stderr)
            return ExitCode.USAGE
        print(out)
        return ExitCode.OK
    w = sys.stdout.buffer
    try:
        for r in records:
            w.write(orjson.dumps(r) + b"\n")
        w.flush()
    except BrokenPipeError:  # `loadgen schedule ... | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
    return ExitCode.OK
