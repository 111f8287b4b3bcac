"""The broker's storage engine: one append-only log per topic, and named consumer cursors.

Synchronous and single-threaded per log: no trio, no network, no clocks (callers pass the
time). The topic engine calls it; nothing here knows about subscribers or producers beyond
the (producer, sequence) idempotency key stored with each record.

- :class:`TopicLog` (``log.py``): the contract. Offsets are contiguous from 0 per topic;
  ``append`` drops a (producer, sequence) at or below the producer's highest stored
  sequence; ``read`` raises :class:`OffsetTrimmed` below ``first_offset``.
- :class:`MemoryLog` (``memory.py``): in memory, gone with the process.
- :class:`SegmentLog` (``segments.py``): a directory of CRC-checked segment files
  (``segment_file.py``: one file's format and scan; ``sidecars.py``: the index saved when a
  segment is sealed; ``recovery.py``: what opening keeps).
- ``files.py``: every call that changes a file, behind :class:`~.files.FileOps` (the seam
  tests inject storage faults through).
- :class:`CursorStore` (``cursors.py``): committed offsets, replaced atomically.
- ``records.py``: the frame (length, CRC-32, msgpack body) every stored thing is written in.

What each fsync policy risks
----------------------------
"Acknowledged" means: below ``durable_offset`` when the broker answered the producer. The
broker acknowledges only up to ``durable_offset``, and what that means is the policy:

``ALWAYS``
    ``append`` writes, then fsyncs, before it returns (one fsync per call, so batches pay
    once); a new segment file and its directory entry are synced when it is created. Lost
    on a process kill: nothing acknowledged. On an OS crash or power failure: nothing
    acknowledged either, provided the disk honours flushes. Cost: an fsync in every
    ``append``'s latency.
``INTERVAL``
    ``append`` writes to the OS and returns; the caller runs ``sync()`` every interval,
    which fsyncs and only then moves ``durable_offset`` up. Acknowledged records are never
    lost, exactly as under ALWAYS: the price is acknowledgement latency (up to one interval)
    instead of one fsync per append. What is written but not yet synced survives a process
    kill (the OS has it) and may be lost on an OS crash or power failure, but none of it was
    acknowledged; its producers retry, and deduplication keeps what did survive once.
``NEVER``
    Never fsyncs by itself: ``durable_offset`` equals ``next_offset`` as soon as ``append``
    has handed the bytes to the OS, so records are acknowledged at write time. A process
    kill loses nothing (the OS has the bytes). An OS crash or power failure loses what the
    OS had not yet written back (on Linux typically up to about 30 s of writes) even though
    it was acknowledged; recovery then keeps the longest intact prefix, so the log stays
    contiguous but ends earlier, and offsets after that point will be given to new records.

Records are readable as soon as they are appended, before they are durable. Under INTERVAL
and NEVER a reader shown a record that a power failure then loses may later see a different
record at the same offset; a broker that must never show that serves readers only below
``durable_offset``.

Recovery (``SegmentLog.open``)
------------------------------
Every segment is scanned (a sealed segment with a sidecar that matches it byte for byte is
read from the sidecar instead, with the same result; see ``sidecars.py``): each frame's length and CRC, each body's fields, and each record's
offset against the one expected next. The log kept is the longest contiguous run of intact
records from the start of the first segment:

- A record that is cut off, fails its CRC, is not a record, or has an unexpected offset ends
  the log. Its segment is truncated there and every later segment is deleted, as Kafka does:
  records after a damaged one cannot be shown to follow it, and offsets must stay contiguous.
  A crash can only damage the tail (unsynced writes), so this never removes an acknowledged
  record under ALWAYS or INTERVAL; bit rot in an old segment costs everything after it, and
  the report says exactly what went.
- A segment whose header is unreadable is deleted with everything after it (it starts no
  valid run); if it was the first, the log restarts empty at its base offset.
- A segment that starts after the previous one ends (missing offsets) means the earlier ones
  were being deleted by retention when the process stopped: they are deleted.
- A segment in a format version this code does not know stops the open with a
  :class:`StorageError` and nothing is changed.

Files are changed only after the scan, later segments deleted before a damaged one is
truncated, and everything kept is fsynced (unless NEVER), so ``durable_offset`` starts at
``next_offset``. The :class:`RecoveryReport` names every segment touched, the byte and offset
of the damage, what was wrong and how many bytes went. Producers' highest sequences are
rebuilt from the first segment's header and the records, so idempotency survives restarts.

Retention
---------
See :class:`Retention`. ``enforce_retention(now_ms)`` is called by the broker; MemoryLog drops
exactly the expired records, SegmentLog whole segments whose records have all expired, so it
keeps up to one segment more than the limits ask.

Known limits
------------
Opening decodes the active segment and any sealed segment without a usable sidecar; every
other sealed segment is only read through once to check its CRC-32 against its sidecar, so
opening costs about one read of the log plus one decode of the active segment. Producer ids are remembered forever (no expiry), in memory and in
each new segment's header.
"""

from .cursors import CursorStore
from .log import (
    CorruptData,
    FsyncPolicy,
    LogFailed,
    OffsetBeyondEnd,
    OffsetTrimmed,
    Retention,
    StorageError,
    TopicLog,
)
from .memory import MemoryLog
from .records import Record
from .segments import DEFAULT_SEGMENT_BYTES, RecoveryReport, SegmentLog

__all__ = [
    "DEFAULT_SEGMENT_BYTES",
    "CorruptData",
    "CursorStore",
    "FsyncPolicy",
    "LogFailed",
    "MemoryLog",
    "OffsetBeyondEnd",
    "OffsetTrimmed",
    "Record",
    "RecoveryReport",
    "Retention",
    "SegmentLog",
    "StorageError",
    "TopicLog",
]
