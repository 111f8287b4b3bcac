"""Reading a durable log back: every record, from any offset, of any size, exactly as appended,
decoded (``read_fields``) or as stored (``read_stored``: the bodies, not decoded).

A read takes whole 64 KiB chunks of a segment through one tight loop and falls back to a
frame-by-frame checked path for a frame larger than a chunk, a frame cut by the file's end,
or damage: these tests put frames across chunk boundaries, frames larger than a chunk, and
bytes damaged after the log was opened at each of those places.
"""

from __future__ import annotations

import os
import pathlib
import random
from typing import Any

import msgpack
import pytest

from rsnet.broker.storage import CorruptData, FsyncPolicy, MemoryLog, Retention, SegmentLog, TopicLog
from rsnet.broker.storage.records import frame
from rsnet.broker.storage.segments import READ_CHUNK

SIZES = [10, 700, 5_000, 40_000, READ_CHUNK - 20, READ_CHUNK + 1, 3 * READ_CHUNK]


def value(n: int, rng: random.Random) -> dict[str, Any]:
    """Mostly small records, now and then one of SIZES: frames land across every boundary."""
    size = rng.choice(SIZES) if rng.random() < 0.05 else rng.randrange(1, 200)
    return {"n": n, "pad": "x" * size}


def fill(directory: pathlib.Path, count: int, segment_bytes: int = 64 << 20) -> list[dict[str, Any]]:
    rng = random.Random(7)
    values = [value(n, rng) for n in range(count)]
    log, _ = SegmentLog.open(directory, Retention(), FsyncPolicy.NEVER, segment_bytes)
    with log:
        for start in range(0, count, 97):
            log.append(values[start : start + 97], timestamp_ms=1_000 + start, producer="p", first_sequence=start)
    return values


def read_fields(log: TopicLog, offset: int, count: int) -> list[list[Any]]:
    return log.read_fields(offset, count)


def read_stored(log: TopicLog, offset: int, count: int) -> list[list[Any]]:
    bodies = log.read_stored(offset, count)
    assert all(type(body) is bytes for body in bodies)
    return [msgpack.unpackb(body) for body in bodies]


READS = pytest.mark.parametrize("read", [read_fields, read_stored])


@READS
@pytest.mark.parametrize("segment_bytes", [64 << 20, 256 << 10], ids=["one segment", "many segments"])
def test_every_read_returns_the_records_appended_from_its_offset(
    tmp_path: pathlib.Path, segment_bytes: int, read: Any
) -> None:
    values = fill(tmp_path, 3_000, segment_bytes)
    log, _ = SegmentLog.open(tmp_path, Retention(), FsyncPolicy.NEVER, segment_bytes)
    with log:
        rng = random.Random(11)
        starts = [0, 1, 2_999, *rng.sample(range(3_000), 60)]
        for start in starts:
            for count in (1, 3, 64, 1024):
                fields = read(log, start, count)
                expected = values[start : start + count]
                assert [f[0] for f in fields] == list(range(start, start + len(expected)))
                assert [f[2] for f in fields] == expected
                assert [(f[3], f[4]) for f in fields] == [("p", start + i) for i in range(len(expected))]
        # and the whole log in reads of 1024, as a subscriber from the start reads it
        offset, seen = 0, []
        while offset < 3_000:
            fields = read(log, offset, 1024)
            seen += [f[2] for f in fields]
            offset += len(fields)
        assert seen == values


def test_a_memory_log_reads_the_same_records_stored_as_decoded() -> None:
    log = MemoryLog()
    values = [{"n": n, "pad": "x" * (n % 300)} for n in range(2_000)]
    log.append(values, timestamp_ms=5, producer="p", first_sequence=0)
    for start, count in ((0, 2_000), (1, 1), (1_999, 10), (700, 64)):
        assert read_stored(log, start, count) == log.read_fields(start, count)


def frame_of(log: SegmentLog, offset: int) -> tuple[str, int, int]:
    """(segment path, start, end) of the frame holding ``offset``, walked by length fields."""
    segment = next(s for s in reversed(log._segments) if s.base_offset <= offset)
    here, position = segment.locate(offset)
    data = pathlib.Path(segment.path).read_bytes()
    while here < offset:
        position += 8 + int.from_bytes(data[position : position + 4], "big")
        here += 1
    return segment.path, position, position + 8 + int.from_bytes(data[position : position + 4], "big")


@READS
@pytest.mark.parametrize("where", ["body", "length", "crc"])
def test_bytes_damaged_after_opening_end_a_read_before_them_and_name_the_offset(
    tmp_path: pathlib.Path, where: str, read: Any
) -> None:
    values = fill(tmp_path, 3_000)
    log, _ = SegmentLog.open(tmp_path, Retention(), FsyncPolicy.NEVER)
    with log:
        big = next(n for n, v in enumerate(values) if len(v["pad"]) > READ_CHUNK)
        for damaged in (1_500, big):  # a small frame in a chunk; a frame larger than a chunk
            path, start, end = frame_of(log, damaged)
            byte = {"body": start + 8 + (end - start - 8) // 2, "length": start + 1, "crc": start + 5}[where]
            fd = os.open(path, os.O_RDWR)
            try:
                original = os.pread(fd, 1, byte)
                os.pwrite(fd, bytes([original[0] ^ 0x40]), byte)
                first = max(0, damaged - 700)
                got: list[list[Any]] = []
                while len(got) < damaged - first:  # every record before the damage, in reads of 1024
                    fields = read(log, first + len(got), 1024)
                    assert fields, "a read before the damage returned nothing"
                    got += fields
                assert [f[2] for f in got[: damaged - first]] == values[first:damaged]
                assert len(got) == damaged - first  # and nothing from the damaged frame or after
                with pytest.raises(CorruptData, match=f"offset {damaged}"):
                    read(log, damaged, 10)
            finally:
                os.pwrite(fd, original, byte)
                os.close(fd)
            assert read(log, damaged, 1)[0][2] == values[damaged]  # repaired: readable again


@READS
def test_a_whole_frame_holding_the_wrong_offset_ends_a_read_there(tmp_path: pathlib.Path, read: Any) -> None:
    """A frame whose CRC holds but whose record is not the offset expected (what a bad hop or a
    writer's bug would leave): no read returns it, or any record after it, as another offset."""
    values = fill(tmp_path, 3_000)
    log, _ = SegmentLog.open(tmp_path, Retention(), FsyncPolicy.NEVER)
    with log:
        wrong = 1_234
        path, start, end = frame_of(log, wrong)
        body = pathlib.Path(path).read_bytes()[start + 8 : end]
        fields = msgpack.unpackb(body)
        forged = msgpack.packb([fields[0] + 1, *fields[1:]])  # the same length: offsets 1234, 1235 both take 3 bytes
        assert len(forged) == len(body)
        fd = os.open(path, os.O_RDWR)
        try:
            os.pwrite(fd, frame(forged), start)
        finally:
            os.close(fd)
        got = read(log, 1_000, 1024)
        assert [f[0] for f in got] == list(range(1_000, wrong))
        assert [f[2] for f in got] == values[1_000:wrong]
        with pytest.raises(CorruptData, match=f"offset {wrong + 1} where {wrong} was expected"):
            read(log, wrong, 5)
