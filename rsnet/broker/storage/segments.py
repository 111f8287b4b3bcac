"""A topic log on disk: a directory of CRC-checked segment files, recovered by scanning at open.

Layout of a topic's directory::

    00000000000000000000.log      segments, named by their first offset (20 digits)
    00000000000000004711.log      the last one is the active segment, appended to
    00000000000000000000.idx      sidecar of a sealed segment (all but the active one)
    lock                          held (flock) while a SegmentLog has the directory open

Other files (a cursor store, for instance) are left alone. The pieces, one module each:

- ``segment_file.py``: a segment file's format (a header that carries the producers'
  sequences as they were when the segment was created, then record frames), its in-memory
  sparse index, and scanning it;
- ``sidecars.py``: what scanning a sealed segment would rebuild, stored next to it when it is
  sealed, so opening a log decodes only the active segment;
- ``recovery.py``: what opening a directory keeps (the rules are in the package docstring);
- this module: :class:`SegmentLog`, which appends, rolls, reads, syncs and enforces retention.

Syncing (see :class:`~.log.PendingSync`): ``begin_sync`` hands a worker thread descriptors of
its own (a ``dup`` of the active segment's, sealed segments opened again), so nothing the log
does meanwhile (appending, retention deleting a segment, closing) can close a descriptor under
the thread's fsync or let it sync a file that reused the number. Fsyncs of one log's segments
never overlap: rolling to a new segment and ``sync()`` first wait for a sync that is running (a
roll happens once per ``segment_bytes``; its fsync covers little, since the previous sync).
Retention's fsync of the synced mark (``prepare_retention``) is of no segment, and may run
beside one.

The header's sequences make idempotency survive both restarts and retention: when older
segments are deleted, the remaining segments' headers still know every producer remembered
(``Retention.max_producers`` bounds them).

Rolling: a batch goes to the active segment while it fits in ``segment_bytes``; the next
record that does not fit starts a new segment (a segment holds at least one record, even
one larger than ``segment_bytes``). A batch may span segments. When a segment is sealed
(``_roll``) its sidecar is written before the next segment is created; retention deletes a
segment's sidecar just before the segment.

Every change to the files goes through the log's :class:`~.files.FileOps`, so tests can make
any of them fail.

This module imports msgpack, the standard library and this package only.
"""

from __future__ import annotations

import bisect
import collections
import contextlib
import fcntl
import os
import zlib
from typing import Any

from . import recovery, segment_file, sidecars, synced_mark
from .descriptors import DescriptorBudget
from .files import REAL, FileOps, unlink_if_present
from .log import CorruptData, FsyncPolicy, LogFailed, PendingSync, Retention, StorageError, TopicLog, WriteFailed
from .records import BadRecord, decode_fields, unpack
from .recovery import RecoveryReport
from .segment_file import INDEX_INTERVAL_BYTES, NO_TIMESTAMP, Segment
from .sidecars import sidecar_path

DEFAULT_SEGMENT_BYTES = 64 << 20
READ_CHUNK = 64 << 10
READ_BATCH = 1024
"""Records a search by timestamp reads at a time."""
OPEN_SEALED_SEGMENTS = 1
"""File descriptors kept open for reading sealed segments, per log (least recently used go).
One: with its lock and its active segment, a log holds three descriptors at most, so the
broker's ``max_open_topics`` logs (an eighth of the descriptor limit) hold 3/8 of it at most,
beside the connections' half (8 per log allowed 10/8 of the limit in the worst case). Readers
at different places in the sealed segments reopen theirs per read, a few µs per 64 KiB read."""
LOCK_NAME = "lock"

__all__ = ["DEFAULT_SEGMENT_BYTES", "RecoveryReport", "SegmentLog"]


class SegmentLog(TopicLog):
    """A :class:`TopicLog` stored in a directory of segment files; see :meth:`open`."""

    def __init__(
        self, directory: str, retention: Retention, fsync: FsyncPolicy, segment_bytes: int, file_ops: FileOps
    ) -> None:
        """Use :meth:`open`, which recovers the directory's contents."""
        super().__init__(retention)
        self.directory = directory
        self._files = file_ops
        self.fsync = fsync
        self.segment_bytes = segment_bytes
        self._segments: list[Segment] = []
        self._bases: list[int] = []  # base offsets of _segments, for bisect
        self._active_fd = -1
        self._readers: collections.OrderedDict[Segment, int] = collections.OrderedDict()
        self._lock_fd = -1
        self._budget: DescriptorBudget | None = None  # see descriptors.py; None: never suspended
        self._synced_offset = 0  # every record below this has been fsynced
        self._directory_synced = True
        self._failure: BaseException | None = None
        self._sync_point: tuple[Any, ...] = ()  # see _mark_synced
        self._in_flight: _SegmentSync | None = None  # begun, not finished: see begin_sync
        self._mark_first = 0  # the start offset the synced mark is written with
        self._mark_first_synced = 0  # the start offset the mark holds durably
        self._retention_sync: _RetentionMarkSync | None = None  # see prepare_retention

    @classmethod
    def open(
        cls,
        directory: str | os.PathLike[str],
        retention: Retention | None = None,
        fsync: FsyncPolicy = FsyncPolicy.ALWAYS,
        segment_bytes: int = DEFAULT_SEGMENT_BYTES,
        *,
        file_ops: FileOps = REAL,
        unclean_recovery: bool = False,
        descriptors: DescriptorBudget | None = None,
    ) -> tuple[SegmentLog, RecoveryReport]:
        """Open (creating if needed) the log in ``directory``; recover it; report what was found.

        Raises :class:`StorageError` if another SegmentLog (in any process) has the directory
        open, or if a segment has a format version this code does not know: such a segment is
        left untouched. Recovery makes everything it keeps durable unless ``fsync`` is NEVER.
        ``file_ops``: how the log changes its files (tests pass one that injects faults).
        Damage recovery cannot place raises :class:`UncleanRecoveryNeeded`, changing nothing,
        unless ``unclean_recovery`` (see the package docstring). With ``descriptors``, the log
        holds its file descriptors within that budget: it gives them up when others are used
        more recently (:meth:`suspend`), and takes them again, lock first, when it is used.
        """
        if not isinstance(fsync, FsyncPolicy):
            raise TypeError(f"fsync must be a FsyncPolicy, not {fsync!r}")
        if type(segment_bytes) is not int or segment_bytes <= 0:
            raise ValueError(f"segment_bytes must be a positive int, not {segment_bytes!r}")
        directory = os.path.abspath(os.fspath(directory))
        log = cls(directory, retention if retention is not None else Retention(), fsync, segment_bytes, file_ops)
        try:
            if not os.path.isdir(directory):
                file_ops.makedirs(directory)
                if fsync is not FsyncPolicy.NEVER:
                    file_ops.sync_directory(os.path.dirname(directory))
            log._lock()
            report = log._recover(unclean_recovery)
        except OSError as exc:
            log._release()
            raise StorageError(f"{directory}: the log cannot be opened: {exc}") from exc
        except BaseException:
            log._release()
            raise
        log._budget = descriptors
        if descriptors is not None:
            descriptors.used(log)
        return log, report

    def suspend(self) -> None:
        """Close every file descriptor the log holds, its directory's lock too, keeping all
        else: the next read, append, sync or change takes them again (``descriptors.py``).
        Nothing else may take the directory meanwhile: the broker holds its ``data_dir``."""
        if self._lock_fd >= 0:
            self._release()

    def _hold_descriptors(self, *, active: bool = True) -> None:
        """Take the descriptors back if the log gave them up (the lock alone without
        ``active``), and count them as used now. Raises StorageError if the directory is
        locked by another log, OSError as opening does (no descriptor left, the active
        segment gone)."""
        if self._lock_fd < 0:
            self._lock()
            if active and self._segments:  # (none after a failed advance: repair finds what is there)
                try:
                    self._active_fd = self._files.open(self._active.path, os.O_RDWR | os.O_APPEND)
                except BaseException:
                    self._release()
                    raise
        if self._budget is not None:
            self._budget.used(self)

    # -- TopicLog -----------------------------------------------------------------------------

    def begin_sync(self) -> PendingSync | None:
        """See :meth:`TopicLog.begin_sync`: the segments written since the last sync (sealed
        ones first, then the active one) and the directory if a segment's entry is not synced
        yet (NEVER). Raises :class:`WriteFailed` if a sync running before fails (the log is
        then rolled back, see ``finish_sync``) or no descriptor is left for this one."""
        self._await_in_flight()
        self._check_usable()
        end = self._next_offset
        unsynced = (
            [s for s in self._segments if s.next_offset > self._synced_offset] if self._synced_offset < end else []
        )
        if not unsynced and self._directory_synced:
            return None
        fds: list[int] = []
        try:
            self._hold_descriptors()
            for segment in unsynced:
                # The active segment's own descriptor stays the log's (to append, truncate,
                # close); the thread gets a duplicate, which only it closes.
                fds.append(
                    os.dup(self._active_fd)
                    if segment is self._active
                    else os.open(segment.path, os.O_RDONLY | os.O_CLOEXEC)
                )
        except OSError as exc:
            for fd in fds:
                os.close(fd)
            raise WriteFailed(f"{self.directory}: records could not be made durable: {exc}", exc.errno) from exc
        pending = _SegmentSync(
            self._files,
            fds,
            fds[-1] if unsynced and unsynced[-1] is self._active else -1,
            None if self._directory_synced else self.directory,
            end,
            self._snapshot(),
        )
        self._in_flight = pending
        return pending

    def finish_sync(self, pending: PendingSync, failure: OSError | None) -> None:
        """See :meth:`TopicLog.finish_sync`. A failed fsync of the active segment rolls the log
        back to its last sync point (``_roll_back``); any other failed fsync (a sealed segment
        or the directory, under NEVER only) fails the log until ``repair()``."""
        if pending is not self._in_flight:
            return
        self._in_flight = None
        assert isinstance(pending, _SegmentSync)
        if failure is None:
            self._synced_offset = pending.end_offset  # syncs never overlap: this only grows
            self._durable_offset = max(self._durable_offset, pending.end_offset)
            if pending.directory is not None:
                self._directory_synced = True
            self._sync_point = pending.sync_point
            self._write_synced_mark()
            return
        if pending.active_failed:
            self._roll_back(failure)
        else:
            self._failure = failure
        raise WriteFailed(f"{self.directory}: records could not be made durable: {failure}", failure.errno) from failure

    def _await_in_flight(self) -> None:
        """Fsyncs never overlap: wait (blocking this thread) for a sync a worker is running and
        finish it here, raising WriteFailed if it failed; one not started yet is given up (the
        sync that comes next covers what it would have)."""
        pending = self._in_flight
        if pending is None:
            return
        if not pending.wait():
            self._in_flight = None
            return
        failure = pending.failure
        if failure is not None and not isinstance(failure, OSError):
            self._in_flight = None
            raise failure  # not a storage failure: a bug, raised where it shows
        self.finish_sync(pending, failure)

    def _drop_in_flight(self) -> None:
        """Forget a sync begun and not finished (closing, repairing): its result no longer
        counts, and a thread still running it only closes descriptors of its own."""
        if self._in_flight is not None:
            self._in_flight.close()
            self._in_flight = None

    def prepare_retention(self, now_ms: int) -> _RetentionMarkSync | None:
        """See :meth:`TopicLog.prepare_retention`. Under ALWAYS and INTERVAL the log's new start
        goes into the synced mark (``synced_mark.py``), which should be durable before a
        segment goes, or a segment retention deleted could read as lost after an OS crash.
        None if the mark cannot be written (see :meth:`enforce_retention`)."""
        self._check_usable()
        expired = self._expired_segments(now_ms)
        if self.fsync is FsyncPolicy.NEVER or not expired or self._start_after(expired) <= self._mark_first_synced:
            return None
        self._mark_first = self._start_after(expired)
        try:
            synced_mark.write(self._files, self.directory, self._synced_offset, self._mark_first)
        except OSError:
            return None
        self._retention_sync = _RetentionMarkSync(self._files, self.directory, self._mark_first)
        return self._retention_sync

    def enforce_retention(self, now_ms: int) -> int:
        """Delete every segment whose records have all expired; return how many records went.

        Segments go oldest first. When every record has expired (only age can do that), the
        active segment is rolled first, so the log is left empty at the same ``next_offset``.
        Under ALWAYS and INTERVAL the synced mark is to hold the new start durably first: after
        :meth:`prepare_retention`'s sync ran, only the segments it covered go; without one, the
        mark is synced on this thread. A mark that cannot be written or synced does not stop
        retention (on a full disk, retention is what frees space): the segments go, and after an
        OS crash they may then be reported as lost. Raises :class:`WriteFailed` if a segment
        cannot be deleted (what was deleted stays so).
        """
        try:
            return self._enforce_retention(now_ms)
        except OSError as exc:
            raise WriteFailed(f"{self.directory}: retention could not delete a segment: {exc}", exc.errno) from exc

    def _expired_segments(self, now_ms: int) -> int:
        """How many of the oldest segments retention deletes at ``now_ms``."""
        retention = self.retention
        expired = 0
        bytes_after = self._size_bytes
        for index, segment in enumerate(self._segments):
            bytes_after -= segment.size
            if not (
                (retention.max_records is not None and self._next_offset - segment.next_offset >= retention.max_records)
                or (retention.max_bytes is not None and bytes_after >= retention.max_bytes)
                or (
                    retention.max_age_ms is not None
                    and segment.records
                    and self._all_older_than(index, now_ms - retention.max_age_ms)
                )
            ):
                break
            expired += 1
        return expired

    def _all_older_than(self, index: int, cutoff_ms: int) -> bool:
        """Whether every record of segment ``index`` was appended before ``cutoff_ms``: by its
        newest timestamp; for a segment none of whose records could be read (all damaged: its
        times are unknown), by the newest of the first later segment that has one, whose
        records came after its own. With no such segment, not by age: damage is reported until
        retention deletes it for cause, never within a second of being found because an unknown
        time read as the oldest possible (an outside check)."""
        for segment in self._segments[index:]:
            if segment.max_timestamp != NO_TIMESTAMP:
                return segment.max_timestamp < cutoff_ms
        return False

    def _start_after(self, expired: int) -> int:
        """Where the log starts once its ``expired`` oldest segments are deleted."""
        return self._segments[expired].base_offset if expired < len(self._segments) else self._next_offset

    def _note_start(self, expired: int) -> int:
        """How many of the ``expired`` oldest segments may be deleted now: after a prepared sync,
        those before the start it made durable; else all, the start made durable here first if
        the mark can be (see :meth:`enforce_retention`)."""
        prepared, self._retention_sync = self._retention_sync, None
        if prepared is not None:
            if not prepared.synced:
                return expired  # its fsync failed, and its caller said so: retention goes on
            self._mark_first_synced = max(self._mark_first_synced, prepared.first)
            while expired and self._start_after(expired) > self._mark_first_synced:
                expired -= 1  # expired since the sync was prepared: the next sweep's
            return expired
        self._mark_start(self._start_after(expired))
        return expired

    def _mark_start(self, start: int) -> None:
        """Make ``start`` the log's start in the synced mark, durably, if the mark can be
        written and synced (see :meth:`enforce_retention` for why it goes on if not)."""
        if start > self._mark_first_synced:
            self._mark_first = max(self._mark_first, start)
            with contextlib.suppress(OSError):
                synced_mark.write(self._files, self.directory, self._synced_offset, self._mark_first)
                synced_mark.sync(self._files, self.directory)
                self._mark_first_synced = self._mark_first

    def _enforce_retention(self, now_ms: int) -> int:
        self._check_usable()
        self._expire_producers(now_ms)
        expired = self._expired_segments(now_ms)
        if expired and self.fsync is not FsyncPolicy.NEVER:
            expired = self._note_start(expired)
        return self._delete_oldest(expired)

    def drop_all(self) -> int:
        """See :meth:`TopicLog.drop_all`: every segment goes as retention deletes them, the new
        start in the synced mark first (ALWAYS, INTERVAL); the sealed ones before the active
        one is rolled, which writes a new segment: on a full disk, a purge frees their space
        first. Raises :class:`WriteFailed` if a segment cannot be deleted or the new one
        written (those deleted before stay so: a purge run again goes on)."""
        self._check_usable()
        if not self._active.records and len(self._segments) == 1:
            return 0  # empty already
        if self.fsync is not FsyncPolicy.NEVER:
            self._mark_start(self._next_offset)
        dropped = 0
        try:
            dropped += self._delete_oldest(len(self._segments) - 1)
            if self._active.records:
                dropped += self._delete_oldest(1)  # rolled first: the log goes on, empty, at next_offset
        except OSError as exc:
            raise WriteFailed(f"{self.directory}: a segment could not be deleted: {exc}", exc.errno) from exc
        return dropped

    def advance(self, offset: int) -> None:
        """See :meth:`TopicLog.advance`: the log's segments (they hold no record) are replaced
        by one starting at ``offset``. In this order, so that a crash anywhere leaves an empty
        log, never a gap that would read as lost records: the new start goes into the synced
        mark (ALWAYS, INTERVAL; with 0 as the synced offset, which is never wrong), the old
        segments go, the new one is written. A log left with no segment opens empty at 0,
        for the broker to advance again."""
        self._check_usable()
        self._check_advance(offset)
        self._await_in_flight()
        try:
            self._hold_descriptors()
        except OSError as exc:  # nothing changed yet
            raise WriteFailed(f"{self.directory}: the log's new start cannot be stored: {exc}", exc.errno) from exc
        if self.fsync is not FsyncPolicy.NEVER:
            try:
                synced_mark.write(self._files, self.directory, 0, offset)
                synced_mark.sync(self._files, self.directory)
            except OSError as exc:  # nothing changed yet
                raise WriteFailed(f"{self.directory}: the log's new start cannot be stored: {exc}", exc.errno) from exc
        try:
            for segment in self._segments:
                self._forget_reader(segment)
                unlink_if_present(self._files, sidecar_path(segment.path))
                self._files.unlink(segment.path)
            os.close(self._active_fd)
            self._active_fd = -1
            self._segments = []
            segment, fd = self._create_segment(offset)
        except OSError as exc:
            self._failure = exc  # its segments are gone: repair() finds what is there
            raise WriteFailed(
                f"{self.directory}: the log could not start at offset {offset}: {exc}", exc.errno
            ) from exc
        self._segments = [segment]
        self._bases = [offset]
        self._first_offset = self._next_offset = self._durable_offset = self._synced_offset = offset
        self._mark_first = self._mark_first_synced = offset
        self._size_bytes = segment.size
        self._active_fd = fd
        self._mark_synced()
        self._write_synced_mark()

    def _delete_oldest(self, expired: int) -> int:
        """Delete the ``expired`` oldest segments (all of them: the active one is rolled
        first, so the log is left empty at the same ``next_offset``); return their records."""
        if not expired:
            return 0
        self._hold_descriptors()
        if expired == len(self._segments):
            # No sidecar for a segment deleted right after: on a nearly full disk it took the
            # space the new segment needed, and a one-segment topic's purge freed nothing.
            self._roll(sidecar=False)
        dropped = 0
        for _ in range(expired):
            segment = self._segments[0]
            self._forget_reader(segment)
            unlink_if_present(self._files, sidecar_path(segment.path))  # first: a crash between leaves no orphan
            self._files.unlink(segment.path)
            del self._segments[0]
            del self._bases[0]
            self._size_bytes -= segment.size
            self._first_offset = self._segments[0].base_offset
            dropped += segment.records
        self._damaged = [damage for damage in self._damaged if damage.end > self._first_offset]
        return dropped

    def close(self) -> None:
        """See :meth:`TopicLog.close`: the final sync first waits for one a worker is running."""
        if self._closed:
            return
        try:
            if self.fsync is not FsyncPolicy.NEVER and self._failure is None:
                self.sync()
        finally:
            self._drop_in_flight()
            self._closed = True
            self._release()

    # -- storing --------------------------------------------------------------------------------

    @property
    def _active(self) -> Segment:
        return self._segments[-1]

    def _store(
        self, frames: list[bytes], timestamp_ms: int, producer: str | None, first_sequence: int | None, sync: bool
    ) -> None:
        try:
            self._store_frames(frames, timestamp_ms, producer, first_sequence)
        except OSError as exc:
            raise WriteFailed(f"{self.directory}: records could not be stored: {exc}", exc.errno) from exc
        if self.fsync is FsyncPolicy.ALWAYS and sync:
            self.sync()
        elif self.fsync is FsyncPolicy.NEVER:
            self._durable_offset = self._next_offset

    def _store_frames(
        self, frames: list[bytes], timestamp_ms: int, producer: str | None, first_sequence: int | None
    ) -> None:
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

    def _write(self, segment: Segment, frames: list[bytes], timestamp_ms: int) -> None:
        data = b"".join(frames)
        self._hold_descriptors()
        try:
            self._files.write_all(self._active_fd, data)
        except OSError as exc:
            # Cut off whatever part was written, or the next record would follow garbage.
            try:
                self._files.truncate(self._active_fd, segment.size)
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

    def _roll(self, *, sidecar: bool = True) -> None:
        """Seal the active segment (synced unless NEVER), write its sidecar (unless it is about
        to be deleted), and start a new one at ``next_offset``: a segment with a later one after
        it is sealed.

        A sync running on a worker is waited for first, whatever the policy: the sync point a
        failed fsync rolls back to must be in the active segment (see ``_roll_back``)."""
        self._hold_descriptors()
        self._await_in_flight()
        if self.fsync is not FsyncPolicy.NEVER and self._synced_offset < self._next_offset:
            self.sync()
        old = self._active
        if sidecar:
            self._write_sidecar(old)
        segment, fd = self._create_segment(self._next_offset)
        old.sequences = {}  # only its sidecar needed them (kept until sealed, in case creating failed)
        self._readers[old] = self._active_fd
        self._trim_readers()
        self._segments.append(segment)
        self._bases.append(segment.base_offset)
        self._size_bytes += segment.size
        self._active_fd = fd
        if self.fsync is not FsyncPolicy.NEVER:
            self._mark_synced()  # the new segment's header is synced: a rollback keeps it

    def _create_segment(self, base_offset: int) -> tuple[Segment, int]:
        """Write a new segment file (header only), sync its directory entry, open it for appending."""
        segment = segment_file.create(
            self._files, self.directory, base_offset, self._producers, self.fsync is not FsyncPolicy.NEVER
        )
        if self.fsync is FsyncPolicy.NEVER:
            self._directory_synced = False
        else:
            self._sync_directory()
        return segment, self._files.open(segment.path, os.O_RDWR | os.O_APPEND)

    def _write_sidecar(self, segment: Segment) -> None:
        """Write ``segment``'s sidecar (best effort, see ``sidecars.write``); its directory entry
        is synced with the next segment's, which ``_roll`` creates right after."""
        sidecars.write(self._files, segment, self.fsync is not FsyncPolicy.NEVER)

    def _mark_synced(self) -> None:
        """Everything in the log is durable now: the point a failed fsync rolls back to."""
        self._sync_point = self._snapshot()

    def _snapshot(self) -> tuple[Any, ...]:
        """The log's state now, to install as the sync point once a sync covering it succeeded:
        the active segment's, since nothing else changes until it is rolled (which waits for
        a sync in flight, and takes a new sync point) but for the oldest segments deleted."""
        return (self._active, self._next_offset, dict(self._producers), self._active.checkpoint())

    def _roll_back(self, cause: OSError) -> None:
        """The fsync of the active segment failed: roll the log back to its last sync point.

        After a failed fsync the kernel may have dropped the pages it could not write and
        report success to the next fsync, so what was written since the last successful sync
        cannot be trusted: it is cut off (truncate, then fsync again), and the log's state is
        rewound to match. None of it was acknowledged (``durable_offset`` never passed the
        sync point). Only if cutting it off fails too is the log failed (:class:`LogFailed`).
        """
        active, next_offset, producers, checkpoint = self._sync_point
        assert active is self._active, "a segment is rolled only after a sync point"
        # By the active segment's bytes since: retention or a purge may have deleted older
        # segments since the sync point, and their bytes with them.
        size_bytes = self._size_bytes - (self._active.size - checkpoint[1])
        try:
            self._hold_descriptors()
            self._files.truncate(self._active_fd, checkpoint[1])
            self._files.datasync(self._active_fd)
        except (OSError, StorageError):  # (StorageError: its lock taken again failed)
            # The file may still hold what follows the sync point: refuse writes until
            # repair() has scanned it again. The state below is what is durable either way.
            self._failure = cause
        self._active.rewind(checkpoint)
        self._next_offset = self._synced_offset = next_offset
        self._size_bytes = size_bytes
        self._producers = dict(producers)

    def _write_synced_mark(self) -> None:
        """Record ``_synced_offset`` for recovery (``synced_mark.py``; ALWAYS and INTERVAL).
        Best effort: the records are durable whether or not the mark is written, and a mark
        left lower only checks less."""
        if self.fsync is FsyncPolicy.NEVER:
            return
        with contextlib.suppress(OSError):
            synced_mark.write(self._files, self.directory, self._synced_offset, self._mark_first)

    def _sync_directory(self) -> None:
        try:
            self._files.sync_directory(self.directory)
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

    def _read(self, offset: int, count: int, stored: bool = False) -> list[Any]:
        """Raises CorruptData only if the first record is unreadable: the ones before a record
        damaged since the log was opened are returned, and the next read reaches the damage."""
        records: list[Any] = []
        index = bisect.bisect_right(self._bases, offset) - 1
        try:
            while len(records) < count:
                segment = self._segments[index]
                start_offset, position = segment.locate(offset)
                self._read_into(records, segment, start_offset, position, offset, count - len(records), stored)
                offset = segment.next_offset
                index += 1
        except CorruptData:
            if not records:
                raise
        return records

    def _offset_for_timestamp(self, timestamp_ms: int) -> int:
        for segment in self._segments:
            if segment.records and segment.max_timestamp >= timestamp_ms:
                break
        else:
            return self._next_offset
        offset, position = segment.locate_timestamp(timestamp_ms)
        while True:  # through the segment's intact runs: a read never crosses a damaged range
            damage = next((damage for damage in segment.damage if damage.first >= offset), None)
            end = segment.next_offset if damage is None else damage.first
            wanted = offset
            while wanted < end:  # a bounded run at a time: the answer is usually in the first
                records: list[list[Any]] = []
                self._read_into(records, segment, offset, position, wanted, min(end - wanted, READ_BATCH))
                for record_offset, record_timestamp, *_ in records:
                    if record_timestamp >= timestamp_ms:
                        return record_offset
                wanted += len(records)
            if damage is None or damage.end == segment.next_offset:
                raise AssertionError("a segment's highest timestamp is not in it")  # pragma: no cover
            offset, position = segment.locate(damage.end)

    def _read_into(
        self,
        records: list[Any],
        segment: Segment,
        offset: int,
        position: int,
        wanted: int,
        count: int,
        stored: bool = False,
    ) -> None:
        """Append to ``records`` up to ``count`` records of ``segment`` from offset ``wanted`` on
        (decoded, or with ``stored`` their bodies as stored), scanning from ``offset`` at file
        ``position``; raises CorruptData for a record that fails its check (those before it are
        appended).

        The hot path of every subscription that is not at the head: a frame whose CRC holds and
        whose body is a 5-element array with the offset expected is the record this log wrote
        (decode_fields checked its fields then); anything else gets the full check and its reason.
        """
        fd = self._reader(segment)
        # A read lands within INDEX_INTERVAL_BYTES of the record it wants: read that first.
        chunk = 2 * INDEX_INTERVAL_BYTES if count < 64 else READ_CHUNK
        end = min(wanted + count, segment.next_offset)
        # Whole chunks through the hot loop, on until a frame it does not take as it is: one
        # larger than a chunk, cut off by the file's end, or damaged. The checked path below
        # reads on from that frame, saying what is wrong if anything is.
        while position < segment.size:
            wanted_bytes = min(chunk, segment.size - position)
            buffer = os.pread(fd, wanted_bytes, position)
            here, offset = segment_file.take_records(buffer, 0, offset, wanted, end, records, stored)
            position += here
            if offset == end:
                return
            if here == 0 or len(buffer) < wanted_bytes:
                break
            chunk = READ_CHUNK
        first_chunk = chunk
        offset, skip = max(offset, wanted), max(0, wanted - offset)
        append = records.append
        try:
            # The loop rebinds ``position`` on purpose: the except clause names the failing frame's.
            frames = segment_file.frames(fd, position, segment.size, READ_CHUNK, first_chunk, skip)
            for position, body in frames:  # noqa: B007 - read in the except clause below
                try:
                    record = unpack(body)
                except Exception:  # any decoder failure: decode_fields below says what is wrong
                    record = None
                if type(record) is not list or len(record) != 5 or record[0] != offset:
                    record = decode_fields(body)  # raises BadRecord, or else the offset is wrong
                    raise BadRecord(f"record holds offset {record[0]} where {offset} was expected")
                append(body if stored else record)
                offset += 1
                if offset == end:
                    return
        except BadRecord as exc:
            raise CorruptData(segment.path, position, f"(offset {offset}) {exc}") from None
        raise CorruptData(segment.path, segment.size, f"the file ends before offset {offset}")

    def _reader(self, segment: Segment) -> int:
        self._hold_descriptors()
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

    def _forget_reader(self, segment: Segment) -> None:
        fd = self._readers.pop(segment, None)
        if fd is not None:
            os.close(fd)

    # -- opening --------------------------------------------------------------------------------

    def _lock(self) -> None:
        """Lock the directory (holding nothing more if that fails)."""
        fd = os.open(os.path.join(self.directory, LOCK_NAME), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BaseException as failure:
            os.close(fd)
            if isinstance(failure, BlockingIOError):
                raise StorageError(f"{self.directory} is already open (by this or another process)") from None
            raise
        self._lock_fd = fd

    def _release(self) -> None:
        """Close every descriptor the log holds, its lock's too (see :meth:`suspend`)."""
        for fd in [self._active_fd, *self._readers.values(), self._lock_fd]:
            if fd >= 0:
                os.close(fd)
        self._active_fd = self._lock_fd = -1
        self._readers.clear()
        if self._budget is not None:
            self._budget.released(self)

    def repair(self) -> None:
        """Recover the directory again (as :meth:`open` does, still holding its lock) and take
        over what it finds, after a failed write or fsync left the log failed (LogFailed).

        Records that were acknowledged are durable, so recovery keeps them: readers' positions
        stay valid. If recovery fails (the disk still failing) the log stays failed, and its
        reads are still served from the files as they were.
        """
        self._check_open()
        if self._failure is None:
            return
        self._drop_in_flight()  # what it covers, the scan below finds (or not) on its own
        try:
            self._hold_descriptors(active=False)  # the lock, if given up: not the segment it checks
            recovered = recovery.recover(self._files, self.directory, self.fsync is not FsyncPolicy.NEVER)
        except OSError as exc:
            raise StorageError(f"{self.directory}: the log cannot be repaired yet: {exc}") from exc
        for fd in [self._active_fd, *self._readers.values()]:
            if fd >= 0:  # none is active after a failed advance
                os.close(fd)
        self._readers.clear()
        self._install(recovered)
        self._failure = None

    def _recover(self, unclean: bool) -> RecoveryReport:
        """Recover the directory (see ``recovery.py``) and take over the state it describes."""
        recovered = recovery.recover(self._files, self.directory, self.fsync is not FsyncPolicy.NEVER, unclean)
        self._install(recovered)
        return recovered.report

    def _install(self, recovered: recovery.Recovered) -> None:
        self._damaged = recovered.damaged
        self._segments = recovered.segments
        self._bases = [segment.base_offset for segment in self._segments]
        self._adopt_producers(recovered.producers)
        self._first_offset = recovered.first_offset
        self._mark_first = self._mark_first_synced = recovered.first_offset  # a later start is noted before it is cut
        self._retention_sync = None
        self._next_offset = recovered.next_offset
        self._active_fd = recovered.active_fd
        self._directory_synced = recovered.directory_synced
        self._durable_offset = self._synced_offset = self._next_offset
        self._size_bytes = sum(segment.size for segment in self._segments)
        self._mark_synced()
        if self.fsync is FsyncPolicy.NEVER:  # no mark is kept: one left from another policy goes
            for name in synced_mark.MARK_NAMES:
                unlink_if_present(self._files, os.path.join(self.directory, name), quiet=True)
        else:  # recovery synced everything it kept (and after an unclean one, the log ends lower)
            self._write_synced_mark()


class _SegmentSync(PendingSync):
    """A :class:`SegmentLog`'s fsync (see ``begin_sync``), run on any thread with descriptors
    of its own: the segments' data in order, the active segment's last, then the directory."""

    def __init__(
        self,
        files: FileOps,
        fds: list[int],
        active_fd: int,
        directory: str | None,
        end_offset: int,
        sync_point: tuple[Any, ...],
    ) -> None:
        super().__init__(end_offset)
        self._files = files
        self._fds = fds
        self._active_fd = active_fd  # among fds, or -1 when the active segment has nothing new
        self.directory = directory
        """The directory whose entries are synced after the data, if any are new."""
        self.sync_point = sync_point
        """The log's state at ``end_offset``: what a later failed fsync rolls back to."""
        self.active_failed = False
        """The fsync that failed was the active segment's (a rollback can cut what it lost)."""

    def _sync_files(self) -> None:
        for fd in self._fds:
            try:
                self._files.datasync(fd)
            except OSError:
                self.active_failed = fd == self._active_fd
                raise
        if self.directory is not None:
            self._files.sync_directory(self.directory)

    def _release(self) -> None:
        for fd in self._fds:
            os.close(fd)


class _RetentionMarkSync:
    """The fsync of a synced mark holding a new start (see ``SegmentLog.prepare_retention``):
    call it once on any thread; it raises OSError as the fsync does."""

    def __init__(self, files: FileOps, directory: str, first: int) -> None:
        self._files = files
        self._directory = directory
        self.first = first
        self.synced = False

    def __call__(self) -> None:
        synced_mark.sync(self._files, self._directory)
        self.synced = True
