"""The broker's storage engine: one append-only log per topic, and named consumer cursors.

Synchronous and single-threaded per log: no trio, no network, no clocks (callers pass the
time). The one exception is an fsync: ``begin_sync`` hands out a :class:`PendingSync` whose
``run`` may go to another thread while the log's thread goes on (see ALWAYS below). The topic engine calls it; nothing here knows about subscribers or producers beyond
the (producer, sequence) idempotency key stored with each record.

- :class:`TopicLog` (``log.py``): the contract. Offsets are contiguous from 0 per topic;
  ``append`` drops a (producer, sequence) at or below the producer's highest stored
  sequence; ``read`` raises :class:`OffsetTrimmed` below ``first_offset``.
- :class:`MemoryLog` (``memory.py``): in memory, gone with the process.
- :class:`SegmentLog` (``segments.py``): a directory of CRC-checked segment files
  (``segment_file.py``: one file's format and scan; ``sidecars.py``: the index saved when a
  segment is sealed; ``synced_mark.py``: how far syncs went, which recovery must not cut
  below; ``recovery.py``: what opening keeps; ``descriptors.py``: how many logs hold their
  files open at once, the least recently used giving theirs up).
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

    The broker does the same without waiting for the disk in its event loop: it appends with
    ``append(..., sync=False)`` (a write into the OS's page cache) and runs the fsync in a
    worker thread: ``begin_sync()`` notes ``next_offset`` and gives the thread descriptors of
    its own, ``PendingSync.run()`` fsyncs, and ``finish_sync()``, back on the log's thread,
    moves ``durable_offset`` to the offset noted, and only then are those records
    acknowledged or shown to readers. Appends made while a sync runs are covered by the next
    one, which covers all of them at once (group commit); fsyncs of one log never overlap
    (rolling to a new segment, ``sync()`` and closing wait for the one running). The
    guarantees are ALWAYS's, with one fsync in the acknowledgement latency, shared by every
    append it covers.
``INTERVAL``
    ``append`` writes to the OS and returns; the caller runs ``sync()`` every interval,
    which fsyncs and only then moves ``durable_offset`` up (the broker runs it in a worker
    thread, as under ALWAYS). Acknowledged records are never
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
read from the sidecar instead, with the same result; see ``sidecars.py``): each frame's length
and CRC, each body's fields, and each record's offset against the one expected next. A crash
can damage only the tail of the active segment (the last, unsynced write); damage anywhere
else is bit rot, a bad disk or a hand edit, and must cost no more than the damaged records:

- **Torn tail.** Damage in the active segment with no intact record after it is the last
  write, cut short: the segment is cut there (a copy of the cut bytes is kept in
  ``quarantine/``). Under ALWAYS and INTERVAL nothing cut was acknowledged: each sync that
  succeeds records how far it went in the file ``synced`` and its copy ``synced.copy``
  (``synced_mark.py``: two, so that one damaged or deleted is not lost evidence), and a log
  whose intact records end before that mark did not end in a torn write: the offsets up to
  the mark are a damaged range (those records are damaged, or their segment file is gone),
  and a new segment starts at the mark, so that the range is found again at every open and
  its offsets are never given to other records (it used to stop the open, and
  ``unclean_recovery`` then gave them again). A partial last record when the mark itself is
  damaged, in both files (it may have covered that record), is damage recovery cannot place
  (below); a mark that is blank, as an OS crash leaves its first write, is no evidence either
  way and the tail is cut.
- **Damage in the middle.** After a damaged record the scan searches, byte by byte, for the
  next intact one (its frame checks, its offset is plausible and the frame after it follows
  on). The offsets in between become a :class:`DamagedRange`: never reused, reported, and
  ``read`` raises :class:`OffsetDamaged` there while the records on both sides keep being
  served. Damage that runs to the end of a sealed segment ends at the next segment's first
  offset; a sealed segment whose header is unreadable is one damaged range as a whole;
  offsets no segment file holds (a file deleted by hand) are a damaged range too: before the
  oldest file, from the start the ``synced`` mark holds (retention fsyncs its new start there
  before it deletes a segment); not after the newest file: a deleted newest segment shows only
  against the mark's synced offset (above), and the broker notices it when a committed cursor
  lies beyond the recovered end. The
  files are left as they are (a copy of the damaged bytes goes to ``quarantine/``), so the damage
  is found again, the same, at every open, until retention removes its segment. Sealed
  segments with damage get no sidecar.
- **Damage recovery cannot place** stops the open with :class:`UncleanRecoveryNeeded`,
  changing nothing: an unreadable header on the active segment with no intact record after
  it and no ``synced`` mark (how many records it held is unknown: with a mark, those below it
  are a damaged range and the rest a torn write), a segment that starts inside the previous one,
  and a partial last record with a damaged mark. With ``unclean_recovery`` the
  log is cut there as before damaged ranges existed: the segments from the damage on are
  moved to ``quarantine/``, and their offsets may be given to new records.
- A segment in a format version this code does not know stops the open with a
  :class:`StorageError` and nothing is changed, unless a later segment is in this code's
  version: then its version field is damaged (an older rsnet never goes on past a newer
  segment), and it is a damaged header. A damaged header costs only the offsets whose
  records are damaged too: its records are found after it by their frames, as past any
  damage (the active segment's end where its intact records do, as always); what the header
  alone held (the producers' sequences as of the segment's creation) is lost. On the active
  segment that needs one intact record after the header, or else the ``synced`` mark (above):
  it used to stop the open however many followed, and one flipped bit in a one-segment
  topic's header cost all of its records under ``unclean_recovery``. ``unclean_recovery`` treats an unknown version on the newest
  segment as damage.

Compared with Kafka: its log recovery truncates at the first invalid batch, and only scans
the segments written since the last flush checkpoint (damage older than that is found when a
consumer reads it, as a CorruptRecordException); its ``unclean`` settings are the operator's
explicit acceptance of loss, which ``unclean_recovery`` mirrors. JetStream's file store drops
a bad message when it rebuilds a block, keeps the rest and lists the lost sequences in the
stream's state (``lost``), as damaged ranges do here.

Files are changed only after the scan, and everything kept is fsynced (unless NEVER), so
``durable_offset`` starts at ``next_offset``. The :class:`RecoveryReport` names every segment
touched, the byte and offset of the damage, what was wrong and where the copy is; its
``damaged_ranges`` are the log's ``damaged_ranges``. Producers' highest sequences and last-write
times are rebuilt from the last segment's header (a snapshot of the producers remembered when
it was created) and the records after it, so idempotency, and its bounds, survive restarts.

Storage failures
----------------
Every change to a file goes through ``files.FileOps`` (tests inject ENOSPC and EIO there). A
write the file system refuses is cut off and ``append`` raises :class:`WriteFailed`
(``full`` for ENOSPC/EDQUOT) with the log as it was before the call. A failed fsync rolls the
log back to its last sync point (cut and synced again, state rewound), since the kernel may
have dropped the pages it could not write; none of it was acknowledged. An fsync run in a
worker thread fails the same way, when ``finish_sync`` is given its error: everything written
since the last successful sync is cut, including what was appended while it ran. Either way the log
goes on: the next ``append`` works once the disk does. Only if that cut fails too does the
log refuse writes (:class:`LogFailed`) until ``repair()`` has scanned its files again; reads
are served throughout.

Retention
---------
See :class:`Retention`. ``enforce_retention(now_ms)`` is called by the broker; MemoryLog drops
exactly the expired records, SegmentLog whole segments whose records have all expired, so it
keeps up to one segment more than the limits ask. Producers are bounded apart from records:
at most ``max_producers``, none older than ``producer_max_age_ms``, the least recently written
forgotten first (by ``append`` and by ``enforce_retention``).

Known limits
------------
Opening decodes the active segment and any sealed segment without a usable sidecar; every
other sealed segment is only read through once to check its CRC-32 against its sidecar, so
opening costs about one read of the log plus one decode of the active segment. Every new
segment's header lists the producers remembered (up to ``max_producers``: with 10,000 ids of
255 characters, about 2.7 MB per segment).
"""

from .cursors import CursorStore
from .log import (
    CorruptData,
    DamagedRange,
    FsyncPolicy,
    LogFailed,
    OffsetBeyondEnd,
    OffsetDamaged,
    OffsetTrimmed,
    PendingSync,
    Retention,
    StorageError,
    TopicLog,
    UncleanRecoveryNeeded,
    WriteFailed,
)
from .memory import MemoryLog
from .records import Record
from .segments import DEFAULT_SEGMENT_BYTES, RecoveryReport, SegmentLog

__all__ = [
    "DEFAULT_SEGMENT_BYTES",
    "CorruptData",
    "CursorStore",
    "DamagedRange",
    "FsyncPolicy",
    "LogFailed",
    "MemoryLog",
    "OffsetBeyondEnd",
    "OffsetDamaged",
    "OffsetTrimmed",
    "PendingSync",
    "Record",
    "RecoveryReport",
    "Retention",
    "SegmentLog",
    "StorageError",
    "TopicLog",
    "UncleanRecoveryNeeded",
    "WriteFailed",
]
