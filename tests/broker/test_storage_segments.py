"""SegmentLog on disk: segment files and rolling, reopening, fsync policies, locking, I/O failures."""

from __future__ import annotations

import os
import pathlib

import pytest

from rsnet.broker.storage import (
    CorruptData,
    FsyncPolicy,
    Retention,
    SegmentLog,
    StorageError,
)
from rsnet.broker.storage import files as storage_files


def open_log(
    directory: pathlib.Path,
    retention: Retention | None = None,
    *,
    fsync: FsyncPolicy = FsyncPolicy.ALWAYS,
    segment_bytes: int = 1024,
) -> SegmentLog:
    log, report = SegmentLog.open(directory, retention or Retention(), fsync, segment_bytes)
    assert report.clean, report.damaged
    return log


def segment_files(directory: pathlib.Path) -> list[str]:
    return sorted(name for name in os.listdir(directory) if name.endswith(".log"))


def append_numbered(log: SegmentLog, count: int, *, size: int = 40, timestamp_ms: int = 0) -> None:
    for _i in range(count):
        n = log.next_offset
        log.append([{"n": n, "pad": "x" * size}], timestamp_ms=timestamp_ms + n, producer="p", first_sequence=n)


def numbers(log: SegmentLog) -> list[int]:
    return [record.value["n"] for record in log.read(log.first_offset, 10**9)]


# -- files and rolling --------------------------------------------------------------------------


def test_segments_are_named_by_their_first_offset_and_rolled_at_segment_bytes(tmp_path: pathlib.Path) -> None:
    log = open_log(tmp_path, segment_bytes=1024)
    append_numbered(log, 100)
    names = segment_files(tmp_path)
    assert len(names) > 5 and names[0] == "00000000000000000000.log"
    bases = [int(name[:-4]) for name in names]
    assert bases == sorted(bases) and len(set(bases)) == len(bases)
    for name in names:
        assert os.path.getsize(tmp_path / name) <= 1024
    assert log.size_bytes == sum(os.path.getsize(tmp_path / name) for name in names)
    for base in bases:  # each segment starts with the record its name says
        assert log.read(base, 1)[0].value["n"] == base
    assert numbers(log) == list(range(100))
    log.close()


def test_a_batch_spans_segments_and_a_record_larger_than_a_segment_gets_its_own(tmp_path: pathlib.Path) -> None:
    log = open_log(tmp_path, segment_bytes=512)
    assert log.append([f"{i:060d}" for i in range(30)], timestamp_ms=0) == list(range(30))
    assert len(segment_files(tmp_path)) >= 4
    log.append(["big" * 1000], timestamp_ms=0)
    log.append(["after"], timestamp_ms=0)
    names = segment_files(tmp_path)
    big = names[-2]
    assert int(big[:-4]) == 30 and os.path.getsize(tmp_path / big) > 3000
    assert names[-1] == "00000000000000000031.log"
    assert [r.value for r in log.read(29, 3)] == [f"{29:060d}", "big" * 1000, "after"]
    log.close()


def test_the_sparse_index_finds_every_offset(tmp_path: pathlib.Path) -> None:
    log = open_log(tmp_path, segment_bytes=1 << 20)
    log.append([f"record {i} " + "y" * (i % 97) for i in range(3000)], timestamp_ms=0)
    assert len(segment_files(tmp_path)) == 1  # ~200 KiB: many index entries in one segment
    for offset in range(0, 3000, 7):
        assert log.read(offset, 2)[0].value.startswith(f"record {offset} ")
    log.close()


def test_files_that_are_not_segments_are_left_alone(tmp_path: pathlib.Path) -> None:
    (tmp_path / "cursors.json").write_bytes(b"cursor store")
    (tmp_path / "cursors.json.tmp").write_bytes(b"its temporary")
    (tmp_path / "notes.txt").write_bytes(b"operator notes")
    log = open_log(tmp_path)
    append_numbered(log, 50)
    log.close()
    log = open_log(tmp_path)
    log.close()
    for name, data in [
        ("cursors.json", b"cursor store"),
        ("cursors.json.tmp", b"its temporary"),
        ("notes.txt", b"operator notes"),
    ]:
        assert (tmp_path / name).read_bytes() == data


# -- reopening ------------------------------------------------------------------------------------


def test_reopening_keeps_every_record_offset_timestamp_and_size(tmp_path: pathlib.Path) -> None:
    log = open_log(tmp_path)
    append_numbered(log, 120, timestamp_ms=5000)
    before = (log.read(0, 1000), log.first_offset, log.next_offset, log.size_bytes, log.offset_for_timestamp(5060))
    log.close()
    log, report = SegmentLog.open(tmp_path, Retention(), FsyncPolicy.ALWAYS, 1024)
    assert report.clean and report.truncated_bytes == 0
    assert (report.records, report.segments) == (120, len(segment_files(tmp_path)))
    assert (
        log.read(0, 1000),
        log.first_offset,
        log.next_offset,
        log.size_bytes,
        log.offset_for_timestamp(5060),
    ) == before
    assert log.durable_offset == 120
    assert log.append(["next"], timestamp_ms=0) == [120]
    log.close()


def test_idempotency_survives_reopening(tmp_path: pathlib.Path) -> None:
    log = open_log(tmp_path)
    log.append(["a", "b", "c"], timestamp_ms=0, producer="p", first_sequence=10)
    log.append(["x"], timestamp_ms=0, producer="q", first_sequence=0)
    log.close()
    log = open_log(tmp_path)
    assert (log.last_sequence("p"), log.last_sequence("q")) == (12, 0)
    assert log.append(["b", "c", "d"], timestamp_ms=0, producer="p", first_sequence=11) == [None, None, 4]
    log.close()


def test_idempotency_survives_retention_and_reopening(tmp_path: pathlib.Path) -> None:
    """Each segment's header carries the producers' sequences, so deleting old segments forgets none."""
    log = open_log(tmp_path, Retention(max_records=10), segment_bytes=512)
    log.append(["once"], timestamp_ms=0, producer="rare", first_sequence=41)
    append_numbered(log, 100)
    assert log.enforce_retention(now_ms=0) > 0 and log.first_offset > 1  # "rare"'s record is gone
    log.close()
    log = open_log(tmp_path, Retention(max_records=10), segment_bytes=512)
    assert log.last_sequence("rare") == 41 and log.last_sequence("p") == 100
    assert log.append(["once"], timestamp_ms=0, producer="rare", first_sequence=41) == [None]
    log.close()


def test_a_directory_is_opened_by_one_log_at_a_time(tmp_path: pathlib.Path) -> None:
    log = open_log(tmp_path)
    with pytest.raises(StorageError, match="already open"):
        SegmentLog.open(tmp_path)
    log.close()
    open_log(tmp_path).close()


def test_a_missing_directory_is_created(tmp_path: pathlib.Path) -> None:
    with open_log(tmp_path / "data" / "topic") as log:
        log.append(["a"], timestamp_ms=0)
    assert segment_files(tmp_path / "data" / "topic") == ["00000000000000000000.log"]


def test_an_unknown_format_version_stops_the_open_and_changes_nothing(tmp_path: pathlib.Path) -> None:
    with open_log(tmp_path) as log:
        append_numbered(log, 10)
    path = tmp_path / "00000000000000000000.log"
    data = bytearray(path.read_bytes())
    data[8:12] = (2).to_bytes(4, "big")
    path.write_bytes(data)
    with pytest.raises(StorageError, match=r"format version 2.*written by a newer rsnet.*unclean_recovery = true"):
        SegmentLog.open(tmp_path)
    assert path.read_bytes() == data
    open_log(tmp_path / "other").close()  # the failed open released its lock: nothing leaked
    with pytest.raises(StorageError, match="format version 2"):
        SegmentLog.open(tmp_path)


# -- retention on disk ------------------------------------------------------------------------------


def test_retention_deletes_whole_segments_oldest_first_never_the_active_one(tmp_path: pathlib.Path) -> None:
    log = open_log(tmp_path, Retention(max_records=25), segment_bytes=512)
    append_numbered(log, 100)
    names = segment_files(tmp_path)
    dropped = log.enforce_retention(now_ms=0)
    remaining = segment_files(tmp_path)
    assert remaining == names[len(names) - len(remaining) :] and remaining[-1] == names[-1]
    assert log.first_offset == dropped == int(remaining[0][:-4])
    # The oldest segment left still holds a record among the newest 25: it could not go.
    first_segment_end = int(remaining[1][:-4])
    assert 100 - first_segment_end < 25 <= 100 - log.first_offset
    assert numbers(log) == list(range(log.first_offset, 100))
    assert log.size_bytes == sum(os.path.getsize(tmp_path / name) for name in remaining)
    log.close()
    log = open_log(tmp_path, segment_bytes=512)
    assert (log.first_offset, log.next_offset) == (dropped, 100)
    log.close()


def test_retention_by_age_of_everything_rolls_the_active_segment_first(tmp_path: pathlib.Path) -> None:
    log = open_log(tmp_path, Retention(max_age_ms=10), segment_bytes=1 << 20)
    append_numbered(log, 20)
    assert segment_files(tmp_path) == ["00000000000000000000.log"]
    assert log.enforce_retention(now_ms=1000) == 20
    assert segment_files(tmp_path) == ["00000000000000000020.log"]
    assert (log.first_offset, log.next_offset) == (20, 20)
    log.close()
    log = open_log(tmp_path, Retention(max_age_ms=10))
    assert (log.first_offset, log.next_offset, log.last_sequence("p")) == (20, 20, 19)
    log.close()


@pytest.mark.parametrize("fsync", list(FsyncPolicy))
def test_drop_all_deletes_every_segment_and_a_reopened_log_goes_on_at_the_same_offset(
    tmp_path: pathlib.Path, fsync: FsyncPolicy
) -> None:
    log = open_log(tmp_path, fsync=fsync)
    append_numbered(log, 60)  # several segments of 1 KiB
    assert len(segment_files(tmp_path)) > 2
    assert log.drop_all() == 60
    assert segment_files(tmp_path) == ["00000000000000000060.log"]
    assert log.drop_all() == 0 and segment_files(tmp_path) == ["00000000000000000060.log"]  # an empty active one stays
    log.close()
    log = open_log(tmp_path, fsync=fsync)
    assert (log.first_offset, log.next_offset, log.last_sequence("p")) == (60, 60, 59)
    append_numbered(log, 1)
    assert [record.value["n"] for record in log.read(60, 10)] == [60]
    log.close()


# -- fsync policies ----------------------------------------------------------------------------------


@pytest.fixture
def fsyncs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the log's data syncs (the real ones still run)."""
    calls: list[int] = []
    real = storage_files.datasync

    def counting(fd: int) -> None:
        calls.append(fd)
        real(fd)

    monkeypatch.setattr(storage_files, "datasync", counting)
    return calls


def test_always_syncs_once_per_append_before_it_returns(tmp_path: pathlib.Path, fsyncs: list[int]) -> None:
    log = open_log(tmp_path, fsync=FsyncPolicy.ALWAYS, segment_bytes=1 << 20)
    fsyncs.clear()
    log.append(list(range(100)), timestamp_ms=0)
    assert len(fsyncs) == 1 and log.durable_offset == log.next_offset == 100
    log.append([1], timestamp_ms=0)
    assert len(fsyncs) == 2 and log.durable_offset == 101
    log.close()


def test_interval_acknowledges_only_what_sync_made_durable(tmp_path: pathlib.Path, fsyncs: list[int]) -> None:
    log = open_log(tmp_path, fsync=FsyncPolicy.INTERVAL, segment_bytes=1 << 20)
    fsyncs.clear()
    log.append(["a", "b"], timestamp_ms=0)
    log.append(["c"], timestamp_ms=0)
    assert (log.durable_offset, log.next_offset, len(fsyncs)) == (0, 3, 0)
    assert [r.value for r in log.read(0, 10)] == ["a", "b", "c"]  # readable before durable
    log.sync()
    assert (log.durable_offset, len(fsyncs)) == (3, 1)
    log.sync()
    assert len(fsyncs) == 1  # nothing new: no fsync
    log.close()


def test_interval_syncs_a_segment_when_rolling_it(tmp_path: pathlib.Path) -> None:
    log = open_log(tmp_path, fsync=FsyncPolicy.INTERVAL, segment_bytes=512)
    append_numbered(log, 30)
    assert len(segment_files(tmp_path)) > 2
    assert 0 < log.durable_offset < log.next_offset  # up to the last roll
    assert log.durable_offset == int(segment_files(tmp_path)[-1][:-4])
    log.close()


def test_never_counts_written_as_durable_and_never_syncs(tmp_path: pathlib.Path, fsyncs: list[int]) -> None:
    log = open_log(tmp_path, fsync=FsyncPolicy.NEVER, segment_bytes=512)
    append_numbered(log, 30)
    assert log.durable_offset == log.next_offset == 30
    assert fsyncs == []
    log.close()
    assert fsyncs == []
    log = open_log(tmp_path, fsync=FsyncPolicy.NEVER, segment_bytes=512)
    assert numbers(log) == list(range(30))
    log.close()


# -- I/O failures ----------------------------------------------------------------------------------------


# Failed writes and fsyncs: test_storage_faults.py.


def test_a_record_damaged_after_opening_is_reported_when_read(tmp_path: pathlib.Path) -> None:
    log = open_log(tmp_path, segment_bytes=512)
    append_numbered(log, 40)
    first = tmp_path / segment_files(tmp_path)[0]
    with open(first, "r+b") as file:
        file.seek(os.path.getsize(first) - 10)
        byte = file.read(1)
        file.seek(-1, os.SEEK_CUR)
        file.write(bytes([byte[0] ^ 0xFF]))
    last_in_first = int(segment_files(tmp_path)[1][:-4]) - 1
    before = log.read(0, 100)  # the records before the damaged one, then the read stops
    assert [r.offset for r in before] == list(range(last_in_first))
    with pytest.raises(
        CorruptData, match=r"00000000000000000000\.log: corrupt data at byte \d+: .*CRC mismatch"
    ) as error:
        log.read(last_in_first, 100)
    assert error.value.path == str(first)
    assert log.read(int(segment_files(tmp_path)[1][:-4]), 1)  # other segments still read
    log.close()


def test_a_read_that_skips_over_a_damaged_length_field_reports_it(tmp_path: pathlib.Path) -> None:
    """Reads hop from an index entry to the wanted record by length fields alone; a bad hop is caught."""
    log = open_log(tmp_path, segment_bytes=1 << 20)
    path = tmp_path / segment_files(tmp_path)[0]
    header = os.path.getsize(path)
    log.append([f"{i:050d}" for i in range(40)], timestamp_ms=0)  # equal frames, all in one index interval
    frame = (os.path.getsize(path) - header) // 40
    assert log.read(30, 1)[0].value == f"{30:050d}"
    with open(path, "r+b") as file:
        file.seek(header + 10 * frame + 3)  # low byte of record 10's length
        file.write(b"\x01")
    with pytest.raises(CorruptData, match=r"offset 30"):
        log.read(30, 1)
    assert log.read(5, 1)[0].value == f"{5:050d}"  # before the damage, still fine
    log.close()
