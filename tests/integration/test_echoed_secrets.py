"""A server that echoes the request's credentials in its error bodies (tests/misbehaving.EchoServer):
no secret the run sent (API key, secret --header values, URL credentials) reaches any file or log, read
after decompressing (Parquet string columns through Polars, the CSV and JSON-lines exports, the HTML and
Markdown reports, stdout and stderr); header values that cannot be sent are refused up front (exit 2)
without being printed. loadgen/config/credentials.py, results/folder.py."""
import base64
import json
import os

import polars as pl
import pytest

from tests.integration.conftest import loadgen, workload
from tests.misbehaving import EchoServer

# none of these has the look redact_text's patterns know (no sk- prefix, under 24 characters): only
# scrubbing what was sent finds them
KEY = "Zq9-apikey-77"
SESSION = "ab12/cd34+ef"          # JSON and percent-encoding change it: those forms are sought too
COOKIE = "sid=yummy-c00kie"
PASSWORD = "s3cret-Pa55"
WITH_KEY = '[request]\napi_key_env = "LG_ECHO_KEY"\n'


def texts_of_folder(out) -> dict[str, str]:
    """Every file of the results folder as text, Parquet files as every value of their string columns."""
    texts = {}
    for f in out.rglob("*"):
        if f.suffix == ".parquet":
            df = pl.read_parquet(f)
            texts[str(f)] = "\n".join(str(v) for c, t in df.schema.items() if t == pl.String
                                      for v in df[c].drop_nulls())
        elif f.is_file():
            texts[str(f)] = f.read_bytes().decode("latin-1")
    return texts


@pytest.mark.parametrize("case", ["api-key", "url-credentials-workers"])
def test_secrets_a_server_echoes_are_stored_nowhere(tmp_path, case):
    out = tmp_path / "r"
    extra, env = (WITH_KEY, {"LG_ECHO_KEY": KEY}) if case == "api-key" else ("", {})
    with EchoServer() as server:
        url = server.url if case == "api-key" else f"http://alice:{PASSWORD}@127.0.0.1:{server.port}"
        flags = ["--workers", "2"] if "workers" in case else []
        p = loadgen("run", workload(tmp_path, requests=8, rate="20/s", max_tokens=3, tokenizer="approximate",
                                    extra=extra),
                    "--url", url, "--out", str(out), "--no-calibrate", "--scrape-metrics",
                    "--scrape-interval", "200ms", "--header", f"X-Session-Id: {SESSION}",
                    "--header", f"Cookie: {COOKIE}", *flags, env={**os.environ, **env}, timeout=120)
        bodies = b"\n".join(server.bodies).decode()
    assert p.returncode == 3, p.stderr  # every request failed (401): invalid, with a folder
    secrets = [SESSION, COOKIE, *([KEY] if case == "api-key" else
                                 [PASSWORD, base64.b64encode(f"alice:{PASSWORD}".encode()).decode()])]
    # the premise: the server did echo every secret (its error bodies, JSON-escaped ones too)
    assert all(s in bodies or json.dumps(s)[1:-1] in bodies for s in secrets), bodies
    requests = pl.read_parquet(out / "requests.parquet")
    assert requests.height == 8 and (requests["http_status"] == 401).all()
    assert requests["error_detail"].str.contains("***", literal=True).all()  # scrubbed, not dropped
    outputs = {"run stdout": p.stdout, "run stderr": p.stderr, **texts_of_folder(out)}
    for fmt in ("csv", "jsonl"):
        e = loadgen("export", str(out), "--format", fmt)
        assert e.returncode == 0, e.stderr
        outputs[f"export {fmt}"] = e.stdout + e.stderr
    for fmt in ("text", "html", "md", "json"):
        r = loadgen("report", str(out), "--format", fmt)
        assert r.returncode == 0, r.stderr
        outputs[f"report {fmt}"] = r.stdout + r.stderr
    for secret in secrets:
        for form in {secret, json.dumps(secret)[1:-1]}:
            leaks = [name for name, text in outputs.items() if form in text]
            assert leaks == [], (form, leaks)


@pytest.mark.parametrize("value, where", [(KEY + "\n", "at its end"), (KEY[:4] + "\r\n" + KEY[4:], "character 5"),
                                          (KEY + "\x01", "control character 0x01")])
def test_an_api_key_that_cannot_be_a_header_is_refused_without_being_shown(tmp_path, value, where):
    with EchoServer() as server:
        p = loadgen("run", workload(tmp_path, requests=2, tokenizer="approximate", extra=WITH_KEY),
                    "--url", server.url, "--out", str(tmp_path / "r"), "--no-calibrate",
                    env={**os.environ, "LG_ECHO_KEY": value})
        heads = list(server.heads)
    assert p.returncode == 2, p.stderr
    assert "$LG_ECHO_KEY" in p.stderr and where in p.stderr and "Traceback" not in p.stderr
    assert KEY not in p.stdout + p.stderr and KEY[4:] not in p.stdout + p.stderr
    assert heads == [] and not (tmp_path / "r").exists()  # refused before anything was sent or made


@pytest.mark.parametrize("header, message", [
    (f"Authorization Bearer {KEY}", "expected 'Name: value'"),       # no colon: the text is a secret
    (f"X-Api-Key: {KEY}\x7f", "--header X-Api-Key: the value holds control character 0x7f"),
    (f"X-Api-Key: {KEY}\u20ac", "--header X-Api-Key: the value holds a character beyond Latin-1"),
])
def test_a_header_value_that_cannot_be_sent_is_refused_without_being_shown(tmp_path, header, message):
    p = loadgen("run", workload(tmp_path, requests=2), "--url", "http://127.0.0.1:9", "--header", header,
                "--out", str(tmp_path / "r"))
    assert p.returncode == 2 and message in p.stderr and "Traceback" not in p.stderr, p.stderr
    assert KEY not in p.stdout + p.stderr
