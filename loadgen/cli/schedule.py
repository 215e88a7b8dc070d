"""`loadgen schedule WORKLOAD`: the plan, without sending anything (JSON lines, or a .jsonl/.parquet file)."""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from loadgen.cli.common import EXAMPLES, RAW, WORKLOAD_HELP, add_out, out_file, workload_config, write_out
from loadgen.config.options import add_options
from loadgen.errors import ExitCode


def add_parser(sub) -> None:
    sch = sub.add_parser("schedule", help="dry run: print the planned requests as JSON lines",
                         epilog=EXAMPLES, formatter_class=RAW)
    sch.add_argument("workload", nargs="?", help=WORKLOAD_HELP)
    add_options(sch, "schedule")
    add_out(sch, "write the plan to FILE.jsonl or FILE.parquet instead of stdout")


def command(args: argparse.Namespace) -> int:
    # lazy: planning pulls in numpy, polars (a fast start for the other commands)
    import orjson

    from loadgen.plan.limits import check_images, check_schedule
    from loadgen.plan.schedule import build, plan_records

    if args.out and Path(args.out).suffix not in (".jsonl", ".parquet"):
        print(f"--out: {args.out}: must end in .jsonl or .parquet", file=sys.stderr)
        return ExitCode.USAGE
    out = out_file(args)  # before the plan is built: never over a run's own files
    schedule = build(workload_config(args)[0])
    check_schedule(schedule.prompt_tokens, schedule.max_tokens)
    check_images(schedule)
    records = plan_records(schedule)
    if out:
        if out.suffix == ".parquet":
            import polars as pl

            from loadgen.results.folder import parquet_bytes

            write_out(out, parquet_bytes(pl.DataFrame(records, schema={
                "request_id": pl.String, "intended_ns": pl.Int64, "prompt_tokens": pl.Int64, "max_tokens": pl.Int64,
                "prefix_group": pl.Int64, "session": pl.Int64, "turn": pl.Int64, "after": pl.Int64,
                "think_ns": pl.Int64, "mix_class": pl.Int64, "warmup": pl.Boolean,
                "tool_latency_ns": pl.Int64, "tool_tokens": pl.Int64})))
        else:
            write_out(out, b"".join(orjson.dumps(r) + b"\n" for r in records))
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
