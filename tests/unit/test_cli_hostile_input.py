"""Issue 15 defects 6, 7 and 9 through the CLI: every bad input is a named error with exit 2, all at once,
never a traceback; flags a trace replay would ignore are errors; `schedule | head` exits quietly."""
import subprocess
import sys
from pathlib import Path

import pytest

from loadgen.cli.main import main
from loadgen.sim.cli import main as sim_main

W = str(Path(__file__).resolve().parents[2] / "workloads" / "quickstart.toml")
AZ = "TIMESTAMP,ContextTokens,GeneratedTokens\n"


def _fails(capsys, argv, *needles):
    assert main(argv) == 2
    err = capsys.readouterr().err
    for n in needles:
        assert n in err, err
    return err


def test_plan_bounds(capsys):
    _fails(capsys, ["schedule", W, "--prompt-tokens", "500000000"], "--prompt-tokens: a planned prompt of 500,000,000")
    _fails(capsys, ["schedule", W, "--requests", "2000000000"], "at most 10,000,000 are allowed")
    _fails(capsys, ["schedule", W, "--duration", "100000000s", "--rate", "100/s"], "at most 10,000,000")


def test_out_that_cannot_be_a_folder(capsys, tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    _fails(capsys, ["run", W, "--requests", "5", "--warmup-requests", "0", "--out", str(f / "x"), "--no-calibrate"],
           f"--out {f / 'x'}: cannot create the results folder")
    _fails(capsys, ["run", W, "--requests", "5", "--warmup-requests", "0", "--out", str(f), "--no-calibrate"],
           "exists and is not a folder")


def test_url_with_a_bad_port(capsys):
    _fails(capsys, ["run", W, "--url", "http://127.0.0.1:notaport"], "--url: the port must be a number")


def test_flags_a_trace_replay_would_ignore_are_errors_reported_with_everything_else(capsys, tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text(AZ + "2024-01-01 00:00:00,x,10\n")
    _fails(capsys, ["run", W, "--trace", str(trace), "--rate", "bogus", "--prompt-tokens", "-5", "--max-tokens", "9",
                    "--seed", "x", "--scrape-metrics", "--scrape-interval", "0s"],
           "--rate: a trace replay takes its arrivals", "--prompt-tokens: a trace replay", "--max-tokens: a trace",
           "--seed: must be an integer", "--scrape-interval: must be > 0", f"{trace}:2: ContextTokens")


def test_a_header_only_trace_is_an_error(capsys, tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text(AZ)
    _fails(capsys, ["schedule", W, "--trace", str(trace)], "no requests to replay")


def test_schedule_into_a_closed_pipe_exits_quietly():
    p = subprocess.Popen([sys.executable, "-m", "loadgen", "schedule", W, "--requests", "200000"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    p.stdout.readline()
    p.stdout.close()
    err = p.stderr.read().decode()
    assert p.wait(60) == 0 and "Traceback" not in err and "Broken" not in err, err


def test_sim_reports_every_bad_flag_at_once(capsys):
    assert sim_main(["--ttft", "bogus", "--speed", "-1", "--faults", "bogus=1", "--max-num-seqs", "0"]) == 2
    err = capsys.readouterr().err
    for n in ("--ttft: bad duration", "--speed: '-1' must be > 0", "unknown kind 'bogus'", "--max-num-seqs: '0'"):
        assert n in err, err


@pytest.mark.parametrize("sim_args, expect", [("--ttft '5 ms'", ("--ttft", "5 ms")),
                                             ("--prefix-caching", ("--prefix-caching",))])
def test_sim_args_are_split_like_a_shell(sim_args, expect):
    from loadgen.config import workload as config
    from loadgen.cli.main import _glue_sim_args, build_parser
    from loadgen.config.options import values

    args = build_parser().parse_args(_glue_sim_args(["run", W, "--sim-args", sim_args]))
    assert config.load(W, values(args)).sim_args == expect


# Issue 25 item 5, through the parser too: `loadgen schedule` with every one of its flags given a hostile
# text exits 0 (a plan) or 2 with a message on stderr (argparse's own exit 2 included), never a traceback.
# --requests and --duration draw only from the fixed list: a random 7-digit count would plan for minutes.
SIZE_FLAGS = {"--requests", "--duration", "--rate"}


def _schedule_flags():
    from hypothesis import strategies as st

    from loadgen.config.options import OPTIONS, SCHEDULE
    from tests.unit.test_properties import HOSTILE_TEXT

    fixed = st.sampled_from(["", "-1", "0", "nan", "inf", "1e400", str(2**63), str(2**64 + 1), "²", "0s", "x"])
    flags = [o for o in OPTIONS if o.flag and SCHEDULE in o.commands]
    return st.lists(st.sampled_from(flags).flatmap(
        lambda o: st.tuples(st.just(o), fixed if o.flag in SIZE_FLAGS else HOSTILE_TEXT)), min_size=1, max_size=3)


def test_schedule_with_hostile_flags_exits_0_or_2_with_a_message(capsys):
    from hypothesis import given, settings, HealthCheck

    @settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(picks=_schedule_flags())
    def check(picks):
        argv = ["schedule", "--rate", "50/s", "--prompt-tokens", "8", "--max-tokens", "4", "--requests", "5"]
        for o, text in picks:
            argv += [o.flag] if o.switch else [f"{o.flag}={text}"]
        try:
            code = main(argv)
        except SystemExit as e:  # argparse: an unknown choice, a value it cannot take
            code = e.code
        out, err = capsys.readouterr()
        assert code in (0, 2), (argv, code, err)
        assert (code == 0 and out) or (code == 2 and err.strip()), (argv, err)
        assert "Traceback" not in err

    check()
