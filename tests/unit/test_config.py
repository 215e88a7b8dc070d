"""Bad workload files and flags: every problem reported at once, naming the file and key or flag."""
import subprocess
import sys
import textwrap

import pytest

from loadgen.config import workload as config
from loadgen.config.workload import ConfigError

GOOD = """
model = "m"
api = "chat"
seed = 1
[arrivals]
process = "poisson"
rate = "8/s"
[run]
requests = 10
[prompt]
tokens = 16
[output]
tokens = { dist = "uniform", min = 4, max = 8 }
[request]
api_key_env = "LOADGEN_TEST_KEY"
extra_body = { ignore_eos = true }
"""


def write(tmp_path, text: str):
    p = tmp_path / "w.toml"
    p.write_text(textwrap.dedent(text))
    return p


def problems(tmp_path, text: str, overrides=None) -> list[str]:
    with pytest.raises(ConfigError) as e:
        config.load(write(tmp_path, text), overrides)
    return e.value.problems


def test_good_file_loads(tmp_path):
    c = config.load(write(tmp_path, GOOD))
    assert (c.model, c.api, c.requests, c.arrivals.rate_per_s) == ("m", "chat", 10, 8.0)
    assert c.output_tokens == config.Lengths("uniform", min=4, max=8)


@pytest.mark.parametrize("edit,expected", [
    # a typo in a key is never ignored
    (("[arrivals]", "[arrivals]\nrat = 3"), "w.toml: arrivals.rat: unknown key"),
    # rates need a number and a unit
    (('rate = "8/s"', 'rate = "fast"'), "w.toml: arrivals.rate: bad rate 'fast'"),
    (('rate = "8/s"', 'rate = -2'), "w.toml: arrivals.rate: bad rate -2: must be > 0"),
    # a subnormal rate's gaps overflow int64 ns: planning it looped, growing memory (found by hypothesis)
    (('rate = "8/s"', 'rate = 5e-324'), "w.toml: arrivals.rate: bad rate 5e-324: below 1e-06/s"),
    # an infinite number is not the word "inf" (every request at t0): it planned zero gaps forever
    (('rate = "8/s"', 'rate = "1e400/s"'), "w.toml: arrivals.rate: bad rate '1e400/s': not a finite number"),
    # an infinite duration was an OverflowError traceback
    (("requests = 10", 'duration = "1e400s"'), "w.toml: run.duration: bad duration '1e400s': at most 146 years"),
    # unknown API
    (('api = "chat"', 'api = "grpc"'),
     "w.toml: api: must be one of completions, chat, responses, messages, embeddings, rerank, got 'grpc'"),
    # exactly one of requests and duration
    (("requests = 10", 'requests = 10\nduration = "5s"'), "w.toml: run: give exactly one of requests or duration"),
    (("requests = 10", 'duration = "5"'), "w.toml: run.duration: duration '5' needs a unit"),
    (("requests = 10", "requests = 0"), "w.toml: run.requests: must be >= 1, got 0"),
    # lengths
    (("tokens = 16", "tokens = 0"), "w.toml: prompt.tokens: must be >= 1, got 0"),
    (("min = 4, max = 8", "min = 9, max = 8"), "w.toml: output.tokens: min (9) must be <= max (8)"),
    (('dist = "uniform"', 'dist = "zipf"'), "w.toml: output.tokens.dist: must be one of fixed, uniform"),
    # the body fields loadgen owns cannot be overridden
    (("ignore_eos = true", "stream = false"), "w.toml: request.extra_body.stream: is set by loadgen"),
    (('model = "m"', "model = 3"), "w.toml: model: must be a non-empty string, got 3"),
    (("ignore_eos = true", "max_output_tokens = 3"), "w.toml: request.extra_body.max_output_tokens: is set by"),
    # the event-stream APIs are OpenAI-compatible servers' endpoints: no native backend speaks them
    (('api = "chat"', 'api = "messages"\nbackend = "llamacpp"'),
     "w.toml: api: 'messages' is served by OpenAI-compatible servers (vLLM, SGLang, llama-server, Ollama's /v1): "
     "it needs backend = \"openai\", not 'llamacpp'"),
])
def test_broken_files_name_the_key(tmp_path, edit, expected):
    old, new = edit
    assert old in GOOD
    found = problems(tmp_path, GOOD.replace(old, new, 1))
    assert any(expected in p for p in found), found


def test_every_problem_is_reported_at_once(tmp_path):
    text = GOOD.replace('rate = "8/s"', 'rate = "x"').replace("requests = 10", "requests = -1").replace(
        'api = "chat"', 'api = "x"')
    assert len(problems(tmp_path, text)) == 3


@pytest.mark.parametrize("flag,value,expected", [
    ("--rate", "abc", "--rate: bad rate 'abc'"),
    ("--requests", "ten", "--requests: must be an integer, got 'ten'"),
    ("--duration", "10", "--duration: duration '10' needs a unit"),
    ("--prompt-tokens", "5..2", "--prompt-tokens: min (5) must be <= max (2)"),
    ("--api", "rest", "--api: must be one of completions, chat"),
])
def test_bad_flags_name_the_flag(tmp_path, flag, value, expected):
    found = problems(tmp_path, GOOD, {flag: value})
    assert any(expected in p for p in found), found


def test_flags_override_the_file(tmp_path):
    c = config.load(write(tmp_path, GOOD), {"--rate": "2/s", "--duration": "3s", "--max-tokens": "7",
                                            "--prompt-tokens": "10..20"})
    assert (c.arrivals.rate_per_s, c.requests, c.duration_ns) == (2.0, None, 3_000_000_000)
    assert c.output_tokens.value == 7 and c.prompt_tokens == config.Lengths("uniform", min=10, max=20)


def test_missing_and_unparsable_files(tmp_path):
    with pytest.raises(ConfigError, match="no such workload file"):
        config.load(tmp_path / "nope.toml")
    with pytest.raises(ConfigError, match="not valid TOML"):
        config.load(write(tmp_path, "model = "))


def test_manifest_never_holds_the_key_or_url_credentials(tmp_path, monkeypatch):
    monkeypatch.setenv("LOADGEN_TEST_KEY", "sk-secret-123")
    c = config.load(write(tmp_path, GOOD), url="http://user:pw@127.0.0.1:9/")
    assert c.api_key() == "sk-secret-123"
    text = str(c.to_manifest())
    assert "sk-secret-123" not in text and "pw" not in text and "LOADGEN_TEST_KEY" in text


@pytest.mark.parametrize("args,expected", [
    (["run", "{w}", "--rate", "nope"], "--rate: bad rate 'nope'"),
    (["run", "{w}", "--url", "localhost:8000"], "--url: must start with http://"),
    (["run", "{missing}"], "no such workload file"),
    (["report", "{tmp}"], "not a loadgen results folder"),
    (["run", "{w}", "--requests", "3", "--duration", "1s"], "not allowed with argument"),
])
def test_cli_exits_2_with_a_message_and_no_traceback(tmp_path, args, expected):
    w = write(tmp_path, GOOD)
    argv = [a.format(w=w, missing=tmp_path / "missing.toml", tmp=tmp_path) for a in args]
    p = subprocess.run([sys.executable, "-m", "loadgen", *argv], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2, p.stderr
    assert expected in p.stderr and "Traceback" not in p.stderr
