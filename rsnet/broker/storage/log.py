"""What every topic log is: the :class:`TopicLog` contract, its settings and its errors.

The rules shared by both kinds of log live here, in :class:`TopicLog`: argument checks,
idempotent-producer deduplication, encoding, and the bounds of ``read``. A subclass only
stores frames and finds them again (``_store``, ``_read``, ``_offset_for_timestamp``), and
makes them durable (``begin_sync``/``finish_sync``, with a :class:`PendingSync` between them).

This module imports msgpack and the standard library only.
"""

from __future__ import annotations

import abc
import dataclasses
import enum
import errno as _errno
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

from .records import MAX_BODY_BYTES, MAX_INT64, MIN_INT64, Record, encode_record, new_packer


class OffsetTrimmed(LookupError):
    """The requested offset was removed by retention: records start at ``first_available``."""

    def __init__(self, requested: int, first_available: int) -> None:
        super().__init__(f"offset {requested} was removed by retention; the earliest retained is {first_available}")
        self.requested = requested
        self.first_available = first_available


class OffsetBeyondEnd(LookupError):
    """The requested offset is past ``next_offset``: no record has it yet."""

    def __init__(self, requested: int, next_offset: int) -> None:
        super().__init__(f"offset {requested} does not exist yet; the next record gets {next_offset}")
        self.requested = requested
        self.next_offset = next_offset


@dataclasses.dataclass(frozen=True, slots=True)
class DamagedRange:
    """Offsets ``first`` .. ``end - 1`` of a log are damaged: stored once, unreadable now.

    Their offsets are never given to other records; the records on both sides stay readable.
    """

    first: int
    end: int
    """The first offset after the damage (the next intact record's, if one follows)."""
    problem: str
    """Where and what: the segment, the byte, what was wrong, where a copy of the bytes is."""


class OffsetDamaged(LookupError):
    """The requested offset is in a :class:`DamagedRange`: its record cannot be read back."""

    def __init__(self, requested: int, damage: DamagedRange) -> None:
        super().__init__(
            f"offset {requested} is in a damaged range ({damage.first} to {damage.end - 1}): {damage.problem}; "
            f"the next intact offset is {damage.end}"
        )
        self.requested = requested
        self.damage = damage


class StorageError(Exception):
    """The storage cannot do what was asked; the message says which file and why."""


class CorruptData(StorageError):
    """Stored bytes failed their check: ``path``, at byte ``position``, ``problem``."""

    def __init__(self, path: str, position: int, problem: str) -> None:
        super().__init__(f"{path}: corrupt data at byte {position}: {problem}")
        self.path = path
        self.position = position
        self.problem = problem


class UncleanRecoveryNeeded(StorageError):
    """Recovery found damage it cannot place: whether acknowledged records were lost after it
    is unknown. Nothing was changed; the message names the file, the damage and the flag
    (``unclean_recovery``) that lets an operator accept cutting the log there."""


class WriteFailed(StorageError):
    """Records could not be stored: the file system refused a write or an fsync (``errno``).

    Nothing of the failed call counts as stored: the log still holds exactly what it held
    before it (after a failed fsync: what the last successful sync made durable, the rest cut
    off), and it stays usable, so appending again once the cause is gone (space freed) works.
    ``full`` is true for ENOSPC and EDQUOT: no space left, or over quota.
    """

    def __init__(self, message: str, errno: int | None) -> None:
        super().__init__(message)
        self.errno = errno

    @property
    def full(self) -> bool:
        return self.errno in (_errno.ENOSPC, _errno.EDQUOT)


class LogFailed(StorageError):
    """An earlier write or fsync failed, so what is on disk is unknown: reopen the log.

    After a failed fsync the kernel may have dropped the unwritten pages and report success
    to the next fsync, so the log refuses every further call rather than claim durability.
    Reopening scans the files and keeps what is really there.
    """


class FsyncPolicy(enum.Enum):
    """When a durable log forces its writes to the disk (see the package docstring for the risks).

    ALWAYS: ``append`` fsyncs before it returns; ``durable_offset`` is then ``next_offset``.
    ``append(..., sync=False)`` leaves that fsync to the caller (the broker runs it in a worker
    thread, one fsync for all the appends made while the previous one ran: see
    :class:`PendingSync`).
    INTERVAL: ``append`` writes to the OS only; the caller calls ``sync()`` every interval,
    which fsyncs and moves ``durable_offset`` up to ``next_offset``.
    NEVER: never fsyncs by itself; ``durable_offset`` is ``next_offset`` as soon as the OS has
    the bytes. An explicit ``sync()`` still fsyncs.
    """

    ALWAYS = "always"
    INTERVAL = "interval"
    NEVER = "never"


class PendingSync(abc.ABC):
    """One fsync of what a log has written and not yet made durable, in three steps, so that
    the slow middle one can run on another thread while the log's own thread goes on:

    1. ``log.begin_sync()``, on the log's thread: what to sync, up to :attr:`end_offset` (the
       ``next_offset`` when it began; records appended later wait for the next sync);
    2. :meth:`run`, on any thread, at most once: the fsyncs. It uses only file descriptors of
       its own and changes nothing in the log, so the log may append, and close, meanwhile;
    3. ``log.finish_sync(pending, failure)``, on the log's thread, with what :meth:`run`
       raised (an OSError) or None: only then does ``durable_offset`` reach ``end_offset``.

    A log has at most one sync begun and not finished. Anything else that syncs (``sync()``,
    rolling to a new segment, ``begin_sync`` again) first waits, on its own thread, for a
    :meth:`run` that has started, and finishes it: fsyncs of one log never overlap, so no sync
    is trusted after a failure the kernel reported to another one.

    :meth:`close` gives back the file descriptors of a sync that will not run (its task was
    cancelled before a thread took it); it is harmless after :meth:`run`.
    """

    end_offset: int
    """Every record below this offset is durable once the sync finished without failure."""

    _PREPARED, _RUNNING, _RAN, _ABANDONED = range(4)

    def __init__(self, end_offset: int) -> None:
        self.end_offset = end_offset
        self.failure: BaseException | None = None
        """What :meth:`run` raised, once it ran."""
        self._state = self._PREPARED
        self._state_lock = threading.Lock()  # run() on a worker thread, close() on the log's
        self._ran = threading.Event()

    def run(self) -> None:
        """Run the fsyncs (on any thread); raises OSError as they do. Does nothing if the sync
        was given up (:meth:`close`) first."""
        with self._state_lock:
            if self._state != self._PREPARED:
                return
            self._state = self._RUNNING
        try:
            self._sync_files()
        except BaseException as failure:
            self.failure = failure
            raise
        finally:
            self._release()
            with self._state_lock:
                self._state = self._RAN
            self._ran.set()

    def close(self) -> None:
        """Give the sync up if :meth:`run` has not started it (its file descriptors are closed);
        otherwise nothing."""
        with self._state_lock:
            if self._state != self._PREPARED:
                return
            self._state = self._ABANDONED
        self._release()
        self._ran.set()

    def wait(self) -> bool:
        """On the log's thread: block until a :meth:`run` already started has returned, and say
        whether it ran (False: it had not started, and now never will)."""
        self.close()
        self._ran.wait()
        return self._state == self._RAN

    @abc.abstractmethod
    def _sync_files(self) -> None:
        """The fsyncs; raises OSError."""

    @abc.abstractmethod
    def _release(self) -> None:
        """Close this sync's file descriptors (called exactly once)."""


DEFAULT_MAX_PRODUCERS = 10_000
"""Producer ids a topic remembers for deduplication at most (the least recently written go first)."""

DEFAULT_PRODUCER_MAX_AGE_MS = 7 * 24 * 3600 * 1000
"""How long a topic remembers a producer that stores nothing more: 7 days, as long as the
broker's default record retention (Kafka's ``producer.id.expiration.ms`` is 1 day; JetStream's
``duplicate_window`` 2 minutes)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Retention:
    """How much of a topic to keep: records, and what it remembers of idempotent producers.

    Records (None means no limit of that kind): ``enforce_retention(now_ms)`` drops the
    oldest record while it has expired: when ``max_records`` newer records exist, when the
    newer records alone take ``max_bytes`` or more, or when its timestamp is older than
    ``max_age_ms`` (``timestamp_ms < now_ms - max_age_ms``). Count and bytes are therefore
    floors, as in Kafka: what remains still meets the limit, so they never empty a topic; age
    can. A :class:`SegmentLog` drops the oldest segment while all of its records have expired
    (its bytes counted with its header).

    Producers (see :meth:`TopicLog.last_sequence`): the log remembers each producer's highest
    sequence so that retries are stored once. It remembers at most ``max_producers`` of them
    (always bounded) and forgets one whose last stored record is older than
    ``producer_max_age_ms`` (None: only the count bounds them); the least recently written go
    first, whether or not their records are still retained. A forgotten producer is a new one
    to the log: its sequences are no longer deduplicated against what it stored before.
    """

    max_records: int | None = None
    max_bytes: int | None = None
    max_age_ms: int | None = None
    max_producers: int = DEFAULT_MAX_PRODUCERS
    producer_max_age_ms: int | None = DEFAULT_PRODUCER_MAX_AGE_MS

    def __post_init__(self) -> None:
        for name in ("max_records", "max_bytes", "max_age_ms", "max_producers", "producer_max_age_ms"):
            limit = getattr(self, name)
            if (limit is not None or name == "max_producers") and (type(limit) is not int or limit <= 0):
                kind = "a positive int" if name == "max_producers" else "a positive int or None"
                raise ValueError(f"Retention.{name} must be {kind}, not {limit!r}")


class ProducerState(NamedTuple):
    """What a log remembers of one idempotent producer."""

    sequence: int
    """The highest sequence stored."""
    written_ms: int
    """The timestamp of the append that stored its latest records."""
    end: int = 0
    """The offset after its last record (0 for a producer recovered from storage: durable)."""


class TopicLog(abc.ABC):
    """One topic's log: records with contiguous offsets, appended, read, trimmed by retention.

    Not thread-safe: calls on one log must not overlap (one thread or task at a time).
    """

    max_record_bytes = MAX_BODY_BYTES
    """The largest record (its encoded body) :meth:`append` stores; a larger one is a
    ValueError. The broker lowers it so that any record fits the frames subscribers are sent."""

    def __init__(self, retention: Retention) -> None:
        if not isinstance(retention, Retention):
            raise TypeError(f"retention must be a Retention, not {type(retention).__name__}")
        self.retention = retention
        self._first_offset = 0
        self._next_offset = 0
        self._durable_offset = 0
        self._size_bytes = 0
        # Producer id -> its state, least recently written first (an update moves it to the
        # end), so forgetting the oldest is popping the first: see _remember, _expire_producers.
        self._producers: dict[str, ProducerState] = {}
        self.producers_forgotten = 0  # by the count or the age bound, since the log was opened
        self._append_ms = 0  # the timestamp of the append in progress, for _stored
        self._packer = new_packer()
        self._closed = False
        self._damaged: list[DamagedRange] = []  # in offset order; see damaged_ranges

    # -- state --------------------------------------------------------------------------------

    @property
    def first_offset(self) -> int:
        """The earliest retained offset (equal to ``next_offset`` when the log is empty)."""
        return self._first_offset

    @property
    def next_offset(self) -> int:
        """The offset the next appended record gets."""
        return self._next_offset

    @property
    def durable_offset(self) -> int:
        """Every offset below this is stored as the fsync policy promises: acknowledge up to here."""
        return self._durable_offset

    @property
    def size_bytes(self) -> int:
        """Bytes the retained records take (on disk: the segment files, headers included)."""
        return self._size_bytes

    @property
    def damaged_ranges(self) -> list[DamagedRange]:
        """Retained offsets whose records were found damaged (a log on disk, at open), in order."""
        return [damage for damage in self._damaged if damage.end > self._first_offset]

    def last_sequence(self, producer: str) -> int | None:
        """The highest sequence stored for ``producer``, or None if it has stored none or was
        forgotten (see :class:`Retention`: the count and age bounds on producers)."""
        state = self._producers.get(producer)
        return None if state is None else state.sequence

    def last_write(self, producer: str) -> tuple[int, int] | None:
        """``(sequence, end)``: the highest sequence stored for ``producer`` and the offset after
        the record that carries it, which is acknowledged once ``durable_offset`` reaches
        ``end``; None as for :meth:`last_sequence`."""
        state = self._producers.get(producer)
        return None if state is None else (state.sequence, state.end)

    @property
    def producer_count(self) -> int:
        """Producers remembered now (at most ``retention.max_producers``)."""
        return len(self._producers)

    # -- operations ---------------------------------------------------------------------------

    def append(
        self,
        values: Sequence[Any],
        *,
        timestamp_ms: int,
        producer: str | None = None,
        first_sequence: int | None = None,
        sync: bool = True,
    ) -> list[int | None]:
        """Append ``values`` in order; return each one's offset, or None for a duplicate.

        With ``producer`` and ``first_sequence``, value ``i`` has sequence ``first_sequence + i``
        and is a duplicate (dropped, None) when that sequence is at or below the highest one
        already stored for ``producer``: a producer's retry is stored once. Gaps in a
        producer's sequences are allowed. Producers whose last stored record is older than
        ``retention.producer_max_age_ms`` at ``timestamp_ms`` are forgotten first, so a
        producer that comes back after that long is deduplicated as a new one. The whole
        batch is checked and encoded before anything is written: a value that cannot be
        stored (None, not msgpack) raises ValueError or TypeError and nothing is appended.

        A duplicate's original has an offset below the ``next_offset`` seen when this returns;
        under ``FsyncPolicy.INTERVAL`` acknowledge the duplicate only once ``durable_offset``
        has reached that, since the original may not be durable yet.

        On disk a batch is not atomic: if the process dies inside ``append``, a prefix of the
        batch may be kept. Nothing of it was acknowledged, and a retry with the same
        sequences stores only the rest.

        ``sync=False`` skips the fsync ``FsyncPolicy.ALWAYS`` makes before returning: the
        records are written (readable, not durable) and the caller makes them durable with
        ``sync()`` or ``begin_sync``/``finish_sync`` (one sync for many appends). Other
        policies never fsync in ``append``.
        """
        self._check_usable()
        if type(timestamp_ms) is not int or not MIN_INT64 <= timestamp_ms <= MAX_INT64:
            raise TypeError(f"timestamp_ms must be an int64, not {timestamp_ms!r}")
        if producer is not None and type(producer) is not str:
            raise TypeError(f"producer must be a str or None, not {type(producer).__name__}")
        duplicates = 0
        if first_sequence is not None:
            if producer is None:
                raise ValueError("first_sequence needs a producer")
            if type(first_sequence) is not int or first_sequence < 0 or first_sequence + len(values) > MAX_INT64:
                raise ValueError(f"first_sequence must be an int from 0 to 2**63-1-len(values), not {first_sequence!r}")
            self._expire_producers(timestamp_ms)
            state = self._producers.get(producer)
            highest = -1 if state is None else state.sequence
            duplicates = min(len(values), max(0, highest - first_sequence + 1))
        offset = self._next_offset
        frames = []
        for index in range(duplicates, len(values)):
            sequence = None if first_sequence is None else first_sequence + index
            try:
                frames.append(
                    encode_record(
                        self._packer, offset, timestamp_ms, values[index], producer, sequence, self.max_record_bytes
                    )
                )
            except (TypeError, ValueError) as exc:
                raise type(exc)(f"values[{index}]: {exc}") from exc
            offset += 1
        first = self._next_offset
        self._append_ms = timestamp_ms
        if frames:
            self._store(
                frames, timestamp_ms, producer, None if first_sequence is None else first_sequence + duplicates, sync
            )
        return [None] * duplicates + list(range(first, first + len(frames)))

    def read(self, offset: int, max_count: int) -> list[Record]:
        """Up to ``max_count`` records from ``offset`` on, in order.

        Raises :class:`OffsetTrimmed` below ``first_offset``, :class:`OffsetBeyondEnd`
        above ``next_offset`` and :class:`OffsetDamaged` inside a damaged range; returns [] at
        ``next_offset``, and stops before a damaged range (fewer than ``max_count``). Records
        not yet durable are included: cap reads at ``durable_offset`` to show only
        acknowledged records.
        """
        return [Record(*fields) for fields in self.read_fields(offset, max_count)]

    def read_fields(self, offset: int, max_count: int) -> list[list[Any]]:
        """:meth:`read`, each record as its list ``[offset, timestamp_ms, value, producer,
        sequence]``: the broker's subscriptions read this way, without an object per record."""
        count = self._readable(offset, max_count)
        return self._read(offset, count) if count else []

    def read_stored(self, offset: int, max_count: int) -> list[bytes]:
        """:meth:`read`, each record as the body it is stored as: the msgpack array ``[offset,
        timestamp_ms, value, producer, sequence]``, its frame's CRC and its offset checked, the
        rest not decoded (what :meth:`append` wrote was checked then). For subscriptions that
        send records as stored: no decoding, no encoding again, no objects per record."""
        count = self._readable(offset, max_count)
        return self._read(offset, count, stored=True) if count else []

    def _readable(self, offset: int, max_count: int) -> int:
        """How many records a read of up to ``max_count`` from ``offset`` returns (see :meth:`read`)."""
        self._check_open()
        if type(offset) is not int or offset < 0:
            raise ValueError(f"offset must be an int >= 0, not {offset!r}")
        if type(max_count) is not int or max_count < 0:
            raise ValueError(f"max_count must be an int >= 0, not {max_count!r}")
        if offset < self._first_offset:
            raise OffsetTrimmed(offset, self._first_offset)
        if offset > self._next_offset:
            raise OffsetBeyondEnd(offset, self._next_offset)
        count = min(max_count, self._next_offset - offset)
        for damage in self._damaged:
            if damage.first <= offset < damage.end:
                raise OffsetDamaged(offset, damage)
            if offset < damage.first:
                count = min(count, damage.first - offset)
                break
        return count

    def offset_for_timestamp(self, timestamp_ms: int) -> int:
        """The first retained offset whose record has ``timestamp_ms >= t``; ``next_offset`` if none.

        Exact even if the clock went backwards between appends: the answer is the first
        record at or after ``t``, never one after it.
        """
        self._check_open()
        if type(timestamp_ms) is not int:
            raise TypeError(f"timestamp_ms must be an int, not {timestamp_ms!r}")
        if self._first_offset == self._next_offset:
            return self._next_offset
        return self._offset_for_timestamp(timestamp_ms)

    def sync(self) -> None:
        """Force what is written to the disk; ``durable_offset`` becomes ``next_offset``.

        ``begin_sync``, ``run`` and ``finish_sync`` on this thread. Raises :class:`WriteFailed`
        if the fsync fails (see ``finish_sync``)."""
        pending = self.begin_sync()
        if pending is None:
            return
        failure: OSError | None = None
        try:
            pending.run()
        except OSError as exc:
            failure = exc
        finally:
            pending.close()
        self.finish_sync(pending, failure)

    @abc.abstractmethod
    def begin_sync(self) -> PendingSync | None:
        """Prepare an fsync of what is written and not yet durable (see :class:`PendingSync`);
        None if there is nothing to sync. Waits for a sync begun earlier that is running, and
        finishes it first. Raises :class:`StorageError` if the log cannot sync (closed, failed)."""

    @abc.abstractmethod
    def finish_sync(self, pending: PendingSync, failure: OSError | None) -> None:
        """On the log's thread, after ``pending.run()``: with no ``failure``, ``durable_offset``
        moves up to ``pending.end_offset``. With one, raises :class:`WriteFailed`: the log is
        rolled back to what the last successful sync made durable (or, if it cannot be, fails
        until ``repair()``), as a failed ``sync()`` leaves it. Does nothing for a sync already
        finished (by a sync that waited for it) or given up (the log was closed or repaired)."""

    def prepare_retention(self, now_ms: int) -> Callable[[], None] | None:
        """What must reach the disk before :meth:`enforce_retention` deletes records, as a
        function to call once on a worker thread (raising OSError as an fsync does), then call
        ``enforce_retention`` on the log's thread; without it, ``enforce_retention`` does that
        work on its own thread. None if there is nothing to do first (the default)."""
        return None

    @abc.abstractmethod
    def enforce_retention(self, now_ms: int) -> int:
        """Drop what ``retention`` no longer keeps at ``now_ms`` (records, and producers past
        ``producer_max_age_ms``); return how many records went."""

    @abc.abstractmethod
    def drop_all(self) -> int:
        """Drop every record (a purge) and return how many went. The log is left empty at the
        same ``next_offset``: an offset is never given to other data, so a reader that resumes
        at an offset it had reached is told the records are gone, as after retention, and
        never handed new records under old offsets. Producers' sequences are kept."""

    @abc.abstractmethod
    def advance(self, offset: int) -> None:
        """Move an empty log forward to start (and end) at ``offset``, as if records up to it
        had been written and removed: a topic created again under a deleted one's name goes on
        from that topic's next offset (the broker's ``RetiredOffsets``). Raises ValueError for a
        log that holds records or already ends at or past ``offset``; StorageError if a durable
        log cannot store its new start (it is then as it was, or fails until ``repair()``)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release the log (a durable log syncs first unless its policy is NEVER). Idempotent."""

    @abc.abstractmethod
    def repair(self) -> None:
        """If an earlier failure left the log refusing writes (:class:`LogFailed`), look at its
        storage again and go on with what is really there; raises StorageError if that fails
        too (the log then stays as it was). Does nothing to a log that works."""

    def __enter__(self) -> TopicLog:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- for subclasses -----------------------------------------------------------------------

    @abc.abstractmethod
    def _store(
        self, frames: list[bytes], timestamp_ms: int, producer: str | None, first_sequence: int | None, sync: bool
    ) -> None:
        """Store framed records numbered from ``next_offset`` (``sync``: see ``append``).

        Advances ``next_offset`` (and the producer's sequence, see ``_stored``) as records
        are stored, so after an exception the log still describes exactly what it holds.
        """

    @abc.abstractmethod
    def _read(self, offset: int, count: int, stored: bool = False) -> list[Any]:
        """Exactly ``count`` records from ``offset``, all of which exist: decoded field lists,
        or with ``stored`` their bodies as stored (see :meth:`read_stored`)."""

    @abc.abstractmethod
    def _offset_for_timestamp(self, timestamp_ms: int) -> int:
        """``offset_for_timestamp`` on a log that is not empty."""

    def _stored(self, count: int, producer: str | None, last_sequence: int | None) -> None:
        """``count`` more records are stored, the last with ``last_sequence`` (if any)."""
        self._next_offset += count
        if last_sequence is not None:
            assert producer is not None
            self._remember(producer, ProducerState(last_sequence, self._append_ms, self._next_offset))

    # -- producers' state -------------------------------------------------------------------------

    def _remember(self, producer: str, state: ProducerState) -> None:
        """``producer`` stored records: it becomes the most recently written, and if that makes
        one producer too many, the least recently written is forgotten."""
        producers = self._producers
        producers.pop(producer, None)
        producers[producer] = state
        while len(producers) > self.retention.max_producers:
            del producers[next(iter(producers))]
            self.producers_forgotten += 1

    def _expire_producers(self, now_ms: int) -> int:
        """Forget the producers whose last stored record is older than ``producer_max_age_ms``
        at ``now_ms``; returns how many. Cheap when none has expired: the least recently
        written come first. (A clock set back may leave an expired producer behind a younger
        one until that one goes too: forgetting is never early, only late.)"""
        max_age = self.retention.producer_max_age_ms
        if max_age is None:
            return 0
        producers = self._producers
        forgotten = 0
        while producers:
            oldest = next(iter(producers))
            if producers[oldest].written_ms >= now_ms - max_age:
                break
            del producers[oldest]
            forgotten += 1
        self.producers_forgotten += forgotten
        return forgotten

    def _adopt_producers(self, producers: Mapping[str, ProducerState]) -> None:
        """Take over producers' state rebuilt from storage (in any order): ordered by when they
        last wrote, the most recent ``max_producers`` of them."""
        ordered = sorted(producers.items(), key=lambda item: item[1].written_ms)
        excess = max(0, len(ordered) - self.retention.max_producers)
        self._producers = dict(ordered[excess:])
        self.producers_forgotten += excess

    def _check_advance(self, offset: int) -> None:
        if type(offset) is not int or offset <= self._next_offset or self._first_offset != self._next_offset:
            raise ValueError(
                f"only an empty log moves forward: it holds offsets {self._first_offset} to {self._next_offset}, "
                f"asked to start at {offset!r}"
            )

    def _check_open(self) -> None:
        if self._closed:
            raise StorageError("the log is closed")

    def _check_usable(self) -> None:
        self._check_open()
