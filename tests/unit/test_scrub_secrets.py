"""The secrets a process sends are scrubbed wherever text is written (loadgen/config/credentials.py,
results/folder.py write_json/write_parquet, run/outcome.say); header values are checked without being shown."""
import base64
import io

import orjson
import polars as pl
import pytest

from loadgen.config import credentials
from loadgen.config.credentials import (ScrubbedStream, parse_header, redact_text, remember_sent, scrub,
                                        secret_pieces, value_problem)
from loadgen.results.folder import write_json, write_parquet
from loadgen.run.outcome import say


@pytest.fixture(autouse=True)
def fresh_secrets(monkeypatch):
    monkeypatch.setattr(credentials, "_SENT", set())


def test_the_pieces_of_each_secret_header_are_sought_and_ordinary_headers_are_not():
    basic = base64.b64encode(b"alice:pw-1234").decode()
    pieces = secret_pieces({"Authorization": f"Basic {basic}", "X-Session": 'a"b/c', "X-Team": "blue"})
    assert {f"Basic {basic}", basic, "alice:pw-1234", "pw-1234"} <= pieces
    assert {'a"b/c', 'a\\"b/c', "a%22b%2Fc"} <= pieces          # as sent, JSON-escaped, percent-encoded
    assert not any("blue" in p for p in pieces)
    assert secret_pieces({"X-Token": "abc"}) == set()             # under MIN_SECRET_CHARS: not sought


def test_scrub_replaces_every_form_longest_first_and_nothing_before_remember_sent():
    text = "key Zq9-apikey-77 in Bearer Zq9-apikey-77"
    assert scrub(text) == text
    remember_sent({"Authorization": "Bearer Zq9-apikey-77"})
    assert scrub(text) == "key *** in ***"
    assert redact_text("Incorrect API key provided: Zq9-apikey-77.") == "Incorrect API key provided: ***."


def test_files_and_stderr_are_scrubbed(tmp_path):
    remember_sent({"Cookie": "sid=yummy"})
    write_json(tmp_path / "m.json", {"a": ["echo: sid=yummy"], "b": 1})
    assert orjson.loads((tmp_path / "m.json").read_bytes()) == {"a": ["echo: ***"], "b": 1}
    write_parquet(tmp_path / "r.parquet", pl.DataFrame({"e": ["x sid=yummy y", None], "n": [1, 2]}))
    assert pl.read_parquet(tmp_path / "r.parquet").to_dicts() == [{"e": "x *** y", "n": 1}, {"e": None, "n": 2}]
    out = io.StringIO()
    ScrubbedStream(out).write("said sid=yummy\n")
    say(out, "progress sid=yummy")
    assert out.getvalue() == "said ***\nprogress ***\n"


@pytest.mark.parametrize("value, problem", [
    ("abc\n", "line break at its end"), ("a\r\nb", "line break at character 2"),
    ("a\x00b", "control character 0x00 at character 2"), ("a\x7f", "control character 0x7f"),
    ("a\u20acb", "beyond Latin-1 at character 2")])
def test_a_value_that_cannot_be_a_header_is_named_by_position_never_shown(value, problem):
    said = value_problem(value)
    assert said is not None and problem in said and value not in said
    for text in (f"X-Api-Key: q{value}q", f"X-Api-Key: q{value}"):  # inside, and at the end
        with pytest.raises(ValueError) as e:
            parse_header(text)
        assert str(e.value).startswith("--header X-Api-Key: the value") and value not in str(e.value)


def test_a_value_that_can_be_a_header_passes():
    assert value_problem("Bearer sk-abc\tdéf ~!") is None
    with pytest.raises(ValueError) as e:
        parse_header("Authorization Bearer sk-secret-1")
    assert "sk-secret-1" not in str(e.value) and "expected 'Name: value'" in str(e.value)


def test_a_malformed_event_is_scrubbed_before_it_is_cut():
    # cut first at 120 characters, the key would keep its first 10 characters, too few to be recognised
    from loadgen.client.backends.stream import Stream
    remember_sent({"Authorization": "Bearer Zq9-apikey-77"})
    s = Stream()
    assert s.decode(b"x" * 110 + b"Zq9-apikey-77 is not valid") is None
    assert s.malformed is not None and "Zq9-apikey" not in s.malformed and "***" in s.malformed
