"""Credentials and other secrets: where they come from, how they are sent, and that they never reach a
file or a log line.

Sources: the API key (the environment variable the workload names, sent as `Authorization: Bearer`),
credentials in the URL (`http://user:pass@host`: sent as HTTP Basic auth by every client of the target —
the raw and aiohttp transports, calibration, the /metrics scraper — and stripped from the URL they use),
and `--header 'K: V'` values. Everything written (manifest, stderr, error details) sees the URL without
its userinfo and header values redacted when they look like secrets (`secret_header`).

What the server sends back is scrubbed too: once a process knows the headers it sends (`remember_sent`,
called where they are made, in the driver and in every worker), `scrub` replaces each secret it sends
(a secret header's value, the token after its Bearer/Basic/Token scheme, a Basic token's decoded
`user:pass` and password; each also as JSON-escaped and percent-encoded; pieces under MIN_SECRET_CHARS
characters are not sought) by *** wherever text is written: every string of a JSON or Parquet file of
the results folder (results/folder.py) and stderr (`ScrubbedStream`). `redact_text` (a server's error
text) adds the look of a credential to that. Header values (the API key's included) are checked before
anything is sent (`value_problem`): a problem names the flag or variable, never the value.
"""
from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Mapping
from typing import TextIO
from urllib.parse import quote, unquote, urlsplit, urlunsplit

REDACTED = "***"
# Header names whose values are secrets whatever they hold; other values are judged by their look.
_SECRET_NAMES = re.compile(r"auth|token|key|secret|password|cookie|session|credential", re.I)
_SECRET_VALUE = re.compile(r"^(bearer|basic|token)\s|^(sk|pk|hf|ghp|xox[bp])[-_]|^[A-Za-z0-9+/_\-.=]{24,}$", re.I)


def url_problems(url: str, flag: str = "--url") -> list[str]:
    """What is wrong with a target URL (empty when nothing is), all at once, each after `flag: `."""
    return [f"{flag}: {p}" for p in bare_url_problems(url)]


def bare_url_problems(url: str) -> list[str]:
    """url_problems without the flag: each names the URL (redacted)."""
    try:
        parts = urlsplit(url)
    except ValueError as e:  # "Invalid IPv6 URL": an unclosed [ in the host
        return [f"{e} in {redact_url(url)!r}"]
    problems = []
    if parts.scheme not in ("http", "https"):
        problems.append(f"must start with http:// or https://, got {redact_url(url)!r}")
    if not parts.hostname:
        problems.append(f"no host in {redact_url(url)!r}")
    try:
        port = parts.port
    except ValueError:
        problems.append(f"the port must be a number from 1 to 65535 in {redact_url(url)!r}")
    else:
        if port == 0:
            problems.append(f"port 0 is not a server's port in {redact_url(url)!r}")
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
    """`K: V` from --header; ValueError names what is wrong (the name, never the value)."""
    name, sep, value = text.partition(":")
    name, value = name.strip(), value.strip(" \t")  # HTTP's optional white space; a line break is refused
    if not sep or not name:
        raise ValueError("--header: expected 'Name: value' (no ':' found; the text is not shown: it may be a "
                         "secret)")
    if not re.fullmatch(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+", name):
        raise ValueError(f"--header: {name[:40]!r} is not a valid header name (expected 'Name: value')")
    problem = value_problem(value)
    if problem:
        raise ValueError(f"--header {name}: the value {problem}")
    return name, value


def value_problem(value: str) -> str | None:
    """Why a header value cannot be sent as it is (HTTP/1.1 field-value: tab, visible characters, Latin-1),
    None when it can. Says where the problem is, never the value (it may be a secret)."""
    for i, c in enumerate(value):
        if c in "\r\n":
            where = "at its end" if not value[i:].strip() else f"at character {i + 1}"
            return f"holds a line break {where} (a trailing newline from a file or `echo`?); remove it"
        if (ord(c) < 0x20 and c != "\t") or ord(c) == 0x7F:
            return f"holds control character {ord(c):#04x} at character {i + 1}"
        if ord(c) > 0xFF:
            return f"holds a character beyond Latin-1 at character {i + 1}, which HTTP headers cannot carry"
    return None


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


MIN_SECRET_CHARS = 4   # shorter pieces are not sought: replacing them would garble ordinary text
_SENT: set[str] = set()  # every form of every secret this process sends (remember_sent)


def _scheme_token(value: str) -> str | None:
    m = re.match(r"(?i)(bearer|basic|token)\s+(\S+)", value)
    return m.group(2) if m else None


def secret_pieces(headers: Mapping[str, str]) -> set[str]:
    """What a server could echo of the secrets in these headers: each secret value, its scheme's token, a
    Basic token decoded (user:pass) and its password."""
    pieces: set[str] = set()
    for name, value in headers.items():
        if not secret_header(name, value):
            continue
        token = _scheme_token(value)
        pieces.update(p for p in (value, token) if p)
        if token and value.lower().startswith("basic"):
            try:
                userpass = base64.b64decode(token, validate=True).decode("utf-8")
            except (binascii.Error, UnicodeDecodeError):
                continue
            pieces.update((userpass, userpass.partition(":")[2]))
    forms: set[str] = set()
    for p in pieces:
        forms.update((p, json.dumps(p)[1:-1], json.dumps(p, ensure_ascii=False)[1:-1], quote(p, safe="")))
    return {f for f in forms if len(f) >= MIN_SECRET_CHARS}


def remember_sent(headers: Mapping[str, str]) -> None:
    """From now on, scrub() in this process replaces every secret of these headers (the ones it sends)."""
    _SENT.update(secret_pieces(headers))


def scrub(text: str) -> str:
    """text with every secret this process sends (remember_sent) replaced by ***; longest first, so a
    piece inside a longer one does not leave the rest behind."""
    if not _SENT:
        return text
    for piece in sorted(_SENT, key=len, reverse=True):
        if piece in text:
            text = text.replace(piece, REDACTED)
    return text


def sent_secrets() -> tuple[str, ...]:
    """The forms scrub() replaces, longest first (for writers that replace column-wise, results/folder.py)."""
    return tuple(sorted(_SENT, key=len, reverse=True))


class ScrubbedStream:
    """A text stream (stderr) whose writes are scrubbed (scrub) before they reach the one it wraps. A
    secret split over two writes is not seen; print() writes its text in one."""

    def __init__(self, inner: TextIO):
        self._inner = inner

    def write(self, text: str) -> int:
        self._inner.write(scrub(text))
        return len(text)

    def __getattr__(self, name: str):
        return getattr(self._inner, name)


def redact_text(text: str) -> str:
    """text (a server's error body, an exception's message) with every secret this process sends (scrub)
    and anything else credential-like replaced by ***."""
    text = scrub(text)
    for i, pattern in enumerate(_SECRET_IN_TEXT):
        if i == 3:   # keep the name and its separator, redact the value
            text = pattern.sub(lambda m: m.group(1) + REDACTED, text)
        elif i == 0:
            text = pattern.sub(lambda m: m.group(1) + " " + REDACTED, text)
        else:
            text = pattern.sub(REDACTED, text)
    return text


def clipped(text: str | bytes, n: int) -> str:
    """A server's text (bytes decoded, undecodable bytes replaced) scrubbed (redact_text), then cut to n
    characters: cut first, a secret could leave a piece too short to be recognised."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    return redact_text(text)[:n]
