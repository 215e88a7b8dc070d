"""Small misbehaving servers for the hardening tests, on 127.0.0.1 port 0, each in a daemon thread and
closed by the test: `Silent` accepts and reads but never answers; it records every request head.
`BasicAuthServer` answers only the right credentials; `EchoServer` echoes the credentials in its errors."""
from __future__ import annotations

import base64
import json
import socket
import threading


class Silent:
    def __init__(self):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.heads: list[bytes] = []
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self._conns.append(conn)
            threading.Thread(target=self._read, args=(conn,), daemon=True).start()

    def _read(self, conn: socket.socket) -> None:
        buf = b""
        while True:
            try:
                data = conn.recv(65536)
            except OSError:
                return
            if not data:
                return
            buf += data
            while b"\r\n\r\n" in buf:
                head, buf = buf.split(b"\r\n\r\n", 1)
                with self._lock:
                    self.heads.append(head)
                length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)
                while len(buf) < length:
                    more = conn.recv(65536)
                    if not more:
                        return
                    buf += more
                buf = buf[length:]

    def heads_with(self, needle: bytes) -> int:
        with self._lock:
            return sum(needle in h for h in self.heads)

    def close(self) -> None:
        self.sock.close()
        for c in self._conns:
            c.close()

    def __enter__(self) -> Silent:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class BasicAuthServer(Silent):
    """Answers like a tiny OpenAI server (a 3-token completion stream, /metrics, /v1/models) only to
    requests whose Authorization header is `expected`; 401 otherwise. Records every request head."""

    STREAM = (b'data: {"choices":[{"index":0,"text":"a ","finish_reason":null}]}\n\n'
              b'data: {"choices":[{"index":0,"text":"b ","finish_reason":null}]}\n\n'
              b'data: {"choices":[{"index":0,"text":"c","finish_reason":"length"}]}\n\n'
              b'data: {"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":3}}\n\ndata: [DONE]\n\n')
    METRICS = b"# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 0\n"

    def __init__(self, expected: str):
        self.expected = expected.encode()
        self.unauthorized: list[bytes] = []  # request lines answered 401
        super().__init__()

    def _read(self, conn: socket.socket) -> None:
        buf = b""
        while True:
            while b"\r\n\r\n" not in buf:
                try:
                    data = conn.recv(65536)
                except OSError:
                    return
                if not data:
                    return
                buf += data
            head, buf = buf.split(b"\r\n\r\n", 1)
            lines = head.split(b"\r\n")
            fields = {k.strip().lower(): v.strip() for k, _, v in (x.partition(b":") for x in lines[1:])}
            length = int(fields.get(b"content-length", b"0"))
            while len(buf) < length:
                more = conn.recv(65536)
                if not more:
                    return
                buf += more
            buf = buf[length:]
            with self._lock:
                self.heads.append(head)
            path = lines[0].split(b" ")[1]
            if fields.get(b"authorization") != self.expected:
                self.unauthorized.append(lines[0])
                status, ctype, body = b"401 Unauthorized", b"text/plain", b"unauthorized"
            elif path.endswith(b"/metrics"):
                status, ctype, body = b"200 OK", b"text/plain", self.METRICS
            elif path.endswith(b"/v1/models"):
                status, ctype, body = b"200 OK", b"application/json", b'{"data":[{"id":"m"}]}'
            elif lines[0].startswith(b"POST") and b"completions" in path:
                status, ctype, body = b"200 OK", b"text/event-stream", self.STREAM
            else:
                status, ctype, body = b"404 Not Found", b"text/plain", b"no"
            try:
                conn.sendall(b"HTTP/1.1 " + status + b"\r\nContent-Type: " + ctype +
                             b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
            except OSError:
                return


class EchoServer(Silent):
    """A server that echoes what it was sent, as careless servers do in their errors: /v1/models lists
    model `sim`; completions get HTTP 401 whose body quotes the credentials (the Bearer token after
    "Incorrect API key provided:", a Basic token decoded into user and password, every header of the
    request as JSON) or, every other request, the raw request head as text; /metrics answers the head as
    text (not Prometheus) and `X-Echo` response headers carry the Authorization value. `bodies` keeps
    every error body it sent (the test's premise: the secrets went out)."""

    def __init__(self):
        self.bodies: list[bytes] = []
        super().__init__()

    def _answer(self, head: bytes) -> tuple[bytes, bytes, bytes]:
        lines = head.split(b"\r\n")
        fields = {k.strip().decode("latin-1"): v.strip().decode("latin-1")
                  for k, _, v in (x.partition(b":") for x in lines[1:])}
        path = lines[0].split(b" ")[1]
        if path.endswith(b"/v1/models"):
            return b"200 OK", b"application/json", b'{"data":[{"id":"sim"}]}'
        if path.endswith(b"/metrics"):
            return b"200 OK", b"text/plain", b"echo of what you sent:\n" + head
        if not (lines[0].startswith(b"POST") and b"completions" in path):
            return b"404 Not Found", b"text/plain", b"no"
        auth = fields.get("Authorization", "")
        scheme, _, token = auth.partition(" ")
        if len(self.bodies) % 2:
            body = b"request refused; you sent:\n" + head
        elif scheme == "Basic":
            user, _, password = base64.b64decode(token).decode().partition(":")
            body = json.dumps({"error": f"user {user} with password {password} is not allowed",
                               "headers": fields}).encode()
        else:
            body = json.dumps({"error": {"message": f"Incorrect API key provided: {token}.",
                                         "headers": fields}}).encode()
        with self._lock:
            self.bodies.append(body)
        return b"401 Unauthorized", b"application/json", body

    def _read(self, conn: socket.socket) -> None:
        buf = b""
        while True:
            while b"\r\n\r\n" not in buf:
                try:
                    data = conn.recv(65536)
                except OSError:
                    return
                if not data:
                    return
                buf += data
            head, buf = buf.split(b"\r\n\r\n", 1)
            length = next((int(x.split(b":")[1]) for x in head.split(b"\r\n")
                           if x.lower().startswith(b"content-length:")), 0)
            while len(buf) < length:
                more = conn.recv(65536)
                if not more:
                    return
                buf += more
            buf = buf[length:]
            with self._lock:
                self.heads.append(head)
            status, ctype, body = self._answer(head)
            echo = next((x.split(b":", 1)[1].strip() for x in head.split(b"\r\n")
                         if x.lower().startswith(b"authorization:")), b"")
            try:
                conn.sendall(b"HTTP/1.1 " + status + b"\r\nContent-Type: " + ctype + b"\r\nX-Echo: " + echo +
                             b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
            except OSError:
                return
