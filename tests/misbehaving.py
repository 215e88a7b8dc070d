"""Small misbehaving servers for the hardening tests, on 127.0.0.1 port 0, each in a daemon thread and
closed by the test: `Silent` accepts and reads but never answers; it records every request head."""
from __future__ import annotations

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
