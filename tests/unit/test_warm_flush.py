"""Issue 29's early stall: the flush thread's first tick imported modules and built Polars' and the Parquet
writer's state (~150 ms of CPU, ~70 ms of loop lateness ~1 s after t0). `warm_flush_path()` runs that
work before t0: afterwards a tick of the run (histograms and a parquet part of a run's every kind of row)
imports nothing. In a fresh interpreter each, since an import happens only once per process."""
import subprocess
import sys

import pytest

TICK = """
import sys, tempfile
from loadgen.client.recorder import Recorder
from loadgen.results.folder import RunWriter
from loadgen.run import inprocess
from loadgen.run.intervals import INTERVAL_NS, LiveHistograms
from tests.unit.test_flush_release import T0, rows_of_a_run
rows = rows_of_a_run(60)
writer = RunWriter(tempfile.mkdtemp() + "/run")
writer.prepare()
recorder = Recorder(rows)
for r in rows:
    recorder.finish(r)
hists = LiveHistograms(writer.path, T0, 1_700_000_000.0)
if {warm}:
    inprocess.warm_flush_path()
before = set(sys.modules)
finished = recorder.take_finished()
inprocess.tick_work(writer, recorder, hists, list(finished), INTERVAL_NS, finished, T0)
assert writer.failure is None and recorder.rows == [None] * 60   # the part was written
print(sorted(set(sys.modules) - before))
"""


def new_modules(warm: bool) -> list[str]:
    out = subprocess.run([sys.executable, "-c", TICK.format(warm=warm)], capture_output=True, text=True,
                         timeout=120, check=True)
    return eval(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("warm", [False, True])
def test_a_tick_after_the_warm_up_imports_nothing(warm):
    imported = new_modules(warm)
    if warm:
        assert imported == []
    else:   # the premise: without the warm-up the first tick does import (numpy.ma, through Polars)
        assert "numpy.ma" in imported
