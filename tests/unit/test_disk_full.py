"""Issue 25 item 1, with the failure injected: a write of the results folder that fails (ENOSPC, EDQUOT,
EROFS) is one StorageError naming the file and the errno, leaves no temporary file, frees the reserve so
the final manifest fits, and keeps every part written before it, which read_run reads; the completeness
check then says the results could not be written, not that the run was killed. (The real thing, a
nearly full tmpfs under `loadgen run`: tests/integration/test_disk_full.py.)"""
import errno
import os

import orjson
import pytest

from loadgen.analysis import completeness
from loadgen.client.recorder import Recorder
from loadgen.errors import StorageError
from loadgen.results import folder
from loadgen.results.folder import PARTS, RESERVE, RunWriter, read_run, saved_row_count
from tests.unit.test_flush_release import T0, rows_of_a_run


class FailingWrites:
    """os as results/folder.py sees it, except that os.write and os.posix_fallocate fail with `code` on
    files for which `full(path)` holds (asked when the file is opened)."""

    def __init__(self, code: int, full):
        self.code, self.full, self.failing = code, full, set()

    def __getattr__(self, name):
        return getattr(os, name)

    def open(self, path, flags, mode=0o777):
        fd = os.open(path, flags, mode)
        if flags & os.O_WRONLY and self.full(str(path)):
            self.failing.add(fd)
        return fd

    def write(self, fd, data):
        if fd in self.failing:
            raise OSError(self.code, os.strerror(self.code))
        return os.write(fd, data)

    def posix_fallocate(self, fd, offset, length):
        if fd in self.failing:
            raise OSError(self.code, os.strerror(self.code))
        return os.posix_fallocate(fd, offset, length)

    def close(self, fd):
        self.failing.discard(fd)
        return os.close(fd)


def leftovers(path):
    return sorted(p.name for p in path.rglob(".*.tmp"))


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT, errno.EROFS])
def test_a_failed_part_keeps_the_parts_before_it_and_names_the_file(tmp_path, monkeypatch, code):
    rows = rows_of_a_run()
    writer = RunWriter(tmp_path / "run")
    writer.prepare()
    assert (writer.path / PARTS / RESERVE).stat().st_size == folder.RESERVE_BYTES
    writer.manifest({"status": "running"})  # at t0, as a run does
    recorder = Recorder(rows)
    writer.flush(rows[:40], T0)
    recorder.release(rows[:40])

    disk = FailingWrites(code, lambda p: True)
    monkeypatch.setattr(folder, "os", disk)
    with pytest.raises(StorageError) as e:
        writer.flush(rows[40:80], T0)
    assert e.value.errno == code and errno.errorcode[code] in str(e.value)
    assert "requests-00002.parquet" in str(e.value) and str(writer.path) in str(e.value)
    assert writer.failure is e.value
    assert not (writer.path / PARTS / RESERVE).exists()  # freed for the final manifest
    assert leftovers(writer.path) == []
    # the end of the run: nothing more is written, every row is still handed to the checks
    frame = writer.finalize(recorder.unflushed(), T0)
    assert frame["idx"].to_list() == list(range(len(rows)))
    assert not (writer.path / "requests.parquet").exists() and leftovers(writer.path) == []
    monkeypatch.setattr(folder, "os", os)
    assert read_run(writer.path).requests["idx"].to_list() == list(range(40))
    assert saved_row_count(writer.path) == 40


def test_a_merge_that_does_not_fit_leaves_every_row_in_the_parts(tmp_path, monkeypatch):
    rows = rows_of_a_run()
    writer = RunWriter(tmp_path / "run")
    writer.prepare()
    writer.manifest({"status": "running"})
    chunks = sum(len(r.chunk_t_ns) for r in rows)
    recorder = Recorder(rows)
    writer.flush(rows[:40], T0)
    recorder.release(rows[:40])  # their slots in `rows` are emptied
    merged = lambda p: os.path.basename(p) in (".requests.parquet.tmp", ".tokens.parquet.tmp")  # noqa: E731
    monkeypatch.setattr(folder, "os", FailingWrites(errno.ENOSPC, merged))
    frame = writer.finalize(recorder.unflushed(), T0)
    assert writer.failure is not None and writer.failure.path == str(writer.path / "requests.parquet")
    assert not (writer.path / "requests.parquet").exists() and leftovers(writer.path) == []
    monkeypatch.setattr(folder, "os", os)
    saved = read_run(writer.path)
    assert saved.requests.equals(frame) and saved.requests.height == len(frame) == 120  # the last rows as a part first
    assert saved.tokens.height == chunks > 0


def test_the_reserve_makes_room_for_the_final_manifest_and_report_says_why_rows_are_missing(tmp_path,
                                                                                          monkeypatch):
    rows = rows_of_a_run()
    writer = RunWriter(tmp_path / "run")
    writer.prepare()
    writer.manifest({"status": "running", "schedule": {"requests": len(rows)}})
    writer.flush(rows[:50], T0)
    reserve = writer.path / PARTS / RESERVE
    # a disk that is full while the reserve holds its space
    monkeypatch.setattr(folder, "os", FailingWrites(errno.ENOSPC, lambda p: reserve.exists()))
    with pytest.raises(StorageError):
        writer.flush(rows[50:], T0)
    error = writer.failure
    writer.manifest({"status": "write_failed", "schedule": {"requests": len(rows)},
                     "write_error": {"message": str(error), "error": error.errno_name}})
    monkeypatch.setattr(folder, "os", os)
    assert orjson.loads((writer.path / "manifest.json").read_bytes())["status"] == "write_failed"
    info = completeness.lost(read_run(writer.path))
    assert info is not None and (info["planned"], info["found"], info["alive"]) == (len(rows), 50, False)
    why = completeness.reason(info)
    assert "could not be written" in why and "ENOSPC" in why and "killed" not in why


def test_without_the_reserve_a_full_disk_before_the_run_is_one_error(tmp_path, monkeypatch):
    monkeypatch.setattr(folder, "os", FailingWrites(errno.ENOSPC, lambda p: p.endswith(RESERVE)))
    writer = RunWriter(tmp_path / "run")
    with pytest.raises(StorageError, match="ENOSPC"):
        writer.prepare()
    assert not writer.path.exists()  # nothing left behind: the run did not start


class _FullFile:
    """A journal file on a disk that filled after `room` bytes (a real file handle underneath)."""

    def __init__(self, fh, room: int):
        self.fh, self.room = fh, room

    def write(self, data):
        if len(data) > self.room:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.room -= len(data)
        return self.fh.write(data)

    def flush(self):
        self.fh.flush()

    def close(self):
        self.fh.close()


def test_the_simulators_truth_stops_at_a_full_disk_with_one_line_and_keeps_its_rows(tmp_path, capsys):
    from loadgen.sim.truth import TruthWriter, journal_path, read_truth
    from tests.unit.test_sim_truth import row

    path = tmp_path / "truth.parquet"
    w = TruthWriter(path)
    first = row(10, 1, 2, [3], "a")
    w._fh = _FullFile(w._fh, len(orjson.dumps(first)) + 1)  # room for the first row only
    for r in (first, row(20, 1, 2, [3], "b"), row(30, 1, 2, [3], "c")):
        w.add(r)  # never raises: the simulator goes on serving
    w.close()
    err = capsys.readouterr().err
    assert err.count("cannot write") == 1 and str(path) in err and "No space left on device" in err
    # what was written stays readable (the parquet file, as room is left for it here)
    assert [r["request_id"] for r in read_truth(path)] == ["a"] and not journal_path(path).exists()
    assert leftovers(tmp_path) == []
