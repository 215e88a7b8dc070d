"""Credentials and other secrets: where they come from, how they are sent, and that they never reach a
file or a log line.

Sources: the API key (the environment variable the workload names, sent as `Authorization: Bearer`),
credentials in the URL (`http://user:pass@host`: sent as HTTP Basic auth by every client of the target —
the raw and aiohttp transports, calibration, the /metrics scraper — and stripped from the URL they use),
and `--header 'K: V'` values. Everything written (manifest, stderr, error details) sees the URL without
its userinfo and header values redacted when they look like secrets (`secret_header`).
"""
from __future__ import annotations

import base64
import re
from urllib.parse import unquote, urlsplit, urlunsplit

REDACTED = "***"
# Header names whose values are secrets whatever they hold; other values are judged by their look.
_SECRET_NAMES = re.compile(r"auth|token|key|secret|password|cookie|session|credential", re.I)
_SECRET_VALUE = re.compile(r"^(bearer|basic|token)\s|^(sk|pk|hf|ghp|xox[bp])[-_]|^[A-Za-z0-9+/_\-.=]{24,}$", re.I)


def url_problems(url: str, flag: str = "--url") -> list[str]:
    """What is wrong with a target URL (empty when nothing is), all at once."""
    try:
        parts = urlsplit(url)
    except ValueError as e:  # "Invalid IPv6 URL": an unclosed [ in the host
        return [f"{flag}: {e} in {redact_url(url)!r}"]
    problems = []
    if parts.scheme not in ("http", "https"):
        problems.append(f"{flag}: must start with http:// or https://, got {redact_url(url)!r}")
    if not parts.hostname:
        problems.append(f"{flag}: no host in {redact_url(url)!r}")
    try:
        port = parts.port
    except ValueError:
        problems.append(f"{flag}: the port must be a number from 1 to 65535 in {redact_url(url)!r}")
    else:
        if port == 0:
            problems.append(f"{flag}: port 0 is not a server's port in {redact_url(url)!r}")
    return problems


def redact_url(url: str) -> str:
    """The URL without its userinfo (user:pass@ becomes ***@). Never raises, even on a malformed port or host."""
    try:
        parts = urlsplit(url)
    except ValueError:  # unparsable (an unclosed IPv6 bracket): cut whatever precedes an @ in the authority
        return re.sub(r"^([^/]*//)[^/]*@", rf"\1{REDACTED}@", url)
    if "@" not in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc=f"{REDACTED}@{parts.netloc.rsplit('@', 1)[1]}"))


def split_url(url: str) -> tuple[str, dict[str, str]]:
    """(the URL without userinfo, {"Authorization": "Basic ..."} or {}) for a URL that may carry credentials."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url, {}
    userinfo, host = parts.netloc.rsplit("@", 1)
    user, _, password = userinfo.partition(":")
    token = base64.b64encode(f"{unquote(user)}:{unquote(password)}".encode()).decode("ascii")
    return urlunsplit(parts._replace(netloc=host)), {"Authorization": f"Basic {token}"}


def parse_header(text: str) -> tuple[str, str]:
    """`K: V` from --header; ValueError names what is wrong."""
    name, sep, value = text.partition(":")
    name, value = name.strip(), value.strip()
    if not sep or not name:
        raise ValueError(f"--header {text!r}: expected 'Name: value'")
    if not re.fullmatch(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+", name):
        raise ValueError(f"--header {text!r}: {name!r} is not a valid header name")
    if any(c in value for c in "\r\n\0"):
        raise ValueError(f"--header {name}: the value may not hold CR, LF or NUL")
    return name, value


def secret_header(name: str, value: str) -> bool:
    return bool(_SECRET_NAMES.search(name) or _SECRET_VALUE.search(value))


def redact_headers(headers: dict[str, str]) -> dict[str, str]:
    return {k: (REDACTED if secret_header(k, v) else v) for k, v in headers.items()}



# Secrets a server may echo back inside an error text: an Authorization value, a URL's userinfo, a key
# that looks like an API key (sk-..., hf_...), a header line with a secret name, or a long opaque token.
_SECRET_IN_TEXT = (
    re.compile(r"\b(bearer|basic|token)\s+[A-Za-z0-9+/_\-.=~]+", re.I),
    re.compile(r"(?<=://)[^/\s@]+(?=@)"),
    re.compile(r"\b(sk|pk|hf|ghp|xox[bp])[-_][A-Za-z0-9_\-]{6,}", re.I),
    re.compile(r"(?<=[\"'\s{,])((?:[\w-]*(?:auth|token|key|secret|password|cookie)[\w-]*)[\"']?\s*[:=]\s*[\"']?)"
               r"[^\"'\s,}]+", re.I),
    re.compile(r"[A-Za-z0-9+/_\-=]{32,}"),
)


def redact_text(text: str) -> str:
    """text (a server's error body, an exception's message) with anything credential-like replaced by ***."""
    for i, pattern in enumerate(_SECRET_IN_TEXT):
        if i == 3:   # keep the name and its separator, redact the value
            text = pattern.sub(lambda m: m.group(1) + REDACTED, text)
        elif i == 0:
            text = pattern.sub(lambda m: m.group(1) + " " + REDACTED, text)
        else:
            text = pattern.sub(REDACTED, text)
    return text
