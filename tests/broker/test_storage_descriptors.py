"""Logs sharing a descriptor budget (``storage/descriptors.py``): at most ``max_logs`` hold file
descriptors at once; a log that gave its up takes them again, lock first, when it is read,
written, synced or changed, and loses nothing meanwhile.

Real segment files in tmp dirs; faults through :class:`FaultyFiles`.
"""

from __future__ import annotations

import errno
import pathlib
import threading

import pytest

from rsnet.broker.storage import FsyncPolicy, Retention, SegmentLog, StorageError, WriteFailed
from rsnet.broker.storage.descriptors import DescriptorBudget

from .storage_faults import FaultyFiles, GatedFiles, open_descriptors, stored_values


def open_logs(
    tmp_path: pathlib.Path,
    count: int,
    budget: DescriptorBudget,
    files: FaultyFiles | None = None,
    **settings: object,
) -> list[SegmentLog]:
    logs = []
    for index in range(count):
        log, report = SegmentLog.open(
            tmp_path / f"t{index}", descriptors=budget, file_ops=files or FaultyFiles(), **settings
        )
        assert report.clean
        logs.append(log)
    return logs


def holding(tmp_path: pathlib.Path, count: int) -> list[int]:
    """Which of the logs t0..t{count-1} hold a descriptor now."""
    return [index for index in range(count) if open_descriptors(tmp_path / f"t{index}")]


def test_at_most_max_logs_hold_descriptors_and_every_log_goes_on(tmp_path: pathlib.Path) -> None:
    budget = DescriptorBudget(2)
    logs = open_logs(tmp_path, 5, budget, segment_bytes=300)
    assert holding(tmp_path, 5) == [3, 4]  # the two opened last
    for round_ in range(4):  # appends that roll segments, and reads, across all five in turn
        for index, log in enumerate(logs):
            log.append(
                [f"{index}-{round_}-{n}" for n in range(5)],
                timestamp_ms=round_,
                producer="p",
                first_sequence=5 * round_,
            )
            assert len(holding(tmp_path, 5)) <= 2
    for index, log in enumerate(logs):
        values = [record.value for record in log.read(0, 100)]
        assert values == [f"{index}-{r}-{n}" for r in range(4) for n in range(5)]
        assert log.last_sequence("p") == 19
        assert len(holding(tmp_path, 5)) <= 2
    assert budget.suspensions >= 20 and len(budget) == 2
    for log in logs:
        log.close()
    assert holding(tmp_path, 5) == [] and len(budget) == 0
    for index in range(5):
        assert len(stored_values(tmp_path / f"t{index}")) == 20


def test_a_log_holds_three_descriptors_at_most_whatever_its_readers_read(tmp_path: pathlib.Path) -> None:
    """Its lock, its active segment and the sealed segment last read: 8 sealed ones were kept,
    so max_open_topics logs could hold 10/8 of the descriptor limit."""
    (log,) = open_logs(tmp_path, 1, DescriptorBudget(4), segment_bytes=300)
    log.append([f"r{n}" for n in range(200)], timestamp_ms=0)
    assert len([p for p in (tmp_path / "t0").iterdir() if p.suffix == ".log"]) > 10
    for offset in [0, 150, 30, 120, 60, 90, 10, 199] * 2:  # readers far apart, in turn
        assert [r.value for r in log.read(offset, 3)] == [f"r{n}" for n in range(offset, min(offset + 3, 200))]
        assert len(open_descriptors(tmp_path / "t0")) <= 3
    log.close()


def test_a_log_that_gave_its_descriptors_up_holds_no_lock_and_takes_it_again(tmp_path: pathlib.Path) -> None:
    budget = DescriptorBudget(1)
    first, second = open_logs(tmp_path, 2, budget)
    assert open_descriptors(tmp_path / "t0") == []  # its lock too: the broker's data_dir lock guards it
    with pytest.raises(StorageError, match="already open"):  # the log in use keeps its lock
        SegmentLog.open(tmp_path / "t1")
    intruder, _ = SegmentLog.open(tmp_path / "t0")  # (what the broker's data_dir lock prevents)
    with pytest.raises(StorageError, match="already open"):
        first.append(["x"], timestamp_ms=0)
    assert first.next_offset == 0  # nothing changed
    intruder.close()
    assert first.append(["x"], timestamp_ms=0) == [0]  # takes its lock again
    first.close()
    second.close()


@pytest.mark.parametrize("fsync", [FsyncPolicy.ALWAYS, FsyncPolicy.INTERVAL])
def test_a_sync_in_flight_when_its_log_gives_its_descriptors_up_finishes(
    tmp_path: pathlib.Path, fsync: FsyncPolicy
) -> None:
    """The sync's thread has descriptors of its own: the log giving up its own meanwhile
    neither closes them under it nor loses what it makes durable."""
    files = GatedFiles()
    budget = DescriptorBudget(1)
    log, other = open_logs(tmp_path, 2, budget, files, fsync=fsync)
    log.append(["a", "b"], timestamp_ms=0, sync=False)
    pending = log.begin_sync()
    assert pending is not None
    files.hold(tmp_path / "t0")
    thread = threading.Thread(target=pending.run)
    thread.start()
    assert files.entered.wait(10)
    other.append(["c"], timestamp_ms=0)  # t0 gives its descriptors up, its fsync still running
    assert [pathlib.Path(p).name for p in open_descriptors(tmp_path / "t0")] == ["00000000000000000000.log"]
    files.release()
    thread.join()
    log.finish_sync(pending, pending.failure)
    assert log.durable_offset == 2
    log.close()
    other.close()
    assert stored_values(tmp_path / "t0") == ["a", "b"]


def test_a_failed_fsync_rolls_back_a_log_that_gave_its_descriptors_up(tmp_path: pathlib.Path) -> None:
    files = FaultyFiles()
    budget = DescriptorBudget(1)
    log, other = open_logs(tmp_path, 2, budget, files)
    log.append(["a"], timestamp_ms=0, producer="p", first_sequence=0)  # synced: acknowledged
    log.append(["b"], timestamp_ms=0, producer="p", first_sequence=1, sync=False)
    pending = log.begin_sync()
    assert pending is not None
    files.fail("datasync", errno.EIO, under=tmp_path / "t0", times=1)
    with pytest.raises(OSError) as failed:
        pending.run()
    other.append(["c"], timestamp_ms=0)  # t0 gives its descriptors up
    with pytest.raises(WriteFailed, match="Input/output error"):
        log.finish_sync(pending, failed.value)  # takes them again to cut "b" off
    assert (log.next_offset, log.durable_offset, log.last_sequence("p")) == (1, 1, 0)
    assert log.append(["b2"], timestamp_ms=0, producer="p", first_sequence=1) == [1]
    log.close()
    other.close()
    assert stored_values(tmp_path / "t0") == ["a", "b2"]


def test_retention_advance_and_repair_work_on_a_log_that_gave_its_descriptors_up(tmp_path: pathlib.Path) -> None:
    files = FaultyFiles()
    budget = DescriptorBudget(1)
    log, other = open_logs(tmp_path, 2, budget, files, segment_bytes=200, retention=Retention(max_records=10))
    log.append([f"r{n}" for n in range(30)], timestamp_ms=0)
    other.append(["x"], timestamp_ms=0)
    assert log.enforce_retention(0) > 0 and log.first_offset > 0  # segments deleted
    assert [r.value for r in log.read(log.first_offset, 1)] == [f"r{log.first_offset}"]
    other.append(["x"], timestamp_ms=0)
    log.drop_all()
    other.append(["x"], timestamp_ms=0)
    log.advance(100)
    assert (log.first_offset, log.next_offset) == (100, 100)
    other.append(["x"], timestamp_ms=0)
    files.fail("write_all", errno.EIO, under=tmp_path / "t0", times=1)
    files.fail("truncate", errno.EIO, under=tmp_path / "t0", times=1)  # the write cannot be cut off
    with pytest.raises(WriteFailed):
        log.append(["lost"], timestamp_ms=0)
    other.append(["x"], timestamp_ms=0)
    log.repair()  # the lock taken again, the files scanned again
    assert log.append(["y"], timestamp_ms=0) == [100]
    log.close()
    other.close()
    assert stored_values(tmp_path / "t0") == ["y"]


def test_a_log_whose_active_segment_is_gone_while_it_held_no_descriptor_says_so(tmp_path: pathlib.Path) -> None:
    budget = DescriptorBudget(1)
    log, other = open_logs(tmp_path, 2, budget)
    log.append(["a"], timestamp_ms=0)
    other.append(["x"], timestamp_ms=0)
    (segment,) = [p for p in (tmp_path / "t0").iterdir() if p.suffix == ".log"]
    segment.unlink()  # by hand, under the broker's feet
    with pytest.raises(WriteFailed, match="No such file"):
        log.append(["b"], timestamp_ms=0)
    with pytest.raises(FileNotFoundError):
        log.read(0, 1)
    assert open_descriptors(tmp_path / "t0") == []  # nothing half taken
    log.close()
    other.close()


def test_a_budget_needs_room_for_one_log() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        DescriptorBudget(0)
