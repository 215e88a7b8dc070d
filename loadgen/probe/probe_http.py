"""Short blocking HTTP requests to the target before a run (tokenize probes and counts, server detection).

One kept-alive connection; every request has a TOTAL deadline (connect + send + the whole answer), not
a per-read timeout, so a server that accepts and never answers, or trickles bytes forever, costs at most
`timeout_s`: a timer shuts the socket down at the deadline and the blocked read fails. Never used while
a run is going.

TLS: every probe takes the run's TLS choice in aiohttp's form (`tls`: config/client.py
ClientOptions.ssl_context(): True verifies against the system's CAs, a context against --ca-bundle,
False does not verify with --insecure) and turns it into the one context http.client needs
(`tls_context`), so the kind probe, the model list, /tokenize and the run's own transport and scrape
verify the server the same way. A certificate that does not verify is an input error (ConfigError,
exit 2) naming the URL, the reason and the two flags: no probe, and no run, can succeed without it.
"""
from __future__ import annotations

import http.client
import socket
import ssl
import threading
from urllib.parse import urlsplit

from loadgen.errors import ConfigError


class ProbeError(Exception):
    """No complete HTTP answer (refused, reset, or past the deadline); the message names the URL.
    `unreachable`: refused or past the deadline (asking again, in another shape, will not help)."""

    def __init__(self, message: str, unreachable: bool):
        super().__init__(message)
        self.unreachable = unreachable


def tls_context(tls: ssl.SSLContext | bool = True) -> ssl.SSLContext:
    """aiohttp's `ssl=` value (ClientOptions.ssl_context) as an SSLContext for http.client: the same choice."""
    if isinstance(tls, ssl.SSLContext):
        return tls
    context = ssl.create_default_context()
    if tls is False:
        context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    return context


def untrusted(base: str, error: ssl.SSLCertVerificationError, tls: ssl.SSLContext | bool) -> ConfigError:
    """The input error for a server certificate that does not verify (the flags that decide it named)."""
    why = error.verify_message or error.reason or str(error)
    against = "the --ca-bundle given" if isinstance(tls, ssl.SSLContext) else "the system's CA certificates"
    return ConfigError([f"--url {base}: the server's TLS certificate does not verify against {against} "
                        f"({why}): pass --ca-bundle FILE with the CA that signed it, or --insecure to "
                        f"skip verification"])


class Probe:
    def __init__(self, base_url: str, timeout_s: float, headers: dict[str, str] | None = None,
                 tls: ssl.SSLContext | bool = True):
        u = urlsplit(base_url.rstrip("/").removesuffix("/v1"))
        self.host, self.port = u.hostname or "127.0.0.1", u.port or (443 if u.scheme == "https" else 80)
        self.https, self.timeout_s = u.scheme == "https", timeout_s
        self.base = f"{u.scheme}://{self.host}:{self.port}"   # never the URL's credentials
        self.headers = dict(headers or {})
        self.tls = tls
        self._context = tls_context(tls) if self.https else None
        self._conn: http.client.HTTPConnection | None = None

    def request(self, method: str, path: str, body: bytes | None = None) -> tuple[int, dict[str, str], bytes]:
        """(status, headers with lower-case names, body); raises ProbeError, or ConfigError when the
        server's certificate does not verify."""
        headers = {**self.headers, **({"Content-Type": "application/json"} if body is not None else {})}
        for attempt in (0, 1):  # one reconnect if the kept-alive connection was closed by the server
            if self._conn is None:
                self._conn = (http.client.HTTPSConnection(self.host, self.port, timeout=self.timeout_s,
                                                          context=self._context) if self.https else
                              http.client.HTTPConnection(self.host, self.port, timeout=self.timeout_s))
            conn, expired = self._conn, threading.Event()

            timer = threading.Timer(self.timeout_s, _abort, (conn, expired))
            timer.daemon = True
            timer.start()
            try:
                conn.request(method, path, body, headers)
                r = conn.getresponse()
                data = r.read()
                if expired.is_set():
                    raise OSError("deadline")
                return r.status, {k.lower(): v for k, v in r.getheaders()}, data
            except ssl.SSLCertVerificationError as e:
                self.close()
                raise untrusted(self.base, e, self.tls) from None
            except (OSError, http.client.HTTPException) as e:
                self.close()
                if expired.is_set():
                    raise ProbeError(f"{method} {self.base}{path}: no complete answer within "
                                     f"{self.timeout_s:g} s", True) from None
                if attempt or isinstance(e, ConnectionRefusedError):
                    raise ProbeError(f"{method} {self.base}{path}: {type(e).__name__}: {e}",
                                     isinstance(e, ConnectionRefusedError)) from None
            finally:
                timer.cancel()
        raise AssertionError("unreachable")

    def get(self, path: str) -> tuple[int, dict[str, str], bytes]:
        return self.request("GET", path)

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def _abort(conn: http.client.HTTPConnection, expired: threading.Event) -> None:
    # The deadline: the blocked connect/send/read in the caller's thread fails at once.
    expired.set()
    if conn.sock is not None:
        try:
            conn.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
