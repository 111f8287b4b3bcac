"""A topic log on disk: a directory of CRC-checked segment files, recovered by scanning at open.

Layout of a topic's directory::

    00000000000000000000.log      segments, named by their first offset (20 digits)
    00000000000000004711.log      the last one is the active segment, appended to
    00000000000000000000.idx      sidecar of a sealed segment (all but the active one), see below
    lock                          held (flock) while a SegmentLog has the directory open

Other files (a cursor store, for instance) are left alone. A segment file is::

    b"rsnetlog" | version (u32, big-endian, = 1)
    header frame: {"base_offset": int, "producers": {producer id: highest sequence}}
    record frame, record frame, ...        (frames and record bodies: see records.py)

The header carries the producers' sequences as they were when the segment was created, so
idempotency survives both restarts and retention: when older segments are deleted, the
first remaining segment's header still knows every producer they held. A new segment is
written to ``NAME.log.tmp``, synced and renamed into place, so a segment file that exists
always has a whole header.

Rolling: a batch goes to the active segment while it fits in ``segment_bytes``; the next
record that does not fit starts a new segment (a segment holds at least one record, even
one larger than ``segment_bytes``). A batch may span segments.

Index: each segment keeps, in memory, one entry per ``INDEX_INTERVAL_BYTES`` of records
(offset, file position, highest timestamp so far), built while scanning at open and while
appending. A read seeks to the entry at or before its offset and scans forward from there.

Sidecars: when a segment is sealed (``_roll``), what scanning it at open would rebuild is
written next to it as ``NAME.idx`` (temporary, fsynced unless NEVER, renamed) before the next
segment is created, so every sealed segment normally has one::

    b"rsnetidx" | version (u32, big-endian, = 1)
    frame (length, CRC-32, msgpack map; see records.py), nothing after it:
      base_offset, next_offset   the segment's records are base_offset .. next_offset-1
      size, crc                  the segment file's byte length and CRC-32 of all of it
      max_timestamp              highest record timestamp (retention by age, offset_for_timestamp)
      sequences                  {producer: highest sequence among this segment's records}
      index                      bin: the sparse index, (offset, position, highest timestamp so
                                 far) as three big-endian int64 per entry

At open a sealed segment is taken from its sidecar only if the sidecar is whole (magic,
version, CRC, well-formed fields) and the segment file has exactly ``size`` bytes with
exactly ``crc``: it is read through once for the CRC (gigabytes per second) but no record
is decoded. Otherwise (missing, damaged, unknown version, size or CRC mismatch) it is scanned
as if sidecars did not exist, and ``RecoveryReport.sidecars_ignored`` says why; a sealed
segment scanned cleanly gets its sidecar written again. The active segment is always
scanned. A sidecar therefore never changes what recovery keeps, only how fast it gets there.
Sequences are per segment, as a scan finds them, and combined at open as before (the first
segment's header, then each segment's). Open removes every sidecar that is not of a kept
sealed segment; retention deletes a segment's sidecar just before the segment.

Recovery, at open, is described in the package docstring; the rules in short: the log is
the longest run of contiguous, well-formed records from the start of the first segment;
anything damaged ends it, and everything from the damage on is removed and reported.

This module imports the standard library and this package only.
"""

from __future__ import annotations

import bisect
import collections
import dataclasses
import fcntl
import operator
import os
import re
import struct
import sys
import zlib
from array import array
from collections.abc import Iterator

import msgpack

from .files import datasync, sync_directory, write_all
from .log import CorruptData, FsyncPolicy, LogFailed, Retention, StorageError, TopicLog
from .records import FRAME_HEAD, BadRecord, Record, check_frame, decode_fields, decode_record, frame, unpack

MAGIC = b"rsnetlog"
FORMAT_VERSION = 1
PREAMBLE = struct.Struct(">8sI")
"""Magic and format version, the first bytes of every segment file."""

DEFAULT_SEGMENT_BYTES = 64 << 20
INDEX_INTERVAL_BYTES = 4096
"""Bytes of records between two index entries: a read scans at most about this much first."""
READ_CHUNK = 64 << 10
SCAN_CHUNK = 1 << 20
OPEN_SEALED_SEGMENTS = 8
"""File descriptors kept open for reading sealed segments, per log (least recently used go)."""

SEGMENT_NAME = re.compile(r"(\d{20})\.log")
SIDECAR_NAME = re.compile(r"(\d{20})\.idx")
TEMPORARY_NAME = re.compile(r"\d{20}\.(log|idx)\.tmp")
LOCK_NAME = "lock"
NO_TIMESTAMP = -(2**63) - 1  # below every timestamp: the highest timestamp of an empty segment


SIDECAR_MAGIC = b"rsnetidx"
SIDECAR_VERSION = 1
SIDECAR_KEYS = frozenset({"base_offset", "next_offset", "size", "crc", "max_timestamp", "sequences", "index"})
INDEX_ENTRY = struct.Struct(">qqq")
"""One sparse index entry in a sidecar: offset, file position, highest timestamp so far."""


def segment_name(base_offset: int) -> str:
    return f"{base_offset:020d}.log"


def sidecar_name(base_offset: int) -> str:
    return f"{base_offset:020d}.idx"


@dataclasses.dataclass
class RecoveryReport:
    """What opening a :class:`SegmentLog` found and did."""

    segments: int
    """Segment files the log has after recovery."""
    records: int
    """Records kept."""
    truncated_bytes: int
    """Bytes removed because they were damaged or followed damage (0 after a clean shutdown)."""
    damaged: list[str] = dataclasses.field(default_factory=list)
    """One line per problem: which segment, at which byte and offset, what was wrong, what was removed."""
    sidecars_used: int = 0
    """Sealed segments taken from their sidecar (``.idx``) after checking, instead of scanned."""
    sidecars_ignored: list[str] = dataclasses.field(default_factory=list)
    """One line per sealed segment scanned because its sidecar was missing or unusable, and why.
    Not damage: the segment was scanned as it would have been without sidecars."""

    @property
    def clean(self) -> bool:
        return not self.damaged


class SegmentLog(TopicLog):
    """A :class:`TopicLog` stored in a directory of segment files; see :meth:`open`."""

    def __init__(self, directory: str, retention: Retention, fsync: FsyncPolicy, segment_bytes: int) -> None:
        """Use :meth:`open`, which recovers the directory's contents."""
        super().__init__(retention)
        self.directory = directory
        self.fsync = fsync
        self.segment_bytes = segment_bytes
        self._segments: list[_Segment] = []
        self._bases: list[int] = []  # base offsets of _segments, for bisect
        self._active_fd = -1
        self._readers: collections.OrderedDict[_Segment, int] = collections.OrderedDict()
        self._lock_fd = -1
        self._synced_offset = 0  # every record below this has been fsynced
        self._directory_synced = True
        self._failure: BaseException | None = None

    @classmethod
    def open(
        cls,
        directory: str | os.PathLike[str],
        retention: Retention | None = None,
        fsync: FsyncPolicy = FsyncPolicy.ALWAYS,
        segment_bytes: int = DEFAULT_SEGMENT_BYTES,
    ) -> tuple[SegmentLog, RecoveryReport]:
        """Open (creating if needed) the log in ``directory``; recover it; report what was found.

        Raises :class:`StorageError` if another SegmentLog (in any process) has the directory
        open, or if a segment has a format version this code does not know: such a segment is
        left untouched. Recovery makes everything it keeps durable unless ``fsync`` is NEVER.
        """
        if not isinstance(fsync, FsyncPolicy):
            raise TypeError(f"fsync must be a FsyncPolicy, not {fsync!r}")
        if type(segment_bytes) is not int or segment_bytes <= 0:
            raise ValueError(f"segment_bytes must be a positive int, not {segment_bytes!r}")
        directory = os.path.abspath(os.fspath(directory))
        log = cls(directory, retention if retention is not None else Retention(), fsync, segment_bytes)
        try:
            if not os.path.isdir(directory):
                os.makedirs(directory, exist_ok=True)
                if fsync is not FsyncPolicy.NEVER:
                    sync_directory(os.path.dirname(directory))
            log._lock()
            report = log._recover()
        except BaseException:
            log._release()
            raise
        return log, report

    # -- TopicLog -----------------------------------------------------------------------------

    def sync(self) -> None:
        self._check_usable()
        if self._synced_offset < self._next_offset:
            for segment in self._segments:
                if segment.next_offset > self._synced_offset:
                    if segment is self._active:
                        self._fsync(self._active_fd)
                    else:
                        fd = os.open(segment.path, os.O_RDONLY | os.O_CLOEXEC)
                        try:
                            self._fsync(fd)
                        finally:
                            os.close(fd)
            self._synced_offset = self._next_offset
        if not self._directory_synced:
            self._sync_directory()
        self._durable_offset = self._next_offset

    def enforce_retention(self, now_ms: int) -> int:
        """Delete every segment whose records have all expired; return how many records went.

        Segments go oldest first. When every record has expired (only age can do that), the
        active segment is rolled first, so the log is left empty at the same ``next_offset``.
        """
        self._check_usable()
        retention = self.retention
        expired = 0
        bytes_after = self._size_bytes
        for segment in self._segments:
            bytes_after -= segment.size
            if not (
                (retention.max_records is not None and self._next_offset - segment.next_offset >= retention.max_records)
                or (retention.max_bytes is not None and bytes_after >= retention.max_bytes)
                or (
                    retention.max_age_ms is not None
                    and segment.records
                    and segment.max_timestamp < now_ms - retention.max_age_ms
                )
            ):
                break
            expired += 1
        if not expired:
            return 0
        if expired == len(self._segments):
            self._roll()
        dropped = 0
        for _ in range(expired):
            segment = self._segments[0]
            self._forget_reader(segment)
            _unlink_if_present(_sidecar_path(segment.path))  # first: a crash between leaves no orphan
            os.unlink(segment.path)
            del self._segments[0]
            del self._bases[0]
            self._size_bytes -= segment.size
            self._first_offset = self._segments[0].base_offset
            dropped += segment.records
        return dropped

    def close(self) -> None:
        if self._closed:
            return
        try:
            if self.fsync is not FsyncPolicy.NEVER and self._failure is None:
                self.sync()
        finally:
            self._closed = True
            self._release()

    # -- storing --------------------------------------------------------------------------------

    @property
    def _active(self) -> _Segment:
        return self._segments[-1]

    def _store(self, frames: list[bytes], timestamp_ms: int, producer: str | None, first_sequence: int | None) -> None:
        start = 0
        while start < len(frames):
            segment = self._active
            if segment.records and segment.size + len(frames[start]) > self.segment_bytes:
                self._roll()
                segment = self._active
            end = start + 1
            size = segment.size + len(frames[start])
            while end < len(frames) and size + len(frames[end]) <= self.segment_bytes:
                size += len(frames[end])
                end += 1
            self._write(segment, frames[start:end], timestamp_ms)
            if first_sequence is not None:
                assert producer is not None
                segment.sequences[producer] = first_sequence + end - 1
            self._stored(end - start, producer, None if first_sequence is None else first_sequence + end - 1)
            start = end
        if self.fsync is FsyncPolicy.ALWAYS:
            self.sync()
        elif self.fsync is FsyncPolicy.NEVER:
            self._durable_offset = self._next_offset

    def _write(self, segment: _Segment, frames: list[bytes], timestamp_ms: int) -> None:
        data = b"".join(frames)
        try:
            write_all(self._active_fd, data)
        except OSError as exc:
            # Cut off whatever part was written, or the next record would follow garbage.
            try:
                os.ftruncate(self._active_fd, segment.size)
            except OSError:
                self._failure = exc
            raise
        position = segment.size
        for one in frames:
            segment.add(position, timestamp_ms, len(one))
            position += len(one)
        if segment.crc is not None:
            segment.crc = zlib.crc32(data, segment.crc)
        self._size_bytes += len(data)

    def _roll(self) -> None:
        """Seal the active segment (synced unless NEVER), write its sidecar, and start a new
        one at ``next_offset``: a segment with a later one after it is sealed."""
        if self.fsync is not FsyncPolicy.NEVER and self._synced_offset < self._next_offset:
            self._fsync(self._active_fd)
            self._synced_offset = self._next_offset
            self._durable_offset = self._next_offset
        old = self._active
        self._write_sidecar(old)
        segment, fd = self._create_segment(self._next_offset)
        old.sequences = {}  # only its sidecar needed them (kept until sealed, in case creating failed)
        self._readers[old] = self._active_fd
        self._trim_readers()
        self._segments.append(segment)
        self._bases.append(segment.base_offset)
        self._size_bytes += segment.size
        self._active_fd = fd

    def _create_segment(self, base_offset: int) -> tuple[_Segment, int]:
        """Write a new segment file (header only) and open it for appending."""
        path = os.path.join(self.directory, segment_name(base_offset))
        header = PREAMBLE.pack(MAGIC, FORMAT_VERSION) + frame(
            msgpack.packb({"base_offset": base_offset, "producers": self._producers}, use_bin_type=True)
        )
        temporary = path + ".tmp"
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        try:
            write_all(fd, header)
            if self.fsync is not FsyncPolicy.NEVER:
                self._fsync(fd)
        finally:
            os.close(fd)
        os.replace(temporary, path)
        if self.fsync is FsyncPolicy.NEVER:
            self._directory_synced = False
        else:
            self._sync_directory()
        fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CLOEXEC)
        segment = _Segment(path, base_offset, len(header))
        segment.crc = zlib.crc32(header)
        return segment, fd

    def _write_sidecar(self, segment: _Segment) -> None:
        """Write ``segment``'s sidecar (temporary, synced unless NEVER, renamed into place).

        Best effort: the sidecar only saves the next open a scan, so a failure to write it
        (a full disk, say) leaves no sidecar and is not an error of the log. The directory
        entry is synced with the next segment's, which ``_roll`` creates right after.
        """
        if segment.crc is None or not segment.records:
            return
        path = _sidecar_path(segment.path)
        temporary = path + ".tmp"
        try:
            fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
            try:
                write_all(fd, _sidecar_bytes(segment))
                if self.fsync is not FsyncPolicy.NEVER:
                    datasync(fd)
            finally:
                os.close(fd)
            os.replace(temporary, path)
        except OSError:
            _unlink_if_present(temporary, quiet=True)
            _unlink_if_present(path, quiet=True)  # never leave an older sidecar in its place

    def _fsync(self, fd: int) -> None:
        try:
            datasync(fd)
        except OSError as exc:
            self._failure = exc
            raise

    def _sync_directory(self) -> None:
        try:
            sync_directory(self.directory)
        except OSError as exc:
            self._failure = exc
            raise
        self._directory_synced = True

    def _check_usable(self) -> None:
        self._check_open()
        if self._failure is not None:
            raise LogFailed(
                f"{self.directory}: an earlier write or fsync failed ({self._failure}); reopen the log"
            ) from self._failure

    # -- reading --------------------------------------------------------------------------------

    def _read(self, offset: int, count: int) -> list[Record]:
        records: list[Record] = []
        index = bisect.bisect_right(self._bases, offset) - 1
        while len(records) < count:
            segment = self._segments[index]
            start_offset, position = segment.locate(offset)
            records.extend(self._records(segment, start_offset, position, offset, count - len(records)))
            offset = segment.next_offset
            index += 1
        return records

    def _offset_for_timestamp(self, timestamp_ms: int) -> int:
        for segment in self._segments:
            if segment.records and segment.max_timestamp >= timestamp_ms:
                break
        else:
            return self._next_offset
        start_offset, position = segment.locate_timestamp(timestamp_ms)
        for record in self._records(segment, start_offset, position, start_offset, segment.records):
            if record.timestamp_ms >= timestamp_ms:
                return record.offset
        raise AssertionError("a segment's highest timestamp is not in it")  # pragma: no cover

    def _records(self, segment: _Segment, offset: int, position: int, wanted: int, count: int) -> Iterator[Record]:
        """Up to ``count`` records of ``segment`` from offset ``wanted`` on, scanning from
        ``offset`` at file ``position``; raises CorruptData for a record that fails its check."""
        fd = self._reader(segment)
        # A read lands within INDEX_INTERVAL_BYTES of the record it wants: read that first.
        first_chunk = 2 * INDEX_INTERVAL_BYTES if count < 64 else READ_CHUNK
        offset, skip = wanted, wanted - offset
        produced = 0
        try:
            # The loop rebinds ``position`` on purpose: the except clause names the failing frame's.
            frames = _frames(fd, position, segment.size, READ_CHUNK, first_chunk, skip)
            for position, body in frames:  # noqa: B007 - read in the except clause below
                record = decode_record(body)
                if record.offset != offset:
                    raise BadRecord(f"record holds offset {record.offset} where {offset} was expected")
                yield record
                produced += 1
                offset += 1
                if produced == count or offset == segment.next_offset:
                    return
        except BadRecord as exc:
            raise CorruptData(segment.path, position, f"(offset {offset}) {exc}") from None
        raise CorruptData(segment.path, segment.size, f"the file ends before offset {offset}")

    def _reader(self, segment: _Segment) -> int:
        if segment is self._active:
            return self._active_fd
        fd = self._readers.get(segment)
        if fd is None:
            fd = os.open(segment.path, os.O_RDONLY | os.O_CLOEXEC)
            self._readers[segment] = fd
            self._trim_readers()
        else:
            self._readers.move_to_end(segment)
        return fd

    def _trim_readers(self) -> None:
        while len(self._readers) > OPEN_SEALED_SEGMENTS:
            _, fd = self._readers.popitem(last=False)
            os.close(fd)

    def _forget_reader(self, segment: _Segment) -> None:
        fd = self._readers.pop(segment, None)
        if fd is not None:
            os.close(fd)

    # -- opening --------------------------------------------------------------------------------

    def _lock(self) -> None:
        self._lock_fd = os.open(os.path.join(self.directory, LOCK_NAME), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise StorageError(f"{self.directory} is already open (by this or another process)") from None

    def _release(self) -> None:
        for fd in [self._active_fd, *self._readers.values(), self._lock_fd]:
            if fd >= 0:
                os.close(fd)
        self._active_fd = self._lock_fd = -1
        self._readers.clear()

    def _recover(self) -> RecoveryReport:
        """Scan every segment, decide what to keep, then (and only then) change the files."""
        names = sorted(os.listdir(self.directory))
        temporaries = [name for name in names if TEMPORARY_NAME.fullmatch(name)]
        sidecars = [name for name in names if SIDECAR_NAME.fullmatch(name)]
        names = [name for name in names if SEGMENT_NAME.fullmatch(name)]
        damaged: list[str] = []
        ignored: list[str] = []  # sealed segments scanned although they might have had a sidecar
        trusted = 0
        kept: list[_Scan] = []
        before_gap: list[_Scan] = []  # dropped: offsets are missing after them
        after_damage: list[str] = []  # dropped: they follow damage (or are the damage)
        restart_at = int(names[0][:20]) if names else 0  # where the log starts if nothing is kept
        for index, name in enumerate(names):
            base = int(name[:20])
            if kept and base != kept[-1].segment.next_offset:
                end = kept[-1].segment.next_offset
                if base < end:
                    damaged.append(
                        f"{name}: starts at offset {base}, inside the previous segment (which ends before {end})"
                    )
                    after_damage = names[index:]
                    break
                damaged.append(
                    f"{_names(kept)}: removed (offsets {kept[0].base_offset} to {end - 1}) because offsets {end} "
                    f"to {base - 1} are missing before {name}: an interrupted retention, or a segment deleted by hand"
                )
                before_gap.extend(kept)
                kept = []
            path = os.path.join(self.directory, name)
            scan = None
            if index < len(names) - 1:  # sealed (the last segment, the active one, is always scanned)
                scan, why = _trust(path, base)
                if scan is None:
                    ignored.append(f"{sidecar_name(base)}: {why}; scanned {name} instead")
                else:
                    trusted += 1
            if scan is None:
                scan = _scan(path, base)
            if scan.header_problem is not None:
                damaged.append(f"{name}: {scan.header_problem}")
                after_damage = names[index:]
                if not kept:
                    restart_at = base
                break
            kept.append(scan)
            if scan.problem is not None:
                damaged.append(
                    f"{name}: at byte {scan.valid_bytes} (offset {scan.segment.next_offset}): {scan.problem}; "
                    f"removed {scan.file_bytes - scan.valid_bytes} bytes from there to the end of the segment"
                )
                after_damage = names[index + 1 :]
                break
        after_damage_bytes = sum(os.stat(os.path.join(self.directory, name)).st_size for name in after_damage)
        if after_damage:
            damaged.append(
                f"removed {len(after_damage)} segment file(s), {after_damage_bytes} bytes, from the damage on: "
                + ", ".join(after_damage)
            )
        if not kept and names:
            damaged.append(
                f"the log restarts empty at offset {restart_at}; the producers' sequences stored before it are lost"
            )
        removed_bytes = (
            sum(scan.file_bytes for scan in before_gap)
            + sum(scan.file_bytes - scan.valid_bytes for scan in kept)
            + after_damage_bytes
        )

        # Change the files: drop what follows damage (newest first) before cutting the damaged
        # segment, so that a crash in between cannot leave a cut segment followed by stale ones.
        for name in reversed(after_damage):
            os.unlink(os.path.join(self.directory, name))
        for scan in before_gap:
            os.unlink(scan.path)
        for name in temporaries:
            os.unlink(os.path.join(self.directory, name))
        # Only sealed segments that are kept may have a sidecar: not the active one (its sidecar
        # is from a roll cut short, or stale), nor removed segments, nor ones already gone.
        sealed = {scan.base_offset for scan in kept[:-1]}
        stale = [name for name in sidecars if int(name[:20]) not in sealed]
        for name in stale:
            os.unlink(os.path.join(self.directory, name))
        if after_damage or before_gap or temporaries or stale:
            sync_directory(self.directory)
        if kept and kept[-1].valid_bytes < kept[-1].file_bytes:
            fd = os.open(kept[-1].path, os.O_WRONLY | os.O_CLOEXEC)
            try:
                os.ftruncate(fd, kept[-1].valid_bytes)
                datasync(fd)
            finally:
                os.close(fd)

        self._segments = [scan.segment for scan in kept]
        self._bases = [segment.base_offset for segment in self._segments]
        if kept:
            self._producers = dict(kept[0].header_producers)
            for scan in kept:
                self._producers.update(scan.sequences)
            self._first_offset = kept[0].base_offset
            self._next_offset = kept[-1].segment.next_offset
            if self.fsync is not FsyncPolicy.NEVER:
                for segment in self._segments:  # what a killed process left in the page cache
                    fd = os.open(segment.path, os.O_RDONLY | os.O_CLOEXEC)
                    try:
                        datasync(fd)
                    finally:
                        os.close(fd)
            self._active_fd = os.open(self._active.path, os.O_RDWR | os.O_APPEND | os.O_CLOEXEC)
            for scan in kept:
                if not scan.from_sidecar:  # its CRC, for the sidecar written when it is sealed
                    scan.segment.crc = _file_crc(
                        self._active_fd if scan is kept[-1] else None, scan.path, scan.valid_bytes
                    )
            self._active.sequences = dict(kept[-1].sequences)
            for scan in kept[:-1]:
                if not scan.from_sidecar:  # sealed but scanned: give it a sidecar for next time
                    scan.segment.sequences = scan.sequences
                    self._write_sidecar(scan.segment)
                    scan.segment.sequences = {}
        else:
            self._first_offset = self._next_offset = restart_at
            segment, self._active_fd = self._create_segment(restart_at)
            self._segments = [segment]
            self._bases = [restart_at]
        self._durable_offset = self._synced_offset = self._next_offset
        self._size_bytes = sum(segment.size for segment in self._segments)
        return RecoveryReport(
            segments=len(self._segments),
            records=self._next_offset - self._first_offset,
            truncated_bytes=removed_bytes,
            damaged=damaged,
            sidecars_used=trusted,
            sidecars_ignored=ignored,
        )


class _Segment:
    """One segment file's place in the log and its sparse index (in memory)."""

    __slots__ = (
        "_indexed_at",
        "_maxima",
        "_offsets",
        "_positions",
        "base_offset",
        "crc",
        "max_timestamp",
        "next_offset",
        "path",
        "sequences",
        "size",
    )

    def __init__(self, path: str, base_offset: int, header_bytes: int) -> None:
        self.path = path
        self.base_offset = base_offset
        self.size = header_bytes  # bytes of the file that hold the header and whole records
        self.next_offset = base_offset
        self.max_timestamp = NO_TIMESTAMP
        self.crc: int | None = None  # CRC-32 of the file's first ``size`` bytes, None if unknown
        self.sequences: dict[str, int] = {}  # highest per producer in its records (active segment only)
        self._offsets = array("q")
        self._positions = array("q")
        self._maxima = array("q")  # highest timestamp up to and including the entry's record
        self._indexed_at = -INDEX_INTERVAL_BYTES

    @property
    def records(self) -> int:
        return self.next_offset - self.base_offset

    def add(self, position: int, timestamp_ms: int, length: int) -> None:
        """The record with offset ``next_offset`` is at ``position``, ``length`` bytes long."""
        if timestamp_ms > self.max_timestamp:
            self.max_timestamp = timestamp_ms
        if position - self._indexed_at >= INDEX_INTERVAL_BYTES:
            self._offsets.append(self.next_offset)
            self._positions.append(position)
            self._maxima.append(self.max_timestamp)
            self._indexed_at = position
        self.next_offset += 1
        self.size = position + length

    def locate(self, offset: int) -> tuple[int, int]:
        """(offset, position) of the indexed record at or before ``offset``."""
        entry = bisect.bisect_right(self._offsets, offset) - 1
        return self._offsets[entry], self._positions[entry]

    def locate_timestamp(self, timestamp_ms: int) -> tuple[int, int]:
        """(offset, position) of an indexed record at or before the first with a timestamp >= t."""
        entry = max(bisect.bisect_left(self._maxima, timestamp_ms) - 1, 0)
        return self._offsets[entry], self._positions[entry]


@dataclasses.dataclass
class _Scan:
    """What scanning one segment file found."""

    path: str
    base_offset: int
    file_bytes: int
    segment: _Segment = None  # type: ignore[assignment]  # left None when the header is unreadable
    header_problem: str | None = None
    header_producers: dict[str, int] = dataclasses.field(default_factory=dict)
    sequences: dict[str, int] = dataclasses.field(default_factory=dict)  # highest per producer in the records
    problem: str | None = None  # what ended the valid records early
    valid_bytes: int = 0
    from_sidecar: bool = False  # taken from its checked sidecar, not scanned

    @property
    def name(self) -> str:
        return os.path.basename(self.path)


def _scan(path: str, base_offset: int) -> _Scan:
    """Read a segment file through; the valid records end at the first damaged one.

    Raises StorageError, changing nothing, for a format version this code does not know.
    """
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        scan = _Scan(path, base_offset, os.fstat(fd).st_size)
        frames = _read_header(fd, scan)
        if frames is None:
            return scan
        segment = scan.segment
        sequences = scan.sequences
        try:
            for position, body in frames:
                offset, timestamp_ms, _, producer, sequence = decode_fields(body)
                if offset != segment.next_offset:
                    raise BadRecord(f"record holds offset {offset} where {segment.next_offset} was expected")
                segment.add(position, timestamp_ms, FRAME_HEAD.size + len(body))
                if sequence is not None:
                    sequences[producer] = sequence
        except BadRecord as exc:
            scan.problem = str(exc)
        scan.valid_bytes = segment.size
        return scan
    finally:
        os.close(fd)


def _read_header(fd: int, scan: _Scan) -> Iterator[tuple[int, memoryview]] | None:
    """Check the segment's preamble and header; then ``scan.segment`` holds no records yet and
    the frames after the header are returned. None (and ``scan.header_problem`` set) if the
    header is unreadable. Raises StorageError for a format version this code does not know."""
    path, base_offset = scan.path, scan.base_offset
    preamble = os.pread(fd, PREAMBLE.size, 0)
    if len(preamble) < PREAMBLE.size or not preamble.startswith(MAGIC):
        if MAGIC.startswith(preamble[: len(MAGIC)]):
            scan.header_problem = f"header cut off at byte {len(preamble)}"
        else:
            scan.header_problem = "not a segment file (wrong magic bytes at byte 0)"
        return None
    _, version = PREAMBLE.unpack(preamble)
    if version != FORMAT_VERSION:
        raise StorageError(
            f"{path}: segment format version {version}, but this rsnet reads version {FORMAT_VERSION}; "
            "nothing was changed"
        )
    frames = _frames(fd, PREAMBLE.size, scan.file_bytes, SCAN_CHUNK)
    try:
        _, body = next(frames)
        try:
            header = unpack(body)
        except Exception as exc:  # any decoder failure: the checked bytes are not a header
            raise BadRecord(f"header is not msgpack: {exc}") from None
        if not (
            isinstance(header, dict)
            and header.get("base_offset") == base_offset
            and isinstance(header.get("producers"), dict)
            and all(type(k) is str and type(v) is int for k, v in header["producers"].items())
        ):
            raise BadRecord(f"header does not describe a segment starting at offset {base_offset}")
    except StopIteration:
        scan.header_problem = f"header cut off at byte {PREAMBLE.size}"
        return None
    except BadRecord as exc:
        scan.header_problem = f"header at byte {PREAMBLE.size}: {exc}"
        return None
    scan.header_producers = header["producers"]
    scan.segment = _Segment(path, base_offset, PREAMBLE.size + FRAME_HEAD.size + len(body))
    return frames


# -- sidecars ---------------------------------------------------------------------------------------


def _sidecar_path(segment_path: str) -> str:
    return segment_path[: -len(".log")] + ".idx"


def _sidecar_bytes(segment: _Segment) -> bytes:
    """The sidecar of a sealed segment (see the module docstring for the format)."""
    entries = array("q", bytes(INDEX_ENTRY.size * len(segment._offsets)))
    entries[0::3] = segment._offsets
    entries[1::3] = segment._positions
    entries[2::3] = segment._maxima
    if sys.byteorder == "little":
        entries.byteswap()
    body = msgpack.packb(
        {
            "base_offset": segment.base_offset,
            "next_offset": segment.next_offset,
            "size": segment.size,
            "crc": segment.crc,
            "max_timestamp": segment.max_timestamp,
            "sequences": segment.sequences,
            "index": entries.tobytes(),
        },
        use_bin_type=True,
    )
    return PREAMBLE.pack(SIDECAR_MAGIC, SIDECAR_VERSION) + frame(body)


def _parse_sidecar(data: bytes, base_offset: int) -> dict:
    """The checked contents of a sidecar; raises BadRecord saying what is wrong with it."""
    if len(data) < PREAMBLE.size or not data.startswith(SIDECAR_MAGIC):
        raise BadRecord(f"not a sidecar (cut off or wrong magic bytes; {len(data)} bytes)")
    _, version = PREAMBLE.unpack_from(data)
    if version != SIDECAR_VERSION:
        raise BadRecord(f"sidecar format version {version}, but this rsnet reads version {SIDECAR_VERSION}")
    body = check_frame(data, PREAMBLE.size)
    if PREAMBLE.size + FRAME_HEAD.size + len(body) != len(data):
        raise BadRecord(f"{len(data) - PREAMBLE.size - FRAME_HEAD.size - len(body)} bytes after its frame")
    try:
        facts = unpack(body)
    except Exception as exc:
        raise BadRecord(f"body is not msgpack: {exc}") from None
    if not (isinstance(facts, dict) and facts.keys() == SIDECAR_KEYS):
        raise BadRecord("body does not have the sidecar's fields")
    ints = ("base_offset", "next_offset", "size", "crc", "max_timestamp")
    if not (
        all(type(facts[key]) is int for key in ints)
        and type(facts["index"]) is bytes
        and isinstance(facts["sequences"], dict)
        and all(type(k) is str and type(v) is int and v >= 0 for k, v in facts["sequences"].items())
    ):
        raise BadRecord("fields have the wrong types")
    if facts["base_offset"] != base_offset or facts["next_offset"] <= base_offset:
        raise BadRecord(
            f"describes offsets {facts['base_offset']} to {facts['next_offset'] - 1}, not a segment starting at {base_offset}"
        )
    index = facts["index"]
    if not index or len(index) % INDEX_ENTRY.size:
        raise BadRecord(f"index of {len(index)} bytes is not whole entries")
    entries = array("q", index)
    if sys.byteorder == "little":
        entries.byteswap()
    offsets, positions, maxima = entries[0::3], entries[1::3], entries[2::3]
    if not (
        offsets[0] == base_offset
        and offsets[-1] < facts["next_offset"]
        and positions[-1] < facts["size"]
        and maxima[-1] <= facts["max_timestamp"]
        and all(map(operator.lt, offsets, offsets[1:]))
        and all(map(operator.lt, positions, positions[1:]))
        and all(map(operator.le, maxima, maxima[1:]))
    ):
        raise BadRecord("index entries out of order or out of the segment")
    facts["index"] = (offsets, positions, maxima)
    return facts


def _trust(path: str, base_offset: int) -> tuple[_Scan | None, str]:
    """What scanning the sealed segment at ``path`` would find, taken from its sidecar; or
    (None, why not) if the sidecar is missing, damaged, or does not match the segment.

    The sidecar is used only if the segment file is exactly as it was when sealed: the same
    size and the same CRC-32 over every byte (read through, but not decoded). A segment
    changed since (bit rot, a hand edit, a write lost in a power failure under NEVER) is
    scanned, so the sidecar never changes what recovery keeps. Raises StorageError, like
    ``_scan``, for a segment format version this code does not know.
    """
    try:
        with open(_sidecar_path(path), "rb") as file:
            data = file.read()
    except FileNotFoundError:
        return None, "missing"
    except OSError as exc:
        return None, f"unreadable ({exc})"
    try:
        facts = _parse_sidecar(data, base_offset)
    except BadRecord as exc:
        return None, str(exc)
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        scan = _Scan(path, base_offset, os.fstat(fd).st_size)
        if scan.file_bytes != facts["size"]:
            return None, f"says the segment is {facts['size']} bytes, but it is {scan.file_bytes}"
        if _read_header(fd, scan) is None:
            return None, "the segment's header is unreadable"
        offsets, positions, maxima = facts["index"]
        if positions[0] != scan.segment.size:
            return (
                None,
                f"its first index entry is at byte {positions[0]}, but the records start at {scan.segment.size}",
            )
        if _file_crc(fd, path, scan.file_bytes) != facts["crc"]:
            return None, "the segment's bytes do not match the CRC-32 recorded when it was sealed"
    finally:
        os.close(fd)
    segment = scan.segment
    segment.size = scan.valid_bytes = scan.file_bytes
    segment.next_offset = facts["next_offset"]
    segment.max_timestamp = facts["max_timestamp"]
    segment.crc = facts["crc"]
    segment._offsets, segment._positions, segment._maxima = offsets, positions, maxima
    segment._indexed_at = positions[-1]
    scan.sequences = facts["sequences"]
    scan.from_sidecar = True
    return scan, ""


def _file_crc(fd: int | None, path: str, end: int) -> int | None:
    """CRC-32 of the first ``end`` bytes of the file (open as ``fd``, or at ``path``); None if shorter."""
    own = fd is None
    if own:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    assert fd is not None
    try:
        crc = 0
        position = 0
        while position < end:
            data = os.pread(fd, min(SCAN_CHUNK, end - position), position)
            if not data:
                return None
            crc = zlib.crc32(data, crc)
            position += len(data)
        return crc
    finally:
        if own:
            os.close(fd)


def _unlink_if_present(path: str, quiet: bool = False) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError:
        if not quiet:
            raise


def _frames(
    fd: int, position: int, end: int, chunk: int, first_chunk: int | None = None, skip: int = 0
) -> Iterator[tuple[int, memoryview]]:
    """(position, body) of each checked frame from ``position`` up to ``end`` in the file.

    The first ``skip`` frames are hopped over by their length fields alone, unchecked: a
    caller that then checks the offset in the first frame it gets detects a bad hop. Raises
    BadRecord at the first frame that is cut off (by ``end``, or by the file ending sooner)
    or fails its check. Reads ``first_chunk`` bytes first, then ``chunk`` bytes at a time,
    more for a larger frame.
    """
    buffer = b""
    start = position  # file position of buffer[0]; the buffer never extends past end
    while position < end:
        here = position - start
        if skip and len(buffer) - here >= FRAME_HEAD.size:
            position += FRAME_HEAD.size + int.from_bytes(buffer[here : here + 4], "big")
            skip -= 1
            continue
        need = FRAME_HEAD.size if skip else _frame_bytes(buffer, here)
        while len(buffer) - here < need and start + len(buffer) < end:
            wanted = min(max(first_chunk or chunk, need), end - position)
            first_chunk = None
            buffer = os.pread(fd, wanted, position)
            if len(buffer) < wanted:  # the file is shorter than it should be
                end = position + len(buffer)
            start, here = position, 0
            need = FRAME_HEAD.size if skip else _frame_bytes(buffer, 0)
        if skip and len(buffer) - here >= FRAME_HEAD.size:
            continue
        body = check_frame(buffer, here)
        yield position, body
        position += FRAME_HEAD.size + len(body)


def _frame_bytes(buffer: bytes, here: int) -> int:
    """Bytes of the frame at ``here``, as far as the buffer tells (its head, or head and body)."""
    if len(buffer) - here < FRAME_HEAD.size:
        return FRAME_HEAD.size
    return FRAME_HEAD.size + int.from_bytes(buffer[here : here + 4], "big")


def _names(scans: list[_Scan]) -> str:
    return ", ".join(scan.name for scan in scans)
