"""Issue 15 defect 4: credentials in the URL are sent as HTTP Basic auth by every client of the target
(raw and aiohttp transports, calibration, the /metrics scraper), and no secret (URL password, API key,
secret-looking --header value) appears in any file of the results folder, on stdout or on stderr."""
import base64
import os

import orjson
import pytest

from tests.integration.conftest import loadgen, workload
from tests.misbehaving import BasicAuthServer

PASSWORD = "s3cret-Pa55word"
TOKEN = "tok-5ecretheadervalue0123"
KEY = "sk-apikey-9876543210abcdef"


@pytest.mark.parametrize("transport", ["raw", "aiohttp"])
def test_url_credentials_are_sent_as_basic_auth_and_written_nowhere(tmp_path, transport):
    basic = "Basic " + base64.b64encode(f"alice:{PASSWORD}".encode()).decode()
    out = tmp_path / "r"
    with BasicAuthServer(basic) as server:
        url = f"http://alice:{PASSWORD}@127.0.0.1:{server.port}"
        p = loadgen("run", workload(tmp_path, requests=6, rate="20/s", max_tokens=3, tokenizer="approximate"),
                    "--url", url, "--model", "m",  # the one model BasicAuthServer lists (it is checked)
                    "--out", str(out), "--scrape-metrics", "--scrape-interval", "100ms",
                    "--header", f"X-Api-Token: {TOKEN}", "--header", "X-Team: blue",
                    env={**os.environ, "LOADGEN_TRANSPORT": transport}, timeout=100)
        unauthorized = list(server.unauthorized)
        heads = list(server.heads)
    assert p.returncode == 0, p.stderr
    assert unauthorized == []
    posts = [h for h in heads if b"completions" in h.split(b"\r\n")[0]]
    assert posts and all(f"X-Api-Token: {TOKEN}".encode() in h and b"X-Team: blue" in h for h in posts)
    manifest = orjson.loads((out / "manifest.json").read_bytes())
    assert manifest["scrape"]["errors"] == 0 and manifest["scrape"]["scrapes"] > 0
    assert manifest["client"]["headers"]["X-Team"] == "blue"
    assert manifest["client"]["headers"]["X-Api-Token"] == "***"
    assert manifest["target"]["url"] == f"http://127.0.0.1:{server.port}"
    assert manifest["config"]["url"] == f"http://***@127.0.0.1:{server.port}"
    assert manifest["client"]["headers"]["Authorization"] == "***"
    import polars as pl
    assert (pl.read_parquet(out / "requests.parquet")["outcome"] == "ok").all()
    rep = loadgen("report", str(out))
    assert rep.returncode == 0, rep.stderr
    outputs = {"stdout": p.stdout + rep.stdout, "stderr": p.stderr + rep.stderr}
    outputs.update({str(f): f.read_bytes().decode("latin-1") for f in out.rglob("*") if f.is_file()})
    for secret in (PASSWORD, basic.split()[1], TOKEN):
        leaks = [name for name, text in outputs.items() if secret in text]
        assert leaks == [], (secret, leaks)


def test_api_key_and_url_credentials_together_are_refused(tmp_path):
    wl = workload(tmp_path, requests=2, extra='[request]\napi_key_env = "LG_TEST_KEY"\n')
    p = loadgen("run", wl, "--url", "http://a:b@127.0.0.1:9", "--out", str(tmp_path / "r"),
                env={**os.environ, "LG_TEST_KEY": KEY})
    assert p.returncode == 2 and "give one" in p.stderr and KEY not in p.stderr + p.stdout


@pytest.mark.parametrize("flags, message", [
    (["--header", "NoColon"], "expected 'Name: value'"),
    (["--insecure", "--ca-bundle", "/nonexistent"], "--ca-bundle /nonexistent: no such file"),
    (["--url", "http://127.0.0.1:notaport"], "--url: the port must be a number"),
])
def test_client_flag_errors_are_named(tmp_path, flags, message):
    p = loadgen("run", workload(tmp_path, requests=2), *flags, "--out", str(tmp_path / "r"))
    assert p.returncode == 2 and message in p.stderr and "Traceback" not in p.stderr, p.stderr
