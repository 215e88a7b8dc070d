"""--tokenizer auto|server|approximate|FILE (one option row; config/workload.py _tokenizer_flag) against a
target without /tokenize (tests/misbehaving.py BasicAuthServer) and the simulator, which has one; and the
inexact-length WARNING said once per run."""
import orjson
import pytest

from tests.integration.conftest import RELAXED_SELFCHECK, loadgen
from tests.misbehaving import BasicAuthServer

AUTH = "Basic eDp5"
FLAGS = ("--rate", "20/s", "--prompt-tokens", "5", "--max-tokens", "3", "--requests", "6", "--no-calibrate",
         *RELAXED_SELFCHECK)


def _run(tmp_path, url, *flags, name="run", header=True):
    out = tmp_path / name
    p = loadgen("run", "--url", url, *(("--header", f"Authorization: {AUTH}") if header else ()), *FLAGS, *flags,
                "--out", str(out))
    manifest = orjson.loads((out / "manifest.json").read_bytes()) if (out / "manifest.json").is_file() else None
    return p, manifest


@pytest.fixture
def no_tokenize():
    with BasicAuthServer(AUTH) as server:
        yield server


def test_auto_falls_back_to_approximate_and_warns_once(tmp_path, no_tokenize):
    p, m = _run(tmp_path, no_tokenize.url)  # auto, the default
    assert p.returncode == 3, p.stderr
    assert m["workload"]["tokenizer"]["mode"] == "approximate" and m["workload"]["tokenizer"]["requested"] == "auto"
    assert p.stderr.count("WARNING: prompt lengths are NOT exact") == 1, p.stderr
    assert p.stderr.count("WARNING: the target has no usable /tokenize") == 1


def test_approximate_is_asked_for_and_keeps_the_run_valid(tmp_path, no_tokenize):
    p, m = _run(tmp_path, no_tokenize.url, "--tokenizer", "approximate")
    assert p.returncode == 0, p.stderr
    assert m["workload"]["tokenizer"]["requested"] == "approximate" and m["workload"]["prompt_lengths"][
        "asked_approximate"]
    assert "/tokenize" not in "".join(h.decode() for h in no_tokenize.heads)  # not even asked
    assert p.stderr.count("note: prompt lengths are NOT exact") == 1


def test_server_without_a_tokenize_is_exit_2(tmp_path, no_tokenize):
    p, m = _run(tmp_path, no_tokenize.url, "--tokenizer", "server")
    assert p.returncode == 2 and m is None, p.stderr
    assert "error: " in p.stderr and "/tokenize gave no usable token count" in p.stderr
    assert "Traceback" not in p.stderr


def test_server_and_file_against_the_sim(tmp_path, fixed_sim):
    p, m = _run(tmp_path, fixed_sim.url, "--tokenizer", "server", header=False)
    assert p.returncode == 0, p.stderr
    assert m["workload"]["tokenizer"]["mode"] == "server" and m["workload"]["prompt_lengths"]["exact"]
    # a local tokenizer.json given by path (relative to the working directory)
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({"[UNK]": 0}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(tmp_path / "tok.json"))
    out = tmp_path / "local"
    p = loadgen("run", "--url", fixed_sim.url, *FLAGS, "--tokenizer", "tok.json", "--out", str(out), cwd=tmp_path)
    assert p.returncode == 0, p.stderr  # whitespace words = the sim's tokens: exact
    m = orjson.loads((out / "manifest.json").read_bytes())
    assert m["workload"]["tokenizer"]["mode"] == "local" and m["config"]["tokenizer_file"] == str(tmp_path / "tok.json")
    assert m["workload"]["prompt_lengths"]["exact"]
    p = loadgen("run", "--url", fixed_sim.url, *FLAGS, "--tokenizer", "nope.json", "--out", str(tmp_path / "x"),
                cwd=tmp_path)
    assert p.returncode == 2
    assert "--tokenizer: must be auto, server, approximate or a tokenizer.json file, got 'nope.json'" in p.stderr
