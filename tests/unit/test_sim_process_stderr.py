"""Issue 15 defect 9: asyncio's shutdown noise from the simulator child ("Task was destroyed but it is
pending!" and its task line) does not reach the user's stderr; everything else does, and is kept for
the start error."""
import io
import threading
from types import SimpleNamespace

from loadgen.sim.process import SimProcess


def test_shutdown_noise_is_dropped_and_the_rest_relayed(capsys):
    sim = SimProcess()
    sim.proc = SimpleNamespace(stderr=io.StringIO(
        "warning: kv cache small\n"
        "Task was destroyed but it is pending!\n"
        "task: <Task pending name='Task-7' coro=<Sim.stream() running at server.py:120>>\n"
        "loadgen sim: error: something real\n"))
    sim._echo, sim._stderr_done = threading.Event(), threading.Event()
    sim._echo.set()
    sim._relay_stderr()
    err = capsys.readouterr().err
    assert err == "warning: kv cache small\nloadgen sim: error: something real\n"
    assert list(sim.stderr_tail) == ["warning: kv cache small", "loadgen sim: error: something real"]
