"""The flush thread's work is paced (run/pacing.py): it pauses between small pieces of its work, so the event
loop it shares the GIL and a core with is never held off for a whole tick. What is written is the same
with and without the pauses. No clock thresholds: the pauses are counted, not timed (the bound itself is
measured by tests/bench/loop_trace.py; figures in docs/scale-out.md)."""
import polars as pl

from loadgen.results import hdr
from loadgen.results.folder import PARTS, REQUEST_SCHEMA, RunWriter
from loadgen.run import inprocess
from loadgen.run.intervals import INTERVAL_NS, LiveHistograms
from loadgen.run.pacing import Pacer
from tests.unit.test_flush_release import T0, finished_run, rows_of_a_run


class Count:
    def __init__(self):
        self.n = 0

    def __call__(self):
        self.n += 1


def test_a_pacer_pauses_once_a_slice_has_run():
    never = Pacer(slice_ns=10**15, pause_s=0)
    always = Pacer(slice_ns=0, pause_s=0)
    for _ in range(50):
        never()
        always()
    assert (never.pauses, always.pauses) == (0, 50)


def test_a_part_is_written_in_paced_pieces_and_is_the_same(tmp_path):
    rows = rows_of_a_run(120)
    paced, plain = RunWriter(tmp_path / "paced"), RunWriter(tmp_path / "plain")
    for w in (paced, plain):
        w.prepare()
    pause = Count()
    paced.flush(rows, T0, pause=pause)
    plain.flush(rows, T0)
    assert pause.n > len(REQUEST_SCHEMA)          # at least one pause point per column of the requests part
    for name in ("requests-00001.parquet", "tokens-00001.parquet"):
        a, b = (pl.read_parquet(w.path / PARTS / name) for w in (paced, plain))
        assert a.equals(b, null_equal=True) and a.height > 0


def test_an_interval_is_recorded_in_paced_pieces_and_is_the_same(tmp_path):
    rows = [r for r in rows_of_a_run(120) if r.outcome is not None]
    logs = {}
    for name, pause in (("paced", Count()), ("plain", None)):
        (tmp_path / name).mkdir()
        live = LiveHistograms(tmp_path / name, T0, 1_700_000_000.0)
        live.record_interval(rows, INTERVAL_NS, *([pause] if pause else []))
        live.close()
        logs[name] = {m: hdr.log_path(tmp_path / name, m).read_bytes() for m in hdr.METRICS}
        if pause:
            assert pause.n >= len(hdr.METRICS)    # a pause point after each metric's histogram at least
    assert logs["paced"] == logs["plain"]


def test_a_tick_frees_its_flushed_rows_a_few_hundred_at_a_time(tmp_path, monkeypatch):
    # freeing thousands of rows in one go is milliseconds of the GIL: the tick releases them in pieces
    writer, recorder, hists = finished_run(tmp_path, 1000)
    finished = recorder.take_finished()
    held = []   # rows still in the flushed list at each pause

    class Watch(Pacer):
        def __call__(self):
            held.append(len(finished))

    monkeypatch.setattr(inprocess, "Pacer", Watch)
    inprocess.tick_work(writer, recorder, hists, list(finished), INTERVAL_NS, finished, T0)
    assert recorder.rows == [None] * 1000 and finished == []
    freed = [a - b for a, b in zip(held, held[1:]) if a != b]
    assert held[0] == 1000 and held[-1] == 0
    assert max(freed) <= inprocess.RELEASE_ROWS and sum(freed) == 1000
