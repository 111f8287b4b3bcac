"""SegmentLog recovery: a torn tail is cut; damage anywhere else costs only the damaged records.

Each test writes a log, closes it, damages the files the way a crash or a disk would, then
reopens it. A torn last write is cut (a copy kept in ``quarantine/``) if it was never synced
(the log's synced mark says how far syncs went); a synced one cut short is damage. Damage in the middle of
the log becomes a damaged range: the records on both sides keep their offsets, reading the
range raises OffsetDamaged, a copy of the bytes is kept, and new records get offsets after the
old end. Damage recovery cannot place stops the open, changing nothing, unless the operator
asks for an unclean recovery.
"""

from __future__ import annotations

import errno
import os
import pathlib
import re
import zlib
from typing import Any

import msgpack
import pytest

from rsnet.broker.storage import (
    FsyncPolicy,
    OffsetDamaged,
    RecoveryReport,
    Retention,
    SegmentLog,
    StorageError,
    UncleanRecoveryNeeded,
    synced_mark,
)
from rsnet.broker.storage.files import REAL
from rsnet.broker.storage.records import encode_record

from .storage_faults import FaultyFiles

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

    def synced_before(self, offset: int) -> None:
        """As if the records from ``offset`` on were written and their sync never returned (a
        crash): the log's synced mark says so, and cutting them is a torn write's repair."""
        synced_mark.write(REAL, str(self.directory), offset, 0)

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

    def reopen(self, unclean: bool = False) -> tuple[SegmentLog, RecoveryReport]:
        return SegmentLog.open(self.directory, Retention(), FsyncPolicy.ALWAYS, SEGMENT_BYTES, unclean_recovery=unclean)

    def snapshot(self) -> dict[str, bytes]:
        return {name: (self.directory / name).read_bytes() for name in sorted(os.listdir(self.directory))}


def check_kept(log: SegmentLog, kept: int) -> None:
    """Records 0..kept-1 intact and nothing else; the next append gets offset ``kept``."""
    assert (log.first_offset, log.next_offset, log.durable_offset) == (0, kept, kept)
    assert [r.value["n"] for r in log.read(0, 10**6)] == list(range(kept))
    assert [r.offset for r in log.read(0, 10**6)] == list(range(kept))
    assert log.append(["after recovery"], timestamp_ms=0) == [kept]
    assert log.read(kept, 1)[0].value == "after recovery"


def check_damaged(log: SegmentLog, first: int, end: int, total: int) -> None:
    """Offsets first..end-1 damaged, every other record of 0..total-1 intact at its offset;
    the next append gets offset ``total``."""
    assert (log.first_offset, log.next_offset, log.durable_offset) == (0, total, total)
    assert [(r.offset, r.value["n"]) for r in log.read(0, 10**6)] == [(n, n) for n in range(first)]
    for offset in (first, end - 1):
        with pytest.raises(OffsetDamaged) as raised:
            log.read(offset, 1)
        assert (raised.value.damage.first, raised.value.damage.end) == (first, end)
    assert [(r.offset, r.value["n"]) for r in log.read(end, 10**6)] == [(n, n) for n in range(end, total)]
    assert [(d.first, d.end) for d in log.damaged_ranges] == [(first, end)]
    assert log.append(["after recovery"], timestamp_ms=0) == [total]
    assert log.read(total, 1)[0].value == "after recovery"


def quarantined(written: Written) -> dict[str, bytes]:
    directory = written.directory / "quarantine"
    return {name: (directory / name).read_bytes() for name in sorted(os.listdir(directory))}


def check_repaired(written: Written, kept: int) -> None:
    """The repair was written to disk: the next open is clean and keeps the same records."""
    log, report = written.reopen()
    with log:
        assert report.clean, report.damaged
        assert log.next_offset == kept + 1 and log.read(kept, 1)[0].value == "after recovery"


def check_stops_until_unclean(written: Written, problem: str, kept: int) -> None:
    """The open stops with ``problem`` (a regular expression), changing nothing; an unclean
    recovery reports it and keeps records 0..kept-1, giving offset ``kept`` again, as
    unclean_recovery says it may."""
    before = written.snapshot()
    with pytest.raises(UncleanRecoveryNeeded, match=problem):
        written.reopen()
    assert written.snapshot() == before
    log, report = written.reopen(unclean=True)
    with log:
        assert any(re.search(problem, line) for line in report.damaged)
        check_kept(log, kept)


EITHER_MARK_FILE = pytest.mark.parametrize(
    "kept", [synced_mark.MARK_NAMES, ("synced",), ("synced.copy",)], ids=["mark", "synced-only", "copy-only"]
)
"""The mark's two files, or either alone (the other deleted, say): each is the whole mark."""


def check_placed_by_the_synced_mark_only(directory: pathlib.Path, problem: str, reopen: Any, kept: Any) -> Any:
    """Damage only the ``synced`` mark can place: without the mark (neither of its files) the
    open stops with ``problem``, changing nothing; with its files ``kept``, ``reopen()``
    opens (returned, to be checked)."""
    mark = {name: (directory / name).read_bytes() for name in synced_mark.MARK_NAMES}
    for name in synced_mark.MARK_NAMES:
        (directory / name).unlink()
    before = {name: (directory / name).read_bytes() for name in sorted(os.listdir(directory))}
    with pytest.raises(UncleanRecoveryNeeded, match=problem):
        reopen()
    assert {name: (directory / name).read_bytes() for name in sorted(os.listdir(directory))} == before
    for name in kept:
        (directory / name).write_bytes(mark[name])
    return reopen()


@pytest.fixture
def written(tmp_path: pathlib.Path) -> Written:
    return Written(tmp_path, 60)


def test_a_record_cut_in_half_at_the_end_is_removed(written: Written) -> None:
    last = written.segments()[-1]
    start, end = written.start_of(59), written.ends[59][1]
    cut = start + (end - start) // 2
    torn = written.path(last).read_bytes()[start:cut]
    os.truncate(written.path(last), cut)
    written.synced_before(59)
    log, report = written.reopen()
    with log:
        copy = f"{last}.bytes-{start}-{cut - 1}"
        assert report.truncated_bytes == (end - start) // 2
        assert report.damaged == [
            f"{last}: at byte {start} (offset 59): frame cut off: its length says {end - start - 8} body bytes, "
            f"{(end - start) // 2 - 8} present; removed {(end - start) // 2} bytes from there to the end of the "
            f"segment (a torn last write); a copy of the bytes is in quarantine/{copy}"
        ]
        assert quarantined(written) == {copy: torn}
        assert report.records == 59 and report.damaged_ranges == []
        assert log.last_sequence("p") == 58  # the cut record's sequence is forgotten: a retry is stored
        check_kept(log, 59)
    check_repaired(written, 59)


def test_a_record_cut_inside_its_length_field_is_removed(written: Written) -> None:
    last = written.segments()[-1]
    os.truncate(written.path(last), written.start_of(59) + 3)
    written.synced_before(59)
    log, report = written.reopen()
    with log:
        assert "(offset 59): frame cut off: 3 of the 8 header bytes present" in report.damaged[0]
        check_kept(log, 59)


def test_a_synced_record_cut_short_at_the_end_is_a_damaged_range_whose_offset_is_never_given_again(
    written: Written,
) -> None:
    """What a torn write leaves, on a record a sync covered (so acknowledged): damage, not a
    torn write to cut. It stopped the open, and unclean_recovery then gave its offset to the
    next record; its offset is now a damaged range before a new segment, which holds what
    comes next, and the open goes on."""
    last = written.segments()[-1]
    start = written.start_of(59)
    os.truncate(written.path(last), start + 20)
    log, report = written.reopen()
    with log:
        assert f"{last}: offsets 59 to 59 are damaged (bytes {start} to {start + 19}: " in report.damaged[0]
        check_damaged(log, 59, 60, 60)
    log, report = written.reopen()  # found again, the same, with the record appended after it
    with log:
        assert [(d.first, d.end) for d in log.damaged_ranges] == [(59, 60)]
        assert log.read(60, 1)[0].value == "after recovery"


def test_a_synced_mark_that_does_not_check_is_reported_and_written_again(written: Written) -> None:
    (written.directory / "synced").write_bytes(b"RSHX" + bytes(20))
    log, report = written.reopen()
    with log:
        assert report.damaged == [
            "synced: the bytes do not check (CRC); not used (the log writes a new one as it syncs)"
        ]
        check_kept(log, 60)
    assert synced_mark.read(str(written.directory)) == synced_mark.Mark(61, 0)


def test_a_mark_of_the_first_layout_is_read_without_a_start(written: Written) -> None:
    """A 16-byte mark (no start offset), as logs written before start offsets were kept have
    (and before the mark had a copy)."""
    body = b"RSHW" + (60).to_bytes(8, "big")
    (written.directory / "synced").write_bytes(body + zlib.crc32(body).to_bytes(4, "big"))
    (written.directory / "synced.copy").unlink()
    assert synced_mark.read(str(written.directory)) == synced_mark.Mark(60, None)
    last = written.segments()[-1]
    os.truncate(written.path(last), written.start_of(59) + 20)  # covered by that mark: not a torn write
    log, _ = written.reopen()
    with log:
        assert [(d.first, d.end) for d in log.damaged_ranges] == [(59, 60)]


@pytest.mark.parametrize("damaged", [("synced",), ("synced.copy",)])
def test_a_partial_last_record_with_one_mark_file_damaged_is_placed_by_the_other(
    written: Written, damaged: tuple[str, ...]
) -> None:
    """Two faults at once, the mark kept twice for them: the other file says the last record
    was synced, so it is a damaged range (with one file, the open stopped: see below)."""
    last = written.segments()[-1]
    os.truncate(written.path(last), written.start_of(59) + 20)
    (written.directory / damaged[0]).write_bytes(synced_mark.encode(60, 0)[:23] + b"\x00")  # a CRC byte changed
    log, report = written.reopen()
    with log:
        assert report.damaged[0] == (
            f"{damaged[0]}: the bytes do not check (CRC); not used (the log writes a new one as it syncs)"
        )
        check_damaged(log, 59, 60, 60)
    assert synced_mark.read(str(written.directory)) == synced_mark.Mark(61, 0)  # both files written again


def test_a_partial_last_record_with_both_mark_files_damaged_stops_the_open_until_unclean_recovery(
    written: Written,
) -> None:
    """Three faults at once: the mark that would say whether the last record was synced does
    not check in either file, so cutting the record could take an acknowledged one and give its
    offset again."""
    last = written.segments()[-1]
    os.truncate(written.path(last), written.start_of(59) + 20)
    for name in synced_mark.MARK_NAMES:
        (written.directory / name).write_bytes(synced_mark.encode(60, 0)[:23] + b"\x00")  # a CRC byte changed
    check_stops_until_unclean(written, r"ends in bytes that are not a whole record .* is itself damaged", 59)


@pytest.mark.parametrize("file", synced_mark.MARK_NAMES)
@pytest.mark.parametrize("damage", ["deleted", "blank", "flipped"])
@pytest.mark.parametrize("loss", ["cut at a record boundary", "newest segment deleted"])
def test_one_mark_file_damaged_and_synced_records_missing_at_the_end_is_found_by_the_other(
    written: Written, file: str, damage: str, loss: str
) -> None:
    """Two faults at once: when the mark was one file, its damage (deleted, blanked, a bit
    flipped) with synced records missing at the end took those acknowledged records unreported
    and gave their offsets to new records (fault round 5: 50 of 128 double damages). The
    other file says they were synced: their offsets are a damaged range, never given again."""
    last = written.segments()[-1]
    lost = written.records_in(last)[-3] if loss == "cut at a record boundary" else int(last[:-4])
    if loss == "cut at a record boundary":
        os.truncate(written.path(last), written.start_of(lost))
    else:
        written.path(last).unlink()
    mark = written.path(file)
    if damage == "deleted":
        mark.unlink()
    elif damage == "blank":
        mark.write_bytes(bytes(24))
    else:
        written.flip(file, 9)
    log, report = written.reopen()
    with log:
        assert any(line.startswith("records up to offset 59 were synced (so acknowledged)") for line in report.damaged)
        # The damaged file is reported, but the copy deleted: a log from before the copy has none.
        told = {"deleted": "missing beside synced.copy", "blank": "blank (24 bytes", "flipped": "do not check"}[damage]
        assert any(line.startswith(f"{file}: ") and told in line for line in report.damaged) == (
            (file, damage) != ("synced.copy", "deleted")
        )
        check_damaged(log, lost, 60, 60)
    log, report = written.reopen()  # found again at the next open, the record appended after it kept
    with log:
        assert [(d.first, d.end) for d in log.damaged_ranges] == [(lost, 60)]
        assert log.read(60, 1)[0].value == "after recovery"


@pytest.mark.parametrize("blank", [b"", bytes(16)], ids=["empty", "zeros"])
def test_a_blank_mark_is_no_evidence_and_a_partial_last_record_is_cut(written: Written, blank: bytes) -> None:
    """What an OS crash leaves of a mark whose first write never reached the disk: as if there
    were none, so a torn last write is cut as usual (and reported)."""
    last = written.segments()[-1]
    os.truncate(written.path(last), written.start_of(59) + 20)
    for name in synced_mark.MARK_NAMES:
        (written.directory / name).write_bytes(blank)
    log, report = written.reopen()
    with log:
        assert report.damaged[0] == (
            f"synced: blank ({len(blank)} bytes, all zero): its first write did not reach the disk; "
            f"synced.copy: blank ({len(blank)} bytes, all zero): its first write did not reach the disk; "
            "not used (the log writes a new one as it syncs)"
        )
        assert "a torn last write" in report.damaged[1]
        check_kept(log, 59)
    check_repaired(written, 59)


def test_a_synced_mark_that_cannot_be_read_is_reported_and_the_log_works(written: Written) -> None:
    for name in synced_mark.MARK_NAMES:
        (written.directory / name).unlink()
        (written.directory / name).mkdir()  # not a file: the mark can be neither read nor written
    log, report = written.reopen()
    with log:
        assert report.damaged == [
            "synced: cannot be read (Is a directory); synced.copy: cannot be read (Is a directory); "
            "not used (the log writes a new one as it syncs)"
        ]
        check_kept(log, 60)  # appends and syncs go on without a mark


def test_a_byte_flipped_in_the_middle_of_the_last_segment_costs_only_that_record(written: Written) -> None:
    last = written.segments()[-1]
    in_last = written.records_in(last)
    assert len(in_last) >= 5
    damaged = in_last[len(in_last) // 2]
    start, stop = written.start_of(damaged), written.ends[damaged][1]
    written.flip(last, start + 20)  # inside the body
    original = written.path(last).read_bytes()
    log, report = written.reopen()
    with log:
        copy = f"{last}.bytes-{start}-{stop - 1}"
        assert len(report.damaged) == 1
        assert report.damaged[0].startswith(
            f"{last}: offsets {damaged} to {damaged} are damaged (bytes {start} to {stop - 1}: CRC mismatch"
        )
        assert report.damaged[0].endswith(
            f"the records before and after are kept and those offsets are never reused; "
            f"a copy of the bytes is in quarantine/{copy}"
        )
        assert report.truncated_bytes == 0 and report.records == 59
        assert written.path(last).read_bytes() == original  # nothing cut, nothing rewritten
        assert quarantined(written) == {copy: original[start:stop]}
        assert log.last_sequence("p") == 59
        check_damaged(log, damaged, damaged + 1, 60)
    log, report = written.reopen()  # found again, the same, at every open; the copy is not made twice
    with log:
        assert [(d.first, d.end) for d in report.damaged_ranges] == [(damaged, damaged + 1)]
        assert log.next_offset == 61 and log.read(60, 1)[0].value == "after recovery"
        assert list(quarantined(written)) == [copy]


def test_a_flipped_length_field_is_caught_by_the_crc(written: Written) -> None:
    last = written.segments()[-1]
    damaged = written.records_in(last)[1]
    written.flip(last, written.start_of(damaged) + 3)  # low byte of the length: still plausible
    log, report = written.reopen()
    with log:
        assert f"offsets {damaged} to {damaged} are damaged" in report.damaged[0]
        check_damaged(log, damaged, damaged + 1, 60)


def test_two_damaged_records_in_a_row_make_one_range(written: Written) -> None:
    last = written.segments()[-1]
    damaged = written.records_in(last)[1]
    written.flip(last, written.start_of(damaged) + 12)
    written.flip(last, written.start_of(damaged + 1) + 12)
    log, _ = written.reopen()
    with log:
        check_damaged(log, damaged, damaged + 2, 60)


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
            f"removed {len(garbage)} bytes from there to the end of the segment (a torn last write); "
            f"a copy of the bytes is in quarantine/{last}.bytes-{end}-{end + len(garbage) - 1}"
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
            "removed 4096 bytes from there to the end of the segment (a torn last write); "
            f"a copy of the bytes is in quarantine/{last}.bytes-{end}-{end + 4095}"
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


def test_damage_in_an_earlier_segment_costs_only_the_damaged_record(written: Written) -> None:
    names = written.segments()
    assert len(names) >= 4
    second = names[1]
    damaged = written.records_in(second)[2]
    written.flip(second, written.start_of(damaged) + 12)
    log, report = written.reopen()
    with log:
        assert report.damaged[0].startswith(f"{second}: offsets {damaged} to {damaged} are damaged")
        assert report.truncated_bytes == 0
        assert written.segments() == names
        check_damaged(log, damaged, damaged + 1, 60)


def test_damage_running_to_the_end_of_a_sealed_segment_ends_at_the_next_segment(written: Written) -> None:
    names = written.segments()
    second = names[1]
    last_in_second = written.records_in(second)[-1]
    written.flip(second, written.start_of(last_in_second) + 12)
    log, report = written.reopen()
    with log:
        assert report.sidecars_ignored[0].startswith(f"{second[:-4]}.idx: the segment's bytes do not match")
        check_damaged(log, last_in_second, int(names[2][:-4]), 60)


@pytest.mark.parametrize("which", ["sealed", "newest"])
def test_a_segment_with_a_damaged_header_keeps_its_records(written: Written, which: str) -> None:
    """Attack round 4: a bit flipped in a sealed segment's header made all of its records
    OFFSET_DAMAGED, every one intact on disk with its own CRC and offset; in the newest
    segment's header it stopped the open (how many records it held was unknown), and
    unclean_recovery then cut every record of it, giving their offsets to new ones. Its
    records are found after it by their frames; only what the header alone held is lost."""
    names = written.segments()
    name = names[-2] if which == "sealed" else names[-1]
    base = int(name[:-4])
    assert written.records_in(name)
    written.flip(name, 12 + 8 + 3)  # inside the header frame's body
    for _ in range(2):  # and again, with a record appended since
        log, report = written.reopen()
        with log:
            assert report.damaged[0].startswith(
                f"{name}: header unreadable (bytes 0 to {written.start_of(base) - 1}: header at byte 12: CRC mismatch"
            )
            assert report.damaged[0].endswith(
                "); every record after it is intact and kept; only the producers' sequences it held as of the "
                "segment's creation are lost"
            )
            assert log.damaged_ranges == []
            assert [(r.offset, r.value["n"]) for r in log.read(0, written.count)] == [
                (n, n) for n in range(written.count)
            ]
            assert log.last_sequence("p") == written.count - 1
            if log.next_offset == written.count:
                assert log.append(["after recovery"], timestamp_ms=0) == [written.count]
            else:
                assert log.read(written.count, 1)[0].value == "after recovery"


@EITHER_MARK_FILE
def test_the_active_segments_damaged_header_with_no_intact_record_after_it_is_placed_by_the_synced_mark(
    written: Written, kept: Any
) -> None:
    """How many records the segment held is unknown but for the mark: the offsets of the
    synced ones are a damaged range (it stopped the open, and unclean_recovery gave them again)."""
    last = written.segments()[-1]
    written.flip(last, 12 + 8 + 3)
    for offset in written.records_in(last):
        written.flip(last, written.start_of(offset) + 12)
    problem = "the active segment's header is unreadable, so how many records"
    log, report = check_placed_by_the_synced_mark_only(written.directory, problem, written.reopen, kept)
    with log:
        assert report.damaged[0].startswith(f"{last}: header at byte 12: CRC mismatch")
        check_damaged(log, int(last[:-4]), 60, 60)


def test_damage_from_a_sealed_segments_header_into_its_records_costs_those_records(written: Written) -> None:
    names = written.segments()
    base = int(names[-2][:-4])
    for position in (12 + 8 + 3, written.start_of(base + 1) + 6):  # the header, and the second record
        written.flip(names[-2], position)
    log, report = written.reopen()
    with log:
        assert f"{names[-2]}: offsets {base} to {base + 1} are damaged (bytes 0 to " in report.damaged[0]
        assert "header: header at byte 12: CRC mismatch" in report.damaged[0]
        check_damaged(log, base, base + 2, written.count)


@pytest.mark.parametrize("which", ["sealed", "newest"])
def test_a_flipped_bit_in_a_segments_format_version(written: Written, which: str) -> None:
    """A version no rsnet wrote under a later segment of this version is damage, not another
    rsnet's segment: the header is damaged, the records are kept. On the newest segment it
    cannot be told from a newer rsnet's: the open stops, changing nothing, unless
    unclean_recovery."""
    names = written.segments()
    name = names[-2] if which == "sealed" else names[-1]
    written.flip(name, 11)  # version 1 reads 65
    if which == "sealed":
        log, report = written.reopen()
        with log:
            assert report.damaged[0].startswith(
                f"{name}: header unreadable (bytes 0 to {written.start_of(int(name[:-4])) - 1}: format version "
                f"field reads 65, damaged (a later segment, {names[-1]}, is version 1)); every record after it is intact"
            )
            assert [r.offset for r in log.read(0, 10**6)] == list(range(written.count))
        return
    before = written.snapshot()
    with pytest.raises(StorageError, match=r"format version 65.*newer rsnet.*or its header is damaged"):
        written.reopen()
    assert written.snapshot() == before
    log, report = written.reopen(unclean=True)
    with log:  # taken for a damaged header, whose records follow it
        assert report.damaged[0].startswith(
            f"{name}: header unreadable (bytes 0 to {written.start_of(int(name[:-4])) - 1}: format version 65 where "
            "this rsnet reads 1); every record after it is intact and kept"
        )
        assert [r.offset for r in log.read(0, 10**6)] == list(range(written.count))


@EITHER_MARK_FILE
def test_when_the_only_segment_is_unreadable_its_synced_offsets_are_a_damaged_range(
    tmp_path: pathlib.Path, kept: Any
) -> None:
    """Without the synced mark the open stops (how many records it held is unknown); with
    it, the offsets of the synced records are a damaged range, never given again (it stopped
    the open, and unclean_recovery then restarted the log at the segment's first offset)."""
    with SegmentLog.open(tmp_path, Retention(max_records=5), FsyncPolicy.ALWAYS, 256)[0] as log:
        log.append([f"{i:040d}" for i in range(40)], timestamp_ms=0)
        log.enforce_retention(now_ms=0)
        first = log.first_offset
    for name in sorted(os.listdir(tmp_path)):
        if name.endswith(".log") and int(name[:-4]) != first:
            os.unlink(tmp_path / name)
    only = tmp_path / f"{first:020d}.log"
    only.write_bytes(b"rsnet")  # cut inside the magic

    def reopen() -> tuple[SegmentLog, RecoveryReport]:
        return SegmentLog.open(tmp_path, Retention(), FsyncPolicy.ALWAYS, 256)

    log, report = check_placed_by_the_synced_mark_only(
        tmp_path, r"header cut off at byte 5.*unclean_recovery", reopen, kept
    )
    with log:
        assert report.damaged[0] == f"{first:020d}.log: header cut off at byte 5"
        assert any(line.startswith("records up to offset 39 were synced (so acknowledged)") for line in report.damaged)
        assert (
            report.damaged[-1]
            == "the log restarts empty at offset 40; the producers' sequences stored before it are lost"
        )
        assert (log.first_offset, log.next_offset) == (first, 40)
        assert [(d.first, d.end) for d in log.damaged_ranges] == [(first, 40)]
        assert log.append(["again"], timestamp_ms=0) == [40]
    assert (tmp_path / "quarantine" / f"{first:020d}.log").read_bytes() == b"rsnet"
    log, report = reopen()  # the same at the next open
    with log:
        assert [(d.first, d.end) for d in log.damaged_ranges] == [(first, 40)]
        assert log.read(40, 1)[0].value == "again"


@EITHER_MARK_FILE
def test_an_active_segment_that_is_not_a_segment_is_placed_by_the_synced_mark(written: Written, kept: Any) -> None:
    last = written.segments()[-1]
    written.path(last).write_bytes(b"PK\x03\x04 something else entirely")
    log, report = check_placed_by_the_synced_mark_only(written.directory, "not a segment file", written.reopen, kept)
    with log:  # its records' offsets, synced, are never given again
        assert report.damaged[0] == f"{last}: not a segment file (wrong magic bytes at byte 0)"
        check_damaged(log, int(last[:-4]), 60, 60)


def test_offsets_no_segment_holds_become_a_damaged_range_and_both_sides_stay(written: Written) -> None:
    names = written.segments()
    os.unlink(written.path(names[1]))
    first, end = int(names[1][:-4]), int(names[2][:-4])
    log, report = written.reopen()
    problem = f"no segment file holds offsets {first} to {end - 1} (before {names[2]}): deleted by hand, or lost"
    with log:
        # Reported as any damage is (the broker logs report.damaged and /health shows it),
        # not only kept as a range: acknowledged records are gone.
        assert report.damaged == [problem]
        assert [(d.first, d.end, d.problem) for d in report.damaged_ranges] == [(first, end, problem)]
        assert log.last_sequence("p") == 59
        check_damaged(log, first, end, 60)


def test_a_segment_starting_inside_the_previous_one_stops_the_open_until_unclean_recovery(written: Written) -> None:
    names = written.segments()
    last_base = int(names[-1][:-4])
    os.rename(written.path(names[-1]), written.path(f"{last_base - 1:020d}.log"))
    before = written.snapshot()
    with pytest.raises(UncleanRecoveryNeeded, match="inside the previous segment"):
        written.reopen()
    assert written.snapshot() == before
    log, report = written.reopen(unclean=True)
    with log:
        assert report.damaged[0] == (
            f"{last_base - 1:020d}.log: starts at offset {last_base - 1}, inside the previous segment "
            f"(which ends before {last_base})"
        )
        check_damaged(log, last_base, 60, 60)  # the offsets of its synced records are never given again
    assert os.listdir(written.directory / "quarantine") == [f"{last_base - 1:020d}.log"]


def test_a_segment_left_half_created_by_a_crash_is_removed_silently(written: Written) -> None:
    (written.directory / "00000000000000000060.log.tmp").write_bytes(b"rsnetlog\x00")
    log, report = written.reopen()
    with log:
        assert report.clean
        assert "00000000000000000060.log.tmp" not in os.listdir(written.directory)
        check_kept(log, 60)


def test_the_oldest_segment_deleted_by_hand_becomes_a_damaged_range(written: Written) -> None:
    """Retention keeps the log's start in the synced mark, so a missing oldest segment is not
    taken for retention's work: its offsets are a damaged range, reported at every open."""
    names = written.segments()
    os.unlink(written.path(names[0]))
    end = int(names[1][:-4])
    problem = f"no segment file holds offsets 0 to {end - 1} (the oldest, which retention had not deleted): deleted by hand, or lost"
    for _ in range(2):
        log, report = written.reopen()
        with log:
            assert report.damaged == [problem]
            assert [(d.first, d.end, d.problem) for d in report.damaged_ranges] == [(0, end, problem)]
            assert (log.first_offset, log.next_offset) == (0, 60)
            with pytest.raises(OffsetDamaged) as raised:
                log.read(0, 1)
            assert (raised.value.damage.first, raised.value.damage.end) == (0, end)
            assert [r.value["n"] for r in log.read(end, 10**6)] == list(range(end, 60))


class RecordedFiles(type(REAL)):  # type: ignore[misc]
    """The real file operations, each recorded as (call, file name)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    def datasync(self, fd: int) -> None:
        self.calls.append(("datasync", os.path.basename(os.readlink(f"/proc/self/fd/{fd}"))))
        super().datasync(fd)

    def unlink(self, path: str) -> None:
        self.calls.append(("unlink", os.path.basename(path)))
        super().unlink(path)


def retained_log(directory: pathlib.Path, files: RecordedFiles) -> SegmentLog:
    """A log of 60 records in 1 KiB segments that keeps the last 20."""
    log, _ = SegmentLog.open(directory, Retention(max_records=20), FsyncPolicy.ALWAYS, SEGMENT_BYTES, file_ops=files)
    for n in range(60):
        log.append([{"n": n, "pad": "x" * 30}], timestamp_ms=n)
    return log


def test_retention_makes_the_new_start_durable_before_it_deletes_a_segment(tmp_path: pathlib.Path) -> None:
    files = RecordedFiles()
    with retained_log(tmp_path, files) as log:
        files.calls.clear()
        assert log.enforce_retention(now_ms=0) > 0
        first = log.first_offset
        # No prepared sync: on this thread, first.
        assert files.calls[:2] == [("datasync", "synced"), ("datasync", "synced.copy")]
        assert {call for call, _ in files.calls[2:]} == {"unlink"}
        assert synced_mark.read(str(tmp_path)).first == first
    log, report = SegmentLog.open(tmp_path, Retention(max_records=20), FsyncPolicy.ALWAYS, SEGMENT_BYTES)
    with log:
        assert report.clean and log.first_offset == first and log.damaged_ranges == []


def test_a_prepared_retention_sync_covers_only_what_had_expired_then(tmp_path: pathlib.Path) -> None:
    files = RecordedFiles()
    with retained_log(tmp_path, files) as log:
        before = sorted(os.listdir(tmp_path))
        sync = log.prepare_retention(now_ms=0)
        assert sync is not None
        start = synced_mark.read(str(tmp_path)).first
        assert start is not None and start > log.first_offset  # written, not yet synced,
        assert sorted(os.listdir(tmp_path)) == before  # and nothing deleted
        files.calls.clear()
        sync()  # what the broker runs on a worker thread
        assert files.calls == [("datasync", "synced"), ("datasync", "synced.copy")]
        for n in range(60, 100):  # more expires before retention goes on
            log.append([{"n": n, "pad": "x" * 30}], timestamp_ms=n)
        files.calls.clear()
        log.enforce_retention(now_ms=0)
        assert log.first_offset == start  # only the segments that sync covered
        assert "datasync" not in {call for call, _ in files.calls}  # no fsync on the log's thread
        log.enforce_retention(now_ms=0)  # the rest, syncing the mark itself
        assert log.first_offset > start and synced_mark.read(str(tmp_path)).first == log.first_offset


@pytest.mark.parametrize("prepared", [False, True], ids=["on-this-thread", "prepared"])
def test_retention_goes_on_if_the_mark_cannot_be_synced(tmp_path: pathlib.Path, prepared: bool) -> None:
    """On a full or failing disk retention is what frees space: a mark it cannot keep does not
    stop it (after an OS crash the deleted segments may then be reported as lost)."""
    faults = FaultyFiles()
    log, _ = SegmentLog.open(tmp_path, Retention(max_records=20), FsyncPolicy.ALWAYS, SEGMENT_BYTES, file_ops=faults)
    with log:
        for n in range(60):
            log.append([{"n": n, "pad": "x" * 30}], timestamp_ms=n)
        segments = written_segments(tmp_path)
        faults.fail("datasync", errno.EIO, suffix="synced")
        if prepared:
            sync = log.prepare_retention(now_ms=0)
            assert sync is not None
            with pytest.raises(OSError, match="Input/output error"):
                sync()
        assert log.enforce_retention(now_ms=0) > 0
        assert log.first_offset > 0 and len(written_segments(tmp_path)) < len(segments)
        assert ("datasync", errno.EIO) in faults.failed


def written_segments(directory: pathlib.Path) -> list[str]:
    return sorted(name for name in os.listdir(directory) if name.endswith(".log"))
