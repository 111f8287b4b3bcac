"""SegmentLog sidecars (``NAME.idx``): written when a segment is sealed, used at open instead of
scanning it, and ignored (the segment scanned, with the same result) whenever they cannot be
trusted."""

from __future__ import annotations

import errno
import os
import pathlib
from typing import Any

import pytest

from rsnet.broker.storage import (
    FsyncPolicy,
    RecoveryReport,
    Retention,
    SegmentLog,
    StorageError,
    segment_file,
    sidecars,
)

SEGMENT_BYTES = 1024


def open_log(
    directory: pathlib.Path, retention: Retention | None = None, fsync: FsyncPolicy = FsyncPolicy.ALWAYS
) -> tuple[SegmentLog, RecoveryReport]:
    return SegmentLog.open(directory, retention or Retention(), fsync, SEGMENT_BYTES)


def files(directory: pathlib.Path, suffix: str) -> list[str]:
    return sorted(name for name in os.listdir(directory) if name.endswith(suffix))


def write(directory: pathlib.Path, count: int = 120, fsync: FsyncPolicy = FsyncPolicy.ALWAYS) -> None:
    """Records from several producers, timestamps that sometimes go backwards."""
    with open_log(directory, fsync=fsync)[0] as log:
        for n in range(count):
            producer = ("a", "b", "c")[n % 3] if n < count // 2 else "late"  # a, b, c only in sealed segments
            log.append(
                [{"n": n, "pad": "x" * 30}],
                timestamp_ms=1000 + n - 7 * (n % 5),
                producer=producer,
                first_sequence=10 * n,
            )


def state(log: SegmentLog) -> Any:
    """Everything a log shows, and its in-memory index, to compare two opens."""
    return (
        log.read(log.first_offset, 10**6),
        log.first_offset,
        log.next_offset,
        log.durable_offset,
        log.size_bytes,
        [log.offset_for_timestamp(t) for t in range(950, 1150, 3)],
        {p: log.last_sequence(p) for p in ("a", "b", "c", "late", "none")},
        [
            (
                s.path,
                s.base_offset,
                s.size,
                s.next_offset,
                s.max_timestamp,
                list(s._offsets),
                list(s._positions),
                list(s._maxima),
                s._indexed_at,
            )
            for s in log._segments
        ],
    )


def scanned_state(directory: pathlib.Path) -> Any:
    """The state a full scan gives (sidecars set aside, then put back)."""
    hidden = directory / "hidden"
    hidden.mkdir()
    for name in files(directory, ".idx"):
        os.rename(directory / name, hidden / name)
    try:
        log, report = open_log(directory)
        with log:
            assert report.sidecars_used == 0
            result = state(log)
    finally:
        for name in files(directory, ".idx"):  # written again by that open
            os.unlink(directory / name)
        for name in os.listdir(hidden):
            os.rename(hidden / name, directory / name)
        hidden.rmdir()
    return result


@pytest.fixture
def decodes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts records decoded by scans at open."""
    calls: list[int] = []
    real = segment_file.decode_fields

    def counting(body: Any) -> list[Any]:
        calls.append(1)
        return real(body)

    monkeypatch.setattr(segment_file, "decode_fields", counting)
    return calls


def test_every_sealed_segment_gets_a_sidecar_and_the_active_one_none(tmp_path: pathlib.Path) -> None:
    write(tmp_path)
    segments = files(tmp_path, ".log")
    assert len(segments) > 4
    assert files(tmp_path, ".idx") == [name[:-4] + ".idx" for name in segments[:-1]]
    assert not [name for name in os.listdir(tmp_path) if name.endswith(".tmp")]


def test_open_takes_sealed_segments_from_their_sidecars_and_scans_only_the_active_one(
    tmp_path: pathlib.Path, decodes: list[int]
) -> None:
    write(tmp_path)
    expected = scanned_state(tmp_path)
    decodes.clear()
    log, report = open_log(tmp_path)
    with log:
        segments = files(tmp_path, ".log")
        assert report.clean and report.sidecars_ignored == []
        assert report.sidecars_used == len(segments) - 1
        active = log._segments[-1]
        assert len(decodes) == active.records  # nothing of the sealed segments was decoded
        assert state(log) == expected
        assert log.append([{"n": 120}], timestamp_ms=2000) == [120]


@pytest.mark.parametrize("fsync", [FsyncPolicy.ALWAYS, FsyncPolicy.INTERVAL, FsyncPolicy.NEVER])
def test_sidecars_are_written_under_every_fsync_policy(tmp_path: pathlib.Path, fsync: FsyncPolicy) -> None:
    write(tmp_path, fsync=fsync)
    log, report = open_log(tmp_path, fsync=fsync)
    with log:
        assert report.sidecars_used == len(files(tmp_path, ".log")) - 1 and not report.sidecars_ignored


def flip(path: pathlib.Path, position: int) -> None:
    data = bytearray(path.read_bytes())
    data[position] ^= 0x40
    path.write_bytes(data)


def wrong_version(path: pathlib.Path) -> None:
    data = bytearray(path.read_bytes())
    data[8:12] = (99).to_bytes(4, "big")
    path.write_bytes(data)


SPOILERS = {
    "missing": (lambda path, other: os.unlink(path), "missing"),
    "flipped": (lambda path, other: flip(path, len(path.read_bytes()) - 5), "CRC mismatch"),
    "truncated": (lambda path, other: os.truncate(path, len(path.read_bytes()) // 2), "frame cut off"),
    "empty": (lambda path, other: os.truncate(path, 0), "not a sidecar"),
    "trailing bytes": (lambda path, other: path.write_bytes(path.read_bytes() + b"\0"), "bytes after its frame"),
    "unknown version": (lambda path, other: wrong_version(path), "sidecar format version 99"),
    "another segment's": (lambda path, other: path.write_bytes(other.read_bytes()), "not a segment starting at"),
}


@pytest.mark.parametrize("spoil", SPOILERS)
def test_an_unusable_sidecar_is_ignored_and_the_segment_scanned_with_the_same_result(
    tmp_path: pathlib.Path, spoil: str, decodes: list[int]
) -> None:
    write(tmp_path)
    expected = scanned_state(tmp_path)
    sidecars = files(tmp_path, ".idx")
    victim = sidecars[1]
    action, reason = SPOILERS[spoil]
    action(tmp_path / victim, tmp_path / sidecars[2])
    decodes.clear()
    log, report = open_log(tmp_path)
    with log:
        assert report.clean  # a sidecar is no record: ignoring one is not damage
        assert report.sidecars_used == len(sidecars) - 1
        assert len(report.sidecars_ignored) == 1
        assert report.sidecars_ignored[0].startswith(f"{victim}: ")
        assert reason in report.sidecars_ignored[0]
        assert report.sidecars_ignored[0].endswith(f"; scanned {victim[:-4]}.log instead")
        assert len(decodes) == log._segments[1].records + log._segments[-1].records
        assert state(log) == expected
    log, report = open_log(tmp_path)  # the scan wrote the sidecar again
    with log:
        assert report.sidecars_used == len(sidecars) and not report.sidecars_ignored
        assert state(log) == expected


def test_a_sidecar_for_a_segment_of_another_size_is_ignored(tmp_path: pathlib.Path) -> None:
    write(tmp_path)
    segments = files(tmp_path, ".log")
    second = tmp_path / segments[1]
    size = os.path.getsize(second)
    with open(second, "ab") as file:
        file.write(b"\0" * 16)  # what a power failure can leave: the size grew, the data never came
    log, report = open_log(tmp_path)
    with log:
        assert report.sidecars_ignored == [
            f"{segments[1][:-4]}.idx: says the segment is {size} bytes, but it is {size + 16}; scanned {segments[1]} instead"
        ]
        # Scanned exactly as without sidecars: the zeros follow its last record, no offset is
        # missing, so nothing is lost and the bytes are left in place.
        assert report.damaged == [
            f"{segments[1]}: bytes {size} to {size + 15} after its last record are not a record "
            "(impossible frame length 0); no offset is missing, the bytes are left in place"
        ]
        assert log.next_offset == 120 and [r.value["n"] for r in log.read(0, 200)] == list(range(120))
        # no sidecar for the changed segment: it is scanned (and reported) at every open
        assert segments[1][:-4] + ".idx" not in files(tmp_path, ".idx")


def test_a_sealed_segment_changed_in_place_is_scanned_despite_its_sidecar(tmp_path: pathlib.Path) -> None:
    """Same size, one bit flipped: the CRC the sidecar keeps of the whole segment catches it."""
    write(tmp_path)
    segments = files(tmp_path, ".log")
    flip(tmp_path / segments[1], os.path.getsize(tmp_path / segments[1]) - 5)
    log, report = open_log(tmp_path)
    with log:
        assert report.sidecars_ignored == [
            f"{segments[1][:-4]}.idx: the segment's bytes do not match the CRC-32 recorded when it was sealed; "
            f"scanned {segments[1]} instead"
        ]
        assert "CRC mismatch" in report.damaged[0]
        assert files(tmp_path, ".log") == segments  # only its last record is lost, as a damaged range
        assert [(d.first, d.end) for d in log.damaged_ranges] == [(int(segments[2][:-4]) - 1, int(segments[2][:-4]))]
        assert log.next_offset == 120


def test_an_unknown_segment_version_stops_the_open_even_with_a_sidecar(tmp_path: pathlib.Path) -> None:
    write(tmp_path)
    segments = files(tmp_path, ".log")
    for name in segments:  # as a newer rsnet leaves them (one version only under a later v1 is damage)
        wrong_version(tmp_path / name)
    before = {name: (tmp_path / name).read_bytes() for name in os.listdir(tmp_path) if name != "lock"}
    with pytest.raises(StorageError, match="format version 99"):
        open_log(tmp_path)
    assert {name: (tmp_path / name).read_bytes() for name in os.listdir(tmp_path) if name != "lock"} == before


def test_deduplication_survives_reopening_from_sidecars_alone(tmp_path: pathlib.Path, decodes: list[int]) -> None:
    """Producers a, b and c wrote only to sealed segments; their sequences come from the sidecars."""
    write(tmp_path)
    decodes.clear()
    log, report = open_log(tmp_path)
    with log:
        assert report.sidecars_used == len(files(tmp_path, ".log")) - 1
        first_active = log._segments[-1].base_offset
        assert first_active > 60 and len(decodes) == 120 - first_active
        assert (log.last_sequence("a"), log.last_sequence("b"), log.last_sequence("c")) == (570, 580, 590)
        assert log.append(["again"], timestamp_ms=0, producer="b", first_sequence=580) == [None]
        assert log.append(["again", "new"], timestamp_ms=0, producer="c", first_sequence=590) == [None, 120]
        assert log.last_sequence("late") == 1190


def test_deduplication_survives_retention_and_reopening_from_sidecars(tmp_path: pathlib.Path) -> None:
    write(tmp_path)
    with open_log(tmp_path, Retention(max_records=40))[0] as log:
        assert log.enforce_retention(now_ms=0) > 0 and log.first_offset > 60  # a, b and c's records are gone
    log, report = open_log(tmp_path)
    with log:
        assert report.sidecars_used == len(files(tmp_path, ".log")) - 1 > 0
        assert (log.last_sequence("a"), log.last_sequence("c"), log.last_sequence("late")) == (570, 590, 1190)
        assert log.append(["x"], timestamp_ms=0, producer="a", first_sequence=570) == [None]


def test_retention_deletes_sidecars_with_their_segments(tmp_path: pathlib.Path) -> None:
    write(tmp_path)
    with open_log(tmp_path, Retention(max_records=30))[0] as log:
        log.enforce_retention(now_ms=0)
        segments = files(tmp_path, ".log")
        assert files(tmp_path, ".idx") == [name[:-4] + ".idx" for name in segments[:-1]]
    with open_log(tmp_path, Retention(max_age_ms=1))[0] as log:  # everything: the active one is rolled first
        log.enforce_retention(now_ms=10**6)
        assert files(tmp_path, ".log") == ["00000000000000000120.log"]
        assert files(tmp_path, ".idx") == []


def test_stray_sidecars_and_temporaries_are_removed_at_open(tmp_path: pathlib.Path) -> None:
    write(tmp_path)
    segments = files(tmp_path, ".log")
    good = (tmp_path / files(tmp_path, ".idx")[0]).read_bytes()
    active_sidecar = tmp_path / (segments[-1][:-4] + ".idx")  # a roll cut short between sidecar and next segment
    active_sidecar.write_bytes(good)
    orphan = tmp_path / "00000000000000099999.idx"  # retention stopped between the two unlinks
    orphan.write_bytes(good)
    temporary = tmp_path / (segments[-1][:-4] + ".idx.tmp")
    temporary.write_bytes(b"rsnetidx")
    log, report = open_log(tmp_path)
    with log:
        assert report.clean and report.sidecars_used == len(segments) - 1
        assert files(tmp_path, ".idx") == [name[:-4] + ".idx" for name in segments[:-1]]
        assert not temporary.exists()


def test_a_sidecar_that_cannot_be_written_does_not_stop_the_log(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def disk_full(segment: Any) -> bytes:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(sidecars, "sidecar_bytes", disk_full)
    write(tmp_path)
    assert files(tmp_path, ".idx") == [] and not [n for n in os.listdir(tmp_path) if n.endswith(".tmp")]
    monkeypatch.undo()
    segments = files(tmp_path, ".log")
    log, report = open_log(tmp_path)
    with log:
        assert report.clean and report.sidecars_used == 0
        assert report.sidecars_ignored == [
            f"{name[:-4]}.idx: missing; scanned {name} instead" for name in segments[:-1]
        ]
        assert log.next_offset == 120
    assert files(tmp_path, ".idx") == [name[:-4] + ".idx" for name in segments[:-1]]  # written by that open


def test_a_segment_sealed_after_reopening_gets_a_correct_sidecar(tmp_path: pathlib.Path) -> None:
    """The active segment's CRC and producers are rebuilt at open, for the sidecar written when it rolls."""
    write(tmp_path, count=70)
    with open_log(tmp_path)[0] as log:
        for n in range(70, 140):
            log.append([{"n": n, "pad": "y" * 30}], timestamp_ms=n, producer="late", first_sequence=10 * n)
    expected = scanned_state(tmp_path)
    log, report = open_log(tmp_path)
    with log:
        assert report.sidecars_used == len(files(tmp_path, ".log")) - 1 and not report.sidecars_ignored
        assert state(log) == expected
