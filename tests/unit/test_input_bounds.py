"""Issue 25 item 5 through the CLI: each input that printed a traceback is an exit-2 message naming its flag,
key or file, every numeric input is checked finite and within its documented range, and those ranges are
true (the plan's limit is what the prompt maker can make)."""
import errno
import os
import re
from pathlib import Path

import numpy as np
import orjson
import polars as pl
import pytest

from loadgen.cli.main import main
from loadgen.config.kinds import INT64_MAX
from loadgen.plan import prompts
from loadgen.plan.limits import MAX_PROMPT_TOKENS
from tests.synthetic_run import make_run

BEYOND = str(2**64 + 1)                 # beyond int64 (and uint64): orjson, numpy and Parquet refuse it
FLAGS = ["--rate", "5/s", "--prompt-tokens", "4", "--max-tokens", "4", "--requests", "3"]


def _fails(capsys, argv, *needles) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    for n in needles:
        assert n in err, err
    return err


@pytest.mark.parametrize("flag", ["--seed", "--max-concurrency", "--concurrency", "--prompt-tokens",
                                  "--max-tokens", "--requests", "--warmup-requests", "--prompt-salt"])
def test_an_integer_beyond_int64_names_its_flag(capsys, tmp_path, flag):
    # run checks every flag before anything starts: nothing is sent, no folder is made
    out = tmp_path / "out"
    argv = ["run", *FLAGS, "--no-calibrate", "--out", str(out), flag, BEYOND]
    _fails(capsys, argv, f"{flag}: must be <= ")
    assert not out.exists()


def test_int64_max_is_the_seeds_bound(capsys):
    assert main(["schedule", *FLAGS, "--seed", str(INT64_MAX)]) == 0
    capsys.readouterr()
    _fails(capsys, ["schedule", *FLAGS, "--seed", str(INT64_MAX + 1)], f"--seed: must be <= {INT64_MAX}")


def test_digits_that_are_not_ascii_are_refused_not_raised(capsys):
    # "²".isdigit() is True, int("²") raises: each parser must refuse it by name
    _fails(capsys, ["schedule", *FLAGS, "--seed", "²"], "--seed: must be an integer")
    _fails(capsys, ["schedule", "--rate", "5/s", "--prompt-tokens", "4..²", "--max-tokens", "4", "--requests", "3"],
           "--prompt-tokens: must be N or MIN..MAX")


def test_a_url_with_an_unclosed_ipv6_bracket(capsys):
    err = _fails(capsys, ["run", *FLAGS, "--url", "http://user:secret@[::1"], "--url: Invalid IPv6 URL")
    assert "secret" not in err


def test_compare_seed_and_resamples_are_bounded(capsys, tmp_path):
    a = make_run(tmp_path / "a", 50)
    _fails(capsys, ["compare", str(a), str(a), "--seed", "-1"], "--seed: must be a whole number from 0")
    _fails(capsys, ["compare", str(a), str(a), "--seed", BEYOND], "--seed: must be a whole number")
    _fails(capsys, ["compare", str(a), str(a), "--resamples", "10" * 10], "--resamples: must be a whole number")


def test_the_documented_prompt_limit_is_what_a_prompt_can_be(capsys):
    # the limit refuses what the prompt maker cannot make (it raised "at most 1048573 distinct words")
    assert MAX_PROMPT_TOKENS == prompts.MAX_PROMPT_WORDS
    assert len(prompts.word_walk(np.random.default_rng(0), MAX_PROMPT_TOKENS)) == MAX_PROMPT_TOKENS
    _fails(capsys, ["schedule", "--rate", "5/s", "--prompt-tokens", "4194304", "--max-tokens", "4", "--requests", "2"],
           "--prompt-tokens: a planned prompt of 4,194,304 tokens exceeds the 1,048,573 allowed")
    doc = (Path(__file__).resolve().parents[2] / "docs" / "robustness.md").read_text()
    assert "a prompt above\n  1,048,573 tokens" in doc


NON_FINITE = [
    ('{dist = "normal", mean = inf, sd = nan}', ("output.tokens.mean", "output.tokens.sd")),
    ('{dist = "lognormal", median = 100, sigma = inf}', ("output.tokens.sigma",)),
    ('{dist = "uniform", min = 1, max = 99999999999999999999}', ("output.tokens.max",)),
    ('{dist = "mixture", components = [{weight = inf, value = 3}]}', ("components[0].weight",)),
    ('99999999999999999999', ("output.tokens: must be <=",)),
]


@pytest.mark.parametrize("tokens, keys", NON_FINITE)
def test_a_non_finite_or_huge_length_is_refused(capsys, tmp_path, tokens, keys):
    # mean = inf, sd = nan planned max_tokens = -9223372036854775808 and ran to exit 0
    w = tmp_path / "w.toml"
    w.write_text(f'[arrivals]\nrate = "5/s"\n[run]\nrequests = 3\n[prompt]\ntokens = 5\n[output]\ntokens = {tokens}\n')
    _fails(capsys, ["schedule", str(w)], *keys)


@pytest.mark.parametrize("line, key", [("burstiness = inf", "arrivals.burstiness"),
                                       ("burstiness = nan", "arrivals.burstiness")])
def test_non_finite_arrival_numbers(capsys, tmp_path, line, key):
    w = tmp_path / "w.toml"
    w.write_text(f'[arrivals]\nprocess = "gamma"\nrate = "5/s"\n{line}\n[run]\nrequests = 3\n'
                 f'[prompt]\ntokens = 5\n[output]\ntokens = 5\n')
    _fails(capsys, ["schedule", str(w)], key)


@pytest.mark.parametrize("flag", ["--max-rate-deviation", "--max-cv-deviation", "--time-scale"])
@pytest.mark.parametrize("value", ["inf", "nan", "-inf"])
def test_non_finite_ratios(capsys, flag, value):
    _fails(capsys, ["run", *FLAGS, f"{flag}={value}"], f"{flag}: must be a number > 0")


def test_a_folder_given_as_the_workload(capsys, tmp_path):
    _fails(capsys, ["schedule", str(tmp_path)], f"{tmp_path}: is a folder, not a workload file")


def test_report_window_must_be_positive(capsys, tmp_path):
    run = make_run(tmp_path / "r", 40)
    _fails(capsys, ["report", str(run), "--window", "0s"], "--window: must be > 0")


@pytest.mark.parametrize("manifest, needle", [
    (b"[1, 2]", "must be a JSON object, got list"),
    (b'"text"', "must be a JSON object, got str"),
    (b'{"status": "complete", "t0": "x", "workload": 5, "invalid_reasons": {}}', "t0 must be a JSON object"),
])
def test_a_manifest_of_the_wrong_shape(capsys, tmp_path, manifest, needle):
    run = make_run(tmp_path / "r", 40)
    (run / "manifest.json").write_bytes(manifest)
    for command in (["report", str(run)], ["export", str(run), "--format", "csv"]):
        _fails(capsys, command, f"{run / 'manifest.json'}: not a loadgen manifest", needle)


def test_report_of_a_read_only_folder_still_reports(capsys, tmp_path, monkeypatch):
    # root ignores a folder's mode bits, so the read-only file system is what the rename meets (EROFS)
    run = make_run(tmp_path / "r", 40)

    def read_only(src, dst):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(dst))

    monkeypatch.setattr(os, "replace", read_only)
    assert main(["report", str(run), "--format", "json"]) == 0
    out, err = capsys.readouterr()
    assert orjson.loads(out)["requests"]["scheduled"] == 40
    assert "summary.json and decomposition.parquet not saved (Read-only file system)" in err, err
    assert not (run / "summary.json").exists()


@pytest.mark.parametrize("fmt", ["html", "md"])
@pytest.mark.parametrize("failed_side", ["a", "b"])
def test_a_compare_page_with_a_side_without_any_success(capsys, tmp_path, fmt, failed_side):
    runs = {s: make_run(tmp_path / s, 60, seed=1) for s in "ab"}
    rows = runs[failed_side] / "requests.parquet"
    failed = (pl.lit("http_error").alias("outcome"), pl.lit(500, pl.Int32).alias("http_status"),
              pl.lit(None, pl.Int64).alias("first_token_ns"))
    pl.read_parquet(rows).with_columns(*failed).write_parquet(rows)
    c = tmp_path / "c.json"
    assert main(["compare", str(runs["a"]), str(runs["b"]), "--format", "json", "--out", str(c)]) in (0, 3)
    capsys.readouterr()
    assert any(m["rel"] is None for m in orjson.loads(c.read_bytes())["comparisons"][0]["metrics"])
    assert main(["report", str(c), "--format", fmt]) == 0
    page = capsys.readouterr().out
    assert not re.search(r"\b(None|nan|inf)\b", page), re.search(r".{60}\b(None|nan|inf)\b.{20}", page)
    assert "change CI" in page


LONG = "x" * 300   # beyond NAME_MAX: os.stat raises ENAMETOOLONG, which Path.is_file() does not swallow


@pytest.mark.parametrize("argv, needle", [
    (["schedule", LONG], "cannot read the workload file: File name too long"),
    (["schedule", *FLAGS[:2], "--requests", "3", f"--trace={LONG}"], "--trace: no such file"),
    (["schedule", *FLAGS, f"--tokenizer={LONG}"], "--tokenizer: must be auto, server, approximate or a tokenizer"),
    (["schedule", *FLAGS, "--trace=a\x00b"], "--trace: no such file"),
    (["report", LONG], "not a loadgen results folder"),
    (["export", LONG, "--format", "csv"], "not a loadgen results folder"),
])
def test_a_name_the_system_refuses_is_named_not_raised(capsys, argv, needle):
    _fails(capsys, argv, needle)
