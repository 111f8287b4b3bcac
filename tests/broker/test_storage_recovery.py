"""SegmentLog recovery: damaged tails and segments are cut, reported, and the log goes on.

Each test writes a log, closes it, damages the files the way a crash or a disk would, then
reopens it: the open succeeds, the RecoveryReport names the segment, the byte and the problem,
every record before the damage is intact, and appending continues at the right offset.
"""

from __future__ import annotations

import os
import pathlib

import msgpack
import pytest

from rsnet.broker.storage import FsyncPolicy, RecoveryReport, Retention, SegmentLog
from rsnet.broker.storage.records import encode_record

SEGMENT_BYTES = 1024


class Written:
    """A closed log of ``count`` single-record appends; where every record ends on disk."""

    def __init__(self, directory: pathlib.Path, count: int) -> None:
        self.directory = directory
        self.ends: dict[int, tuple[str, int]] = {}  # offset -> (segment name, byte after the record)
        with SegmentLog.open(directory, Retention(), FsyncPolicy.ALWAYS, SEGMENT_BYTES)[0] as log:
            for n in range(count):
                log.append([{"n": n, "pad": "x" * 30}], timestamp_ms=n, producer="p", first_sequence=n)
                name = self.segments()[-1]
                self.ends[n] = (name, os.path.getsize(directory / name))
        self.count = count

    def segments(self) -> list[str]:
        return sorted(name for name in os.listdir(self.directory) if name.endswith(".log"))

    def path(self, name: str) -> pathlib.Path:
        return self.directory / name

    def records_in(self, name: str) -> list[int]:
        return [n for n, (segment, _) in self.ends.items() if segment == name]

    def start_of(self, offset: int) -> int:
        """Byte where ``offset``'s record starts in its segment."""
        name, end = self.ends[offset]
        earlier = [e for n, (s, e) in self.ends.items() if s == name and n < offset]
        return max(earlier) if earlier else end - self.frame_size(offset)

    def frame_size(self, offset: int) -> int:
        return len(
            encode_record(
                msgpack.Packer(use_bin_type=True), offset, offset, {"n": offset, "pad": "x" * 30}, "p", offset
            )
        )

    def flip(self, name: str, position: int) -> None:
        data = bytearray(self.path(name).read_bytes())
        data[position] ^= 0x40
        self.path(name).write_bytes(data)

    def reopen(self) -> tuple[SegmentLog, RecoveryReport]:
        return SegmentLog.open(self.directory, Retention(), FsyncPolicy.ALWAYS, SEGMENT_BYTES)


def check_kept(log: SegmentLog, kept: int) -> None:
    """Records 0..kept-1 intact and nothing else; the next append gets offset ``kept``."""
    assert (log.first_offset, log.next_offset, log.durable_offset) == (0, kept, kept)
    assert [r.value["n"] for r in log.read(0, 10**6)] == list(range(kept))
    assert [r.offset for r in log.read(0, 10**6)] == list(range(kept))
    assert log.append(["after recovery"], timestamp_ms=0) == [kept]
    assert log.read(kept, 1)[0].value == "after recovery"


def check_repaired(written: Written, kept: int) -> None:
    """The repair was written to disk: the next open is clean and keeps the same records."""
    log, report = written.reopen()
    with log:
        assert report.clean, report.damaged
        assert log.next_offset == kept + 1 and log.read(kept, 1)[0].value == "after recovery"


@pytest.fixture
def written(tmp_path: pathlib.Path) -> Written:
    return Written(tmp_path, 60)


def test_a_record_cut_in_half_at_the_end_is_removed(written: Written) -> None:
    last = written.segments()[-1]
    start, end = written.start_of(59), written.ends[59][1]
    os.truncate(written.path(last), start + (end - start) // 2)
    log, report = written.reopen()
    with log:
        assert report.truncated_bytes == (end - start) // 2
        assert report.damaged == [
            f"{last}: at byte {start} (offset 59): frame cut off: its length says {end - start - 8} body bytes, "
            f"{(end - start) // 2 - 8} present; removed {(end - start) // 2} bytes from there to the end of the segment"
        ]
        assert report.records == 59
        assert log.last_sequence("p") == 58  # the cut record's sequence is forgotten: a retry is stored
        check_kept(log, 59)
    check_repaired(written, 59)


def test_a_record_cut_inside_its_length_field_is_removed(written: Written) -> None:
    last = written.segments()[-1]
    os.truncate(written.path(last), written.start_of(59) + 3)
    log, report = written.reopen()
    with log:
        assert "(offset 59): frame cut off: 3 of the 8 header bytes present" in report.damaged[0]
        check_kept(log, 59)


def test_a_byte_flipped_in_the_middle_of_the_last_segment_cuts_the_segment_there(written: Written) -> None:
    last = written.segments()[-1]
    in_last = written.records_in(last)
    assert len(in_last) >= 5
    damaged = in_last[len(in_last) // 2]
    position = written.start_of(damaged) + 20  # inside the body
    written.flip(last, position)
    log, report = written.reopen()
    with log:
        start = written.start_of(damaged)
        assert len(report.damaged) == 1
        assert report.damaged[0].startswith(f"{last}: at byte {start} (offset {damaged}): CRC mismatch")
        assert report.truncated_bytes == written.ends[59][1] - start
        assert os.path.getsize(written.path(last)) == start
        check_kept(log, damaged)
    check_repaired(written, damaged)


def test_a_flipped_length_field_is_caught_by_the_crc(written: Written) -> None:
    last = written.segments()[-1]
    damaged = written.records_in(last)[1]
    written.flip(last, written.start_of(damaged) + 3)  # low byte of the length: still plausible
    log, report = written.reopen()
    with log:
        assert f"(offset {damaged}):" in report.damaged[0]
        check_kept(log, damaged)


def test_garbage_after_the_last_record_is_removed(written: Written) -> None:
    last = written.segments()[-1]
    end = os.path.getsize(written.path(last))
    garbage = b"\x00\x00\x00\x10garbage that is not a frame"  # a plausible length, then noise
    with open(written.path(last), "ab") as file:
        file.write(garbage)
    log, report = written.reopen()
    with log:
        assert report.damaged == [
            f"{last}: at byte {end} (offset 60): CRC mismatch (stored 0x67617262) over a frame of 16 body bytes; "
            f"removed {len(garbage)} bytes from there to the end of the segment"
        ]
        assert report.truncated_bytes == len(garbage)
        check_kept(log, 60)
    check_repaired(written, 60)


def test_zeros_after_the_last_record_are_removed(written: Written) -> None:
    """What a file system can leave after a power failure: the size grew, the data never came."""
    last = written.segments()[-1]
    end = os.path.getsize(written.path(last))
    with open(written.path(last), "ab") as file:
        file.write(bytes(4096))
    log, report = written.reopen()
    with log:
        assert report.damaged == [
            f"{last}: at byte {end} (offset 60): impossible frame length 0; "
            "removed 4096 bytes from there to the end of the segment"
        ]
        check_kept(log, 60)


def test_a_well_formed_record_with_the_wrong_offset_ends_the_log(written: Written) -> None:
    last = written.segments()[-1]
    end = os.path.getsize(written.path(last))
    with open(written.path(last), "ab") as file:
        file.write(encode_record(msgpack.Packer(use_bin_type=True), 5, 0, "replayed", None, None))
    log, report = written.reopen()
    with log:
        assert report.damaged[0].startswith(
            f"{last}: at byte {end} (offset 60): record holds offset 5 where 60 was expected"
        )
        check_kept(log, 60)


def test_damage_in_an_earlier_segment_removes_every_later_one(written: Written) -> None:
    names = written.segments()
    assert len(names) >= 4
    second = names[1]
    damaged = written.records_in(second)[2]
    written.flip(second, written.start_of(damaged) + 12)
    later_bytes = sum(os.path.getsize(written.path(name)) for name in names[2:])
    cut_bytes = os.path.getsize(written.path(second)) - written.start_of(damaged)
    log, report = written.reopen()
    with log:
        assert report.damaged[0].startswith(
            f"{second}: at byte {written.start_of(damaged)} (offset {damaged}): CRC mismatch"
        )
        assert report.damaged[1] == (
            f"removed {len(names) - 2} segment file(s), {later_bytes} bytes, from the damage on: "
            + ", ".join(names[2:])
        )
        assert report.truncated_bytes == cut_bytes + later_bytes
        assert written.segments() == names[:2]
        check_kept(log, damaged)
    check_repaired(written, damaged)


def test_a_segment_with_a_damaged_header_is_removed_with_everything_after_it(written: Written) -> None:
    names = written.segments()
    written.flip(names[-2], 12 + 8 + 3)  # inside the header frame's body
    base = int(names[-2][:-4])
    log, report = written.reopen()
    with log:
        assert report.damaged[0].startswith(f"{names[-2]}: header at byte 12: CRC mismatch")
        assert report.damaged[1].endswith(f"from the damage on: {names[-2]}, {names[-1]}")
        check_kept(log, base)


def test_when_the_only_segment_is_unreadable_the_log_restarts_empty_at_its_offset(tmp_path: pathlib.Path) -> None:
    with SegmentLog.open(tmp_path, Retention(max_records=5), FsyncPolicy.ALWAYS, 256)[0] as log:
        log.append([f"{i:040d}" for i in range(40)], timestamp_ms=0)
        log.enforce_retention(now_ms=0)
        first = log.first_offset
    for name in sorted(os.listdir(tmp_path)):
        if name.endswith(".log") and int(name[:-4]) != first:
            os.unlink(tmp_path / name)
    only = tmp_path / f"{first:020d}.log"
    only.write_bytes(b"rsnet")  # cut inside the magic
    log, report = SegmentLog.open(tmp_path, Retention(), FsyncPolicy.ALWAYS, 256)
    with log:
        assert report.damaged[0] == f"{first:020d}.log: header cut off at byte 5"
        assert (
            report.damaged[-1]
            == f"the log restarts empty at offset {first}; the producers' sequences stored before it are lost"
        )
        assert (log.first_offset, log.next_offset) == (first, first)
        assert log.append(["again"], timestamp_ms=0) == [first]


def test_a_file_that_is_not_a_segment_is_reported_as_such(written: Written) -> None:
    last = written.segments()[-1]
    written.path(last).write_bytes(b"PK\x03\x04 something else entirely")
    log, report = written.reopen()
    with log:
        assert report.damaged[0] == f"{last}: not a segment file (wrong magic bytes at byte 0)"
        check_kept(log, int(last[:-4]))


def test_segments_before_missing_offsets_are_removed_as_an_interrupted_retention(written: Written) -> None:
    names = written.segments()
    os.unlink(written.path(names[1]))
    first_kept = int(names[2][:-4])
    log, report = written.reopen()
    with log:
        assert report.damaged == [
            f"{names[0]}: removed (offsets 0 to {int(names[1][:-4]) - 1}) because offsets {int(names[1][:-4])} "
            f"to {first_kept - 1} are missing before {names[2]}: an interrupted retention, or a segment deleted by hand"
        ]
        assert (log.first_offset, log.next_offset) == (first_kept, 60)
        assert [r.value["n"] for r in log.read(first_kept, 100)] == list(range(first_kept, 60))
        assert log.last_sequence("p") == 59


def test_a_segment_starting_inside_the_previous_one_is_removed(written: Written) -> None:
    names = written.segments()
    last_base = int(names[-1][:-4])
    os.rename(written.path(names[-1]), written.path(f"{last_base - 1:020d}.log"))
    log, report = written.reopen()
    with log:
        assert report.damaged[0] == (
            f"{last_base - 1:020d}.log: starts at offset {last_base - 1}, inside the previous segment "
            f"(which ends before {last_base})"
        )
        check_kept(log, last_base)


def test_a_segment_left_half_created_by_a_crash_is_removed_silently(written: Written) -> None:
    (written.directory / "00000000000000000060.log.tmp").write_bytes(b"rsnetlog\x00")
    log, report = written.reopen()
    with log:
        assert report.clean
        assert "00000000000000000060.log.tmp" not in os.listdir(written.directory)
        check_kept(log, 60)
