"""Storage faults in a SegmentLog (issue 10, finding 2): ENOSPC and EIO at chosen points.

The log is opened with :class:`FaultyFiles` (``storage_faults.py``), which fails the chosen
file operations for real. What must hold: the failed call raises WriteFailed (``full`` for
ENOSPC), nothing of it counts as stored, everything stored before is still there and
readable, and once the fault is gone (space freed) appending works again, at the right offsets,
with deduplication intact.
"""

from __future__ import annotations

import errno
import os
import pathlib

import pytest

from rsnet.broker.storage import FsyncPolicy, LogFailed, Retention, SegmentLog, StorageError, WriteFailed

from .storage_faults import FaultyFiles


def open_log(
    directory: pathlib.Path, faults: FaultyFiles, fsync: FsyncPolicy = FsyncPolicy.ALWAYS, segment_bytes: int = 1 << 20
) -> SegmentLog:
    return SegmentLog.open(directory, Retention(), fsync, segment_bytes, file_ops=faults)[0]


def values(directory: pathlib.Path) -> list[object]:
    log, report = SegmentLog.open(directory)
    with log:
        assert report.clean, report.damaged
        return [record.value for record in log.read(log.first_offset, 10**6)]


@pytest.mark.parametrize("partial", [False, True], ids=["nothing written", "half written"])
def test_a_write_refused_for_lack_of_space_stores_nothing_and_the_log_goes_on_once_space_is_back(
    tmp_path: pathlib.Path, partial: bool
) -> None:
    faults = FaultyFiles()
    log = open_log(tmp_path, faults)
    log.append(["a"], timestamp_ms=0, producer="p", first_sequence=0)
    size = log.size_bytes
    faults.fail("write_all", errno.ENOSPC, partial=partial)
    with pytest.raises(WriteFailed, match="No space left on device") as raised:
        log.append(["b", "c"], timestamp_ms=0, producer="p", first_sequence=1)
    assert raised.value.full and raised.value.errno == errno.ENOSPC
    assert (log.next_offset, log.durable_offset, log.last_sequence("p"), log.size_bytes) == (1, 1, 0, size)
    assert [r.value for r in log.read(0, 10)] == ["a"]  # readers are still served
    with pytest.raises(WriteFailed):  # and again, while the disk stays full
        log.append(["b"], timestamp_ms=0, producer="p", first_sequence=1)
    faults.heal()
    assert log.append(["b", "c"], timestamp_ms=0, producer="p", first_sequence=1) == [1, 2]
    log.close()
    assert values(tmp_path) == ["a", "b", "c"]


def test_a_failed_fsync_rolls_the_log_back_to_what_was_durable_and_it_goes_on(tmp_path: pathlib.Path) -> None:
    faults = FaultyFiles()
    log = open_log(tmp_path, faults)
    log.append(["a"], timestamp_ms=1, producer="p", first_sequence=0)
    faults.fail("datasync", errno.EIO, times=1)
    with pytest.raises(WriteFailed, match="Input/output error") as raised:
        log.append(["b", "c"], timestamp_ms=2, producer="p", first_sequence=1)
    assert not raised.value.full
    # "b" and "c" were written but never durable, so never acknowledged: cut off, and forgotten
    assert (log.next_offset, log.durable_offset, log.last_sequence("p")) == (1, 1, 0)
    assert log.offset_for_timestamp(2) == 1
    assert log.append(["b", "c"], timestamp_ms=2, producer="p", first_sequence=1) == [1, 2]  # not duplicates
    log.close()
    assert values(tmp_path) == ["a", "b", "c"]


def test_under_interval_a_failed_sync_cuts_everything_written_since_the_last_sync(tmp_path: pathlib.Path) -> None:
    faults = FaultyFiles()
    log = open_log(tmp_path, faults, FsyncPolicy.INTERVAL)
    log.append(["a"], timestamp_ms=0, producer="p", first_sequence=0)
    log.sync()
    log.append(["b"], timestamp_ms=0, producer="p", first_sequence=1)
    log.append(["c"], timestamp_ms=0, producer="q", first_sequence=0)
    faults.fail("datasync", errno.EIO, times=1)
    with pytest.raises(WriteFailed):
        log.sync()
    assert (log.next_offset, log.durable_offset, log.last_sequence("p"), log.last_sequence("q")) == (1, 1, 0, None)
    log.append(["b"], timestamp_ms=0, producer="p", first_sequence=1)
    log.sync()
    log.close()
    assert values(tmp_path) == ["a", "b"]


@pytest.mark.parametrize("removal", ["purge", "retention"])
def test_a_failed_fsync_after_older_segments_were_removed_rolls_back_all_the_same(
    tmp_path: pathlib.Path, removal: str
) -> None:
    # The sync point is the active segment's: older segments a purge or retention removed
    # since do not count (their count and bytes in it made the rollback fail an assertion,
    # and the topic with it).
    faults = FaultyFiles()
    log = open_log(tmp_path, faults, FsyncPolicy.INTERVAL, segment_bytes=200)
    log.append(list(range(30)), timestamp_ms=0, producer="p", first_sequence=0)
    in_flight = log.begin_sync()  # covers them; the purge or retention comes before it ends
    assert in_flight is not None
    if removal == "purge":
        log.drop_all()
    else:
        log.retention = Retention(max_records=5)
        log.enforce_retention(now_ms=0)
    in_flight.run()
    log.finish_sync(in_flight, None)
    first, size = log.first_offset, log.size_bytes
    log.append(["x"], timestamp_ms=0, producer="p", first_sequence=30)
    faults.fail("datasync", errno.EIO, times=1)
    with pytest.raises(WriteFailed, match="Input/output error"):
        log.sync()
    assert (log.first_offset, log.next_offset, log.size_bytes, log.last_sequence("p")) == (first, 30, size, 29)
    assert log.append(["x"], timestamp_ms=0, producer="p", first_sequence=30) == [30]
    log.sync()
    counted = log.size_bytes
    log.close()
    assert values(tmp_path)[-1] == "x"
    assert sum(path.stat().st_size for path in tmp_path.glob("*.log")) == counted  # what the files hold


def test_a_fault_while_rolling_to_a_new_segment_stores_nothing_and_the_next_roll_works(
    tmp_path: pathlib.Path,
) -> None:
    faults = FaultyFiles()
    log = open_log(tmp_path, faults, segment_bytes=200)
    for n in range(5):
        log.append([f"{n:030d}"], timestamp_ms=0)
    segments = sorted(name for name in os.listdir(tmp_path) if name.endswith(".log"))
    faults.fail("write_all", errno.ENOSPC, suffix=".log.tmp", times=1)  # the next segment's header
    with pytest.raises(WriteFailed):
        for _ in range(100):
            log.append(["x" * 30], timestamp_ms=0)
    assert faults.failed == [("write_all", errno.ENOSPC)]
    before = log.next_offset
    assert not [name for name in os.listdir(tmp_path) if name.endswith(".tmp")]
    assert log.append(["y" * 30], timestamp_ms=0) == [before]
    log.close()
    assert values(tmp_path)[-1] == "y" * 30 and len(segments) >= 1


def test_when_even_the_rollback_fails_the_log_refuses_writes_until_repaired_and_serves_reads(
    tmp_path: pathlib.Path,
) -> None:
    faults = FaultyFiles()
    log = open_log(tmp_path, faults)
    log.append(["a"], timestamp_ms=0, producer="p", first_sequence=0)
    faults.fail("datasync", errno.EIO)
    with pytest.raises(WriteFailed):
        log.append(["b"], timestamp_ms=0, producer="p", first_sequence=1)
    assert (log.next_offset, log.durable_offset, log.last_sequence("p")) == (1, 1, 0)  # what is durable
    faults.heal()
    with pytest.raises(LogFailed, match="reopen"):
        log.append(["c"], timestamp_ms=0)
    assert [r.value for r in log.read(0, 1)] == ["a"]
    faults.fail("datasync", errno.EIO)
    with pytest.raises(StorageError, match="cannot be repaired yet"):
        log.repair()
    assert [r.value for r in log.read(0, 1)] == ["a"]  # still served
    faults.heal()
    log.repair()  # scans the files as an open would ("b" was cut off before the failed fsync)
    assert log.append(["b"], timestamp_ms=0, producer="p", first_sequence=1) == [1]
    assert [r.value for r in log.read(0, 10)] == ["a", "b"]
    log.close()
    assert values(tmp_path) == ["a", "b"]


def test_a_directory_that_cannot_be_written_is_refused_at_open_with_the_reason(tmp_path: pathlib.Path) -> None:
    faults = FaultyFiles()
    faults.fail("makedirs", errno.EROFS)
    with pytest.raises(StorageError, match=r"the log cannot be opened: \[Errno 30\] Read-only file system"):
        SegmentLog.open(tmp_path / "topic", file_ops=faults)


@pytest.mark.parametrize(
    ("call", "left_at"),
    [("replace", 0), ("open", 9)],
    ids=["no new segment", "new segment not opened"],
)
def test_an_advance_that_cannot_write_its_new_segment_leaves_an_empty_log_with_no_gap(
    tmp_path: pathlib.Path, call: str, left_at: int
) -> None:
    # A topic created again after a delete starts at the deleted one's next offset (advance).
    # If the new segment cannot be written (or opened), the log refuses writes; repair() (or
    # a restart) finds it empty, at 0 (for the broker to advance again) or at its new start,
    # never with offsets reported lost.
    faults = FaultyFiles()
    log = open_log(tmp_path, faults)
    faults.fail(call, errno.ENOSPC, suffix=".log")
    with pytest.raises(WriteFailed, match="could not start at offset 9") as raised:
        log.advance(9)
    assert raised.value.full
    with pytest.raises(LogFailed):
        log.append(["a"], timestamp_ms=0)
    faults.heal()
    log.repair()
    assert (log.first_offset, log.next_offset, log.damaged_ranges) == (left_at, left_at, [])
    if left_at < 9:
        log.advance(9)
    log.append(["a"], timestamp_ms=0)
    log.close()
    assert values(tmp_path) == ["a"]
    reopened = open_log(tmp_path, faults)
    with reopened:
        assert (reopened.first_offset, reopened.next_offset) == (9, 10)
        with pytest.raises(ValueError, match="only an empty log moves forward"):
            reopened.advance(20)


def test_an_advance_whose_new_start_cannot_be_stored_changes_nothing(tmp_path: pathlib.Path) -> None:
    faults = FaultyFiles()
    log = open_log(tmp_path, faults)
    faults.fail("write_all", errno.ENOSPC, suffix="synced")
    with pytest.raises(WriteFailed, match="new start cannot be stored"):
        log.advance(9)
    faults.heal()
    log.append(["a"], timestamp_ms=0)  # not failed: nothing had changed
    assert log.read(0, 1)[0].value == "a"
    log.close()


def test_a_purge_writes_nothing_it_deletes_right_after(tmp_path: pathlib.Path) -> None:
    """An outside check: purging a topic of one segment on a nearly full disk wrote the active
    segment's sidecar (16 KiB for it) before rolling it, only to delete both: the new segment
    then found no room, and the purge freed nothing. Only the new segment is written now."""

    written: list[str] = []

    class Recording(FaultyFiles):
        def write_all(self, fd: int, data: bytes) -> None:
            written.append(str(self._path(fd)))
            super().write_all(fd, data)

    files = Recording()
    log = open_log(tmp_path, files)
    log.append([{"n": n, "pad": "x" * 100} for n in range(2000)], timestamp_ms=0)
    assert len(log._segments) == 1
    written.clear()
    assert log.drop_all() == 2000
    assert not [path for path in written if ".idx" in path], written
    assert (log.first_offset, log.next_offset) == (2000, 2000)
    log.close()


def test_a_purge_on_a_full_disk_frees_the_sealed_segments_before_it_writes_a_new_one(tmp_path: pathlib.Path) -> None:
    # A purge rolled the active segment first, a write a full disk refuses: it freed nothing,
    # and neither could a delete (its offsets' file is written first): only retention could.
    faults = FaultyFiles()
    log = open_log(tmp_path, faults, segment_bytes=200)
    log.append([f"r{n}" for n in range(30)], timestamp_ms=0)
    sealed = len(log._segments) - 1
    assert sealed >= 2
    faults.fail("write_all", errno.ENOSPC)
    with pytest.raises(WriteFailed) as full:
        log.drop_all()
    assert full.value.full
    assert len(list(tmp_path.glob("*.log"))) == 1  # the sealed ones went: their space is back
    first = log.first_offset
    assert first > 0 and [r.value for r in log.read(first, 30)] == [f"r{n}" for n in range(first, 30)]
    faults.heal()
    assert log.drop_all() == 30 - first
    assert (log.first_offset, log.next_offset) == (30, 30)
    log.close()
    assert values(tmp_path) == []
