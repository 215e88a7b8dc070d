"""Start llama.cpp's llama-server on a free loopback port and stop it by PID (e2e tests, recording script).

The binary and model come from tests/e2e/build_llama_server.sh (env LLAMA_SERVER, LLAMA_MODEL; `make e2e`
sets both). Settings for a 2-core machine: `-t 1` (with -t 2 its threads busy-wait and it runs 3-4x
slower), `-np` slots sharing `-c` context tokens, `--metrics` for /metrics. Its log goes to a file.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

START_TIMEOUT_S = 120.0


def binary_and_model() -> tuple[str, str]:
    server, model = os.environ.get("LLAMA_SERVER"), os.environ.get("LLAMA_MODEL")
    if not (server and model and Path(server).is_file() and Path(model).is_file()):
        raise RuntimeError("LLAMA_SERVER / LLAMA_MODEL do not name a built llama-server and model: run `make e2e` "
                           "(it builds both with tests/e2e/build_llama_server.sh and sets them)")
    return server, model


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LlamaServer:
    def __init__(self, log_path: Path, *, slots: int = 2, ctx: int = 8192, threads: int = 1,
                 extra: tuple[str, ...] = ()):
        self.binary, self.model = binary_and_model()
        self.slots, self.ctx, self.threads, self.extra = slots, ctx, threads, extra
        self.log_path = log_path
        self.port = 0
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> str:
        self.port = free_port()
        cmd = [self.binary, "-m", self.model, "--host", "127.0.0.1", "--port", str(self.port),
               "-t", str(self.threads), "-tb", str(self.threads), "-np", str(self.slots), "-c", str(self.ctx),
               "--metrics", "--alias", "tiny-llama", *self.extra]
        self._log = open(self.log_path, "wb")  # noqa: SIM115 (closed in stop)
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     preexec_fn=_die_with_parent)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"llama-server exited with {self.proc.returncode}: "
                                   f"{self.log_path.read_text(errors='replace')[-2000:]}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        return self.url
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"llama-server did not become healthy within {START_TIMEOUT_S:g} s")

    def stop(self) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self._log.close()
        return self.proc.returncode


def _die_with_parent() -> None:
    # In the child before exec: SIGTERM when the test process dies (even by SIGKILL), so no server is left
    # behind. Linux only (prctl PR_SET_PDEATHSIG = 1); elsewhere the fixture's stop() is the only stop.
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)
    except (OSError, AttributeError):
        pass
