"""`loadgen report RUN_DIR`: summarize and explain a results folder (also a sweep's or a comparison's page)."""
from __future__ import annotations

import argparse
import sys

from loadgen.cli.common import EXAMPLES, RAW, SLO_HELP, add_out, out_file, slo, write_out
from loadgen.errors import ExitCode, StorageError


def add_parser(sub) -> None:
    rep = sub.add_parser("report", help="summarize a results folder", epilog=EXAMPLES, formatter_class=RAW)
    rep.add_argument("run_dir")
    rep.add_argument("--format", choices=("text", "json", "html", "md"), default="text",
                     help="html: one self-contained file with plots (docs/html-report.md); md: for issues and PRs")
    add_out(rep, "write the report to this file instead of stdout")
    rep.add_argument("--device", help="device name for the roofline (see loadgen/data/devices.json), e.g. h100-sxm")
    rep.add_argument("--bandwidth", help="memory bandwidth instead of --device, e.g. 3350GB/s")
    rep.add_argument("--model-config", help="the model's config.json (Hugging Face layout) for the roofline")
    rep.add_argument("--window", default="5s", help="time window of the decomposition over the run (default 5s)")
    rep.add_argument("--slo", help=SLO_HELP)
    rep.add_argument("--fitted-profile", metavar="FILE.toml",
                     help="split TTFT into queue and prefill with a profile from `loadgen fit` instead of the run's "
                          "idle-server probes (docs/twin.md)")
    rep.add_argument("--prediction", metavar="FILE.json",
                     help="a sweep's HTML page: draw `loadgen predict --format json`'s curves and intervals over it")


def command(args: argparse.Namespace) -> int:
    # lazy: analysis and report pull in polars, numpy (a fast start for the other commands)
    from loadgen.analysis import repeats
    from loadgen.analysis.explain import ExplainOptions
    from loadgen.analysis.report_summary import build
    from loadgen.config.kinds import DURATION
    from loadgen.report import to_json, to_text

    out = out_file(args)  # before anything is computed: never over the run's own files
    if args.format in ("html", "md"):  # a sweep's or a comparison's page
        from loadgen.report.pages import read_prediction, render_sweep_or_compare

        prediction = read_prediction(args.prediction) if args.prediction else None
        page = render_sweep_or_compare(args.run_dir, args.format, prediction)
        if page is not None:
            write_out(out, page.encode()) if out else sys.stdout.write(page)
            return ExitCode.OK
    if args.prediction:
        print(f"error: --prediction: drawn on a sweep's HTML page only (loadgen report SWEEP_DIR --format html "
              f"--prediction FILE.json); {args.run_dir} is not a sweep", file=sys.stderr)
        return ExitCode.USAGE
    if bool(args.device or args.bandwidth) != bool(args.model_config):
        print("error: the roofline needs --model-config and one of --device / --bandwidth", file=sys.stderr)
        return ExitCode.USAGE
    slo_ms = slo(args)
    try:
        try:
            window_ns = DURATION.parse(args.window)   # a duration > 0
        except ValueError as e:
            raise ValueError(f"--window: {e}") from None
        opts = ExplainOptions(args.device, args.bandwidth, args.model_config, window_ns,
                              _fitted_calibration(args.fitted_profile, args.run_dir) if args.fitted_profile else None)
        if repeats.is_repeats(args.run_dir):  # --repeat N's folder: the across-run table
            return _repeats_report(args, repeats.rebuild(args.run_dir, opts, slo_ms))
        run, summary, decomposition = build(args.run_dir, opts, slo_ms, write=False)  # summary, explanation
    except ValueError as e:  # RooflineError is one
        print(f"error: {e}", file=sys.stderr)
        return ExitCode.USAGE
    _save(run, summary, decomposition)  # with --fitted-profile too: its summary's `calibration` names the profile
    text = to_json(summary) if args.format == "json" else to_text(summary)
    if args.format in ("html", "md"):
        from loadgen.report.pages import render_run_page

        text = render_run_page(args.format, summary, run, decomposition)
    if out:
        write_out(out, text.encode())
    else:
        sys.stdout.write(text)
    return ExitCode.OK


def _repeats_report(args: argparse.Namespace, rec: dict) -> int:
    """A repeats folder (loadgen/analysis/repeats.py): text or JSON; its runs have their own pages."""
    import orjson

    from loadgen.analysis import repeats

    if args.format in ("html", "md"):
        print(f"error: --format {args.format}: {args.run_dir} is a repeats folder; its across-run table is "
              f"text or json, and each run's page is `loadgen report {args.run_dir}/repeat-K --format "
              f"{args.format}`", file=sys.stderr)
        return ExitCode.USAGE
    text = (orjson.dumps(rec, option=orjson.OPT_INDENT_2).decode() + "\n" if args.format == "json"
            else repeats.to_text(rec))
    out = out_file(args)  # never over a run's own files, nor an existing file without --overwrite
    if out:
        write_out(out, text.encode())
    else:
        sys.stdout.write(text)
    return ExitCode.OK


def _fitted_calibration(path: str, run_dir: str) -> dict:
    """The profile's idle prefill and decode times at the run's planned prompt lengths (calibration.json's
    shape: twin/fit_model.idle_calibration); ValueError naming --fitted-profile."""
    from pathlib import Path

    import polars as pl

    from loadgen.analysis import repeats
    from loadgen.sim.profiles import load_profile
    from loadgen.twin.fit_model import idle_calibration

    if not path.endswith(".toml"):
        raise ValueError(f"--fitted-profile {path}: a profile file written by `loadgen fit` (.toml)")
    try:
        profile = load_profile(path)
    except ValueError as e:
        raise ValueError(f"--fitted-profile: {e}") from None
    folders = ([Path(run_dir) / r["dir"] for r in repeats.read(run_dir)["runs"]] if repeats.is_repeats(run_dir)
               else [Path(run_dir)])   # a repeats folder: its runs' lengths
    lengths = [n for f in folders if (f / "requests.parquet").is_file()
               for n in pl.read_parquet(f / "requests.parquet", columns=["planned_prompt_tokens"])
               ["planned_prompt_tokens"].drop_nulls().unique().to_list()]
    return idle_calibration(profile, lengths, f"profile {path}")


def _save(run, summary, decomposition) -> None:
    """summary.json and decomposition.parquet into the run's folder; a folder that cannot take them (read
    only, full) is said on stderr, and the report is shown all the same (it needs neither file)."""
    try:
        run.write_decomposition(decomposition)
        run.write_summary(summary)
    except (StorageError, OSError) as e:  # StorageError: results/folder.py's durable writes
        print(f"warning: {run.path}: summary.json and decomposition.parquet not saved ({e.strerror or e}); "
              f"the report below is complete", file=sys.stderr)
