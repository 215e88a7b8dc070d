"""Short blocking HTTP requests to the target before a run (tokenize probes and counts, server detection).

One kept-alive connection; every request has a TOTAL deadline (connect + send + the whole answer), not
a per-read timeout, so a server that accepts and never answers, or trickles bytes forever, costs at most
`timeout_s`: a timer shuts the socket down at the deadline and the blocked read fails. Never used while
a run is going.
"""
from __future__ import annotations

import http.client
import socket
import threading
from urllib.parse import urlsplit


class ProbeError(Exception):
    """No complete HTTP answer (refused, reset, or past the deadline); the message names the URL.
    `unreachable`: refused or past the deadline (asking again, in another shape, will not help)."""

    def __init__(self, message: str, unreachable: bool):
        super().__init__(message)
        self.unreachable = unreachable


class Probe:
    def __init__(self, base_url: str, timeout_s: float, headers: dict[str, str] | None = None):
        u = urlsplit(base_url.rstrip("/").removesuffix("/v1"))
        self.host, self.port = u.hostname or "127.0.0.1", u.port or (443 if u.scheme == "https" else 80)
        self.https, self.timeout_s = u.scheme == "https", timeout_s
        self.base = f"{u.scheme}://{self.host}:{self.port}"   # never the URL's credentials
        self.headers = dict(headers or {})
        self._conn: http.client.HTTPConnection | None = None

    def request(self, method: str, path: str, body: bytes | None = None) -> tuple[int, dict[str, str], bytes]:
        """(status, headers with lower-case names, body); raises ProbeError."""
        headers = {**self.headers, **({"Content-Type": "application/json"} if body is not None else {})}
        for attempt in (0, 1):  # one reconnect if the kept-alive connection was closed by the server
            if self._conn is None:
                cls = http.client.HTTPSConnection if self.https else http.client.HTTPConnection
                self._conn = cls(self.host, self.port, timeout=self.timeout_s)
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
