"""A topic log held in memory: same rules and encoding as on disk, gone when the process ends.

Records are kept as their encoded frames, so a value reads back exactly as from a
:class:`~rsnet.broker.storage.SegmentLog` (a tuple comes back as a list), readers never share
a mutable value, and ``size_bytes`` counts what a durable log would write for the records.
``durable_offset`` is always ``next_offset``: in memory, stored is all there is.

This module imports the standard library and this package only.
"""

from __future__ import annotations

import bisect
import errno
from typing import Any

from .log import PendingSync, Retention, TopicLog, WriteFailed
from .records import FRAME_HEAD, decode_fields

COMPACT_AFTER = 4096
"""Dropped records kept as list slack until there are this many and they are half the list."""

RECORD_OVERHEAD = 80
"""Bytes of memory a record takes beside its frame (``size_bytes`` counts the frames only): the
bytes object's header and its list slots, about 60, and the allocator's slack. Measured: 1.75
million 30-byte records took 167 MB, 3.3 times their 52 MB of frames."""


PRODUCER_COST = 600
"""Bytes of memory a remembered producer takes (its id, up to 255 characters, and its state),
counted against the budget while it is remembered: records dropped by retention leave their
producers remembered (``max_producers`` per topic, 10,000 by default)."""


class MemoryBudget:
    """What the memory logs of one broker may hold together, in bytes of memory (their
    frames and ``RECORD_OVERHEAD`` per record, ``PRODUCER_COST`` per remembered producer): an
    append beyond it stores nothing and fails as a full disk does (``WriteFailed``, ENOSPC), so
    memory topics cannot take the process's memory, whatever their retention. Records dropped
    (retention, purge) or deleted give it back."""

    __slots__ = ("total", "used")

    def __init__(self, total: int) -> None:
        if total < 1:
            raise ValueError(f"a memory budget must be at least 1 byte, got {total!r}")
        self.total = total
        self.used = 0


class MemoryLog(TopicLog):
    """A :class:`TopicLog` in memory; retention drops exactly the expired records."""

    def __init__(self, retention: Retention | None = None, budget: MemoryBudget | None = None) -> None:
        super().__init__(retention if retention is not None else Retention())
        self.budget = budget  # shared with the broker's other memory logs, if any
        self._producers_charged = 0  # what its remembered producers count in the budget
        self.refused_memory = 0
        """What the last append the budget refused would have taken of it, in bytes."""
        # Parallel lists; index i holds offset first_offset + i - head. Dropped records stay
        # below head until compaction, so dropping one record costs O(1).
        self._frames: list[bytes] = []
        self._timestamps: list[int] = []
        self._running_max: list[int] = []  # highest timestamp up to and including each record
        self._head = 0

    def begin_sync(self) -> PendingSync | None:
        """Nothing to sync: in memory, stored is all there is."""
        self._check_open()
        return None

    def finish_sync(self, pending: PendingSync, failure: OSError | None) -> None:
        raise ValueError("a MemoryLog never begins a sync")  # begin_sync returns None

    def repair(self) -> None:
        """Nothing to repair: memory does not fail the way files do."""

    def close(self) -> None:
        self._closed = True

    def enforce_retention(self, now_ms: int) -> int:
        self._check_open()
        self._expire_producers(now_ms)
        self._charge_producers()
        retention = self.retention
        head, frames = self._head, self._frames
        count = len(frames) - head
        drop = 0  # records expired so far, oldest first
        remaining = self._size_bytes  # bytes of the records from head + drop on
        while True:
            start = drop
            if retention.max_records is not None:
                drop = max(drop, count - retention.max_records)
            if retention.max_age_ms is not None:  # up to the first record young enough
                drop = max(drop, self._first_at_or_after(now_ms - retention.max_age_ms, head + drop) - head)
            remaining -= sum(len(f) for f in frames[head + start : head + drop])
            if retention.max_bytes is not None:
                while drop < count and remaining - len(frames[head + drop]) >= retention.max_bytes:
                    remaining -= len(frames[head + drop])
                    drop += 1
            if drop == start:  # the oldest record left has not expired
                break
        if drop:
            self._drop(drop)
        return drop

    def drop_all(self) -> int:
        self._check_open()
        count = self._next_offset - self._first_offset
        if count:
            self._drop(count)
        return count

    def advance(self, offset: int) -> None:
        self._check_open()
        self._check_advance(offset)
        self._first_offset = self._next_offset = self._durable_offset = offset

    # -- storage --------------------------------------------------------------------------------

    def _store(
        self, frames: list[bytes], timestamp_ms: int, producer: str | None, first_sequence: int | None, sync: bool
    ) -> None:
        size = sum(map(len, frames))
        budget = self.budget
        if budget is not None:
            memory = _memory(size, len(frames))
            new_producer = producer is not None and first_sequence is not None and producer not in self._producers
            if budget.used + memory + (PRODUCER_COST if new_producer else 0) > budget.total:
                self.refused_memory = memory + (PRODUCER_COST if new_producer else 0)
                raise WriteFailed(
                    f"memory topics hold their memory budget ({budget.total} bytes, memory_budget_bytes) and"
                    " these records do not fit: retention, a purge or a deleted memory topic frees some",
                    errno.ENOSPC,
                )
            budget.used += memory  # (a new producer is charged as it is remembered, below)
        running = max(timestamp_ms, self._running_max[-1]) if self._running_max else timestamp_ms
        self._frames.extend(frames)
        self._timestamps.extend([timestamp_ms] * len(frames))
        self._running_max.extend([running] * len(frames))
        self._size_bytes += size
        last = None if first_sequence is None else first_sequence + len(frames) - 1
        self._stored(len(frames), producer, last)
        self._charge_producers()
        self._durable_offset = self._next_offset

    def _charge_producers(self) -> None:
        """Bring what the remembered producers count in the budget up to date (some were
        remembered or forgotten)."""
        if self.budget is not None:
            charge = PRODUCER_COST * len(self._producers)
            self.budget.used += charge - self._producers_charged
            self._producers_charged = charge

    def _read(self, offset: int, count: int, stored: bool = False) -> list[Any]:
        start = self._head + offset - self._first_offset
        frames = self._frames[start : start + count]
        if stored:  # checked when appended, and never on a disk since
            return [f[FRAME_HEAD.size :] for f in frames]
        return [decode_fields(memoryview(f)[FRAME_HEAD.size :]) for f in frames]

    def _offset_for_timestamp(self, timestamp_ms: int) -> int:
        return self._first_offset + self._first_at_or_after(timestamp_ms, self._head) - self._head

    def _first_at_or_after(self, timestamp_ms: int, start: int) -> int:
        """List index of the first record from ``start`` on with a timestamp >= t (the end if none).

        Before it, the running maximum is below t, so bisect finds it."""
        index = bisect.bisect_left(self._running_max, timestamp_ms, start)
        if index == start and index < len(self._timestamps) and self._timestamps[index] < timestamp_ms:
            # The running maximum counts records before start: one of them had a later
            # timestamp than the record at start, so the clock went back. Rare: search plainly.
            index = next(
                (i for i in range(index, len(self._timestamps)) if self._timestamps[i] >= timestamp_ms),
                len(self._timestamps),
            )
        return index

    def release(self) -> None:
        """The topic is deleted: what its records take goes back to the budget."""
        if self.budget is not None:
            records = self._next_offset - self._first_offset
            self.budget.used -= _memory(self._size_bytes, records) + self._producers_charged
            self.budget = None

    def _drop(self, count: int) -> None:
        end = self._head + count
        dropped = sum(len(f) for f in self._frames[self._head : end])
        self._size_bytes -= dropped
        if self.budget is not None:
            self.budget.used -= _memory(dropped, count)
        self._frames[self._head : end] = [b""] * count  # free the memory now, the slots later
        self._first_offset += count
        self._head = end
        if self._head >= COMPACT_AFTER and self._head * 2 >= len(self._frames):
            del self._frames[: self._head]
            del self._timestamps[: self._head]
            del self._running_max[: self._head]
            self._head = 0


def _memory(size: int, records: int) -> int:
    """What ``records`` records of ``size`` bytes of frames take in memory, as the budget counts."""
    return size + RECORD_OVERHEAD * records
