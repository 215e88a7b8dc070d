"""E2E fixtures: one llama-server for the session (2 slots, 8192 context tokens = 4096 per slot, -t 1).
vLLM's server is module-scoped, in its test modules (only one vLLM at a time: ~3.5 GiB and a core).

Figures measured by the tests are collected in FIGURES and printed at the end of the session (and
written to $LOADGEN_E2E_FIGURES when set) so that `make e2e` shows them.
"""
from __future__ import annotations

import os

import orjson
import pytest

from tests.e2e.llama_server import LlamaServer

FIGURES: dict[str, object] = {}
SLOTS = 2


@pytest.fixture(scope="session")
def llama(tmp_path_factory):
    srv = LlamaServer(tmp_path_factory.mktemp("llama") / "llama-server.log", slots=SLOTS)
    srv.start()
    yield srv
    srv.stop()


def pytest_terminal_summary(terminalreporter):
    if not FIGURES:
        return
    terminalreporter.section("e2e figures (llama-server, vLLM)")
    for k, v in FIGURES.items():
        terminalreporter.write_line(f"{k}: {v}")
    out = os.environ.get("LOADGEN_E2E_FIGURES")
    if out:
        with open(out, "wb") as f:
            f.write(orjson.dumps(FIGURES, option=orjson.OPT_INDENT_2))
