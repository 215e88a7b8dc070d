"""How loadgen talks to the target, beside the workload: extra headers, TLS verification, --overwrite.

Headers sent with every request to the target (the model list, the kind probe, /tokenize, calibration
probes, the run, /metrics scrapes; in every process of the run), in this
order, a later one replacing an earlier one of the same name: `--header 'K: V'` (repeatable),
`Authorization: Bearer <key>` from the workload's `request.api_key_env`, and `Authorization: Basic` from
credentials in the URL. The manifest's `client` section records the header names with secret-looking
values redacted (credentials.secret_header), and the TLS choice.

TLS (https:// targets and /metrics scrapes over https): verification is on by default; `--ca-bundle
FILE` verifies against that CA file; `--insecure` turns verification off (recorded in the manifest).
ssl_context() is the one choice every client takes: aiohttp's ssl= directly, and the short probes before
the run through probe/probe_http.tls_context().
"""
from __future__ import annotations

import ssl
from dataclasses import dataclass

from loadgen.errors import ConfigError
from loadgen.config.kinds import is_file
from loadgen.config.credentials import parse_header, redact_headers, remember_sent, split_url, value_problem
from loadgen.config.runconfig import RunConfig


@dataclass(frozen=True)
class ClientOptions:
    headers: tuple[tuple[str, str], ...] = ()
    insecure: bool = False
    ca_bundle: str | None = None
    overwrite: bool = False

    def ssl_context(self) -> ssl.SSLContext | bool:
        """For aiohttp's `ssl=`: False turns verification off; a context verifies against the bundle."""
        if self.insecure:
            return False
        if self.ca_bundle:
            try:
                return ssl.create_default_context(cafile=self.ca_bundle)
            except (ssl.SSLError, OSError) as e:
                raise ConfigError([f"--ca-bundle {self.ca_bundle}: not a CA file ({e})"]) from None
        return True

    def manifest(self, headers: dict[str, str]) -> dict:
        return {"headers": redact_headers(headers),
                "tls": {"verify": not self.insecure, "ca_bundle": self.ca_bundle}}


def client_options(headers: list[str] | None = None, insecure: bool | None = None, ca_bundle: str | None = None,
                   overwrite: bool | None = None) -> tuple[ClientOptions, list[str]]:
    """The client rows of the option table (options.py) -> (ClientOptions, every problem, each naming its
    flag). workload.load_run() validates them in the same round as the workload."""
    problems, parsed = [], []
    for h in headers or ():
        try:
            parsed.append(parse_header(h))
        except ValueError as e:
            problems.append(str(e))
    if insecure and ca_bundle:
        problems.append("--insecure and --ca-bundle: give one (no verification, or verification "
                        "against the bundle)")
    if ca_bundle and not is_file(ca_bundle):
        problems.append(f"--ca-bundle {ca_bundle}: no such file")
    return ClientOptions(tuple(parsed), bool(insecure), ca_bundle, bool(overwrite)), problems


def target_url_and_headers(config: RunConfig, opts: ClientOptions) -> tuple[str | None, dict[str, str]]:
    """(the target URL without credentials, every header sent to the target), remembered as this
    process's secrets (credentials.remember_sent). ConfigError when the URL's credentials and the API key
    would both be the Authorization header, or the key cannot be a header value."""
    url, basic = split_url(config.url) if config.url else (None, {})
    headers = dict(opts.headers)
    key = config.api_key()
    if key and basic:
        raise ConfigError([f"--url carries credentials and ${config.api_key_env} holds an API key: both "
                           f"would be the Authorization header; give one"])
    problem = value_problem(key) if key else None
    if problem:  # checked before anything is sent; the key itself is never shown
        raise ConfigError([f"${config.api_key_env} (request.api_key_env): the API key {problem}"])
    if key:
        headers["Authorization"] = f"Bearer {key}"
    headers.update(basic)
    remember_sent(headers)  # what the server echoes of them is scrubbed from every file and log
    return url, headers

