"""How far a log was ever synced, and where retention last cut it: a trace of acknowledged
records kept outside the segments.

Recovery knows what the segments hold, not what they held: a damaged last record reads like a
torn write, a deleted newest segment leaves no trace at all, and a deleted oldest segment
looks like retention's work. Either way the records would be cut or missing without a word,
and (at the end) their offsets given to new records, though they may have been acknowledged.
So a durable log (``always``, ``interval``) writes, after every sync that succeeded, the offset
below which everything is synced, into the file ``synced`` next to its segments, with the
offset its records start at; recovery then refuses (:class:`UncleanRecoveryNeeded`) to end the
log before the first, and reports records missing after the second as damage.

The synced offset is written after the fsync it reports has returned, and the mark is not
fsynced for it: an OS crash may lose its latest writes, leaving it lower than it could be
(less is checked), never higher than what is durable (nothing acknowledged is ever claimed
that was not synced). A process crash loses nothing the OS has. The start offset is the other
way round: a lost write would leave it lower than the log's real start, and a segment
retention deleted would then read as lost. So retention writes its new start into the mark
and fsyncs the mark (on a worker thread, in the broker) before it deletes a segment
(``SegmentLog.prepare_retention``).

The mark is kept twice, in ``synced`` and ``synced.copy``, each written and synced alike,
because it is the only evidence of which records at the end were acknowledged: with one file,
its damage or deletion together with records missing at the end (a second fault) lost those
records unreported and gave their offsets to new ones; now that takes both files and the
records. It costs two small file writes per sync. Both offsets only move up as the log goes
on, so of two files that check, the larger of each is the later write (a crash between the
two writes leaves one a sync behind): recovery takes it. (An advance or an unclean recovery
writes a lower synced offset; a crash between those two writes can leave the older, higher
one, whose records are then reported as a damaged range: never an offset given again.)

Each file is 24 bytes: ``RSHX``, the synced offset and the start offset (unsigned 64-bit,
big-endian each) and the CRC-32 of those 20 bytes. A 16-byte mark (``RSHW``, the synced
offset, its CRC: written before start offsets were kept) is read with no start offset.
A file that does not check is reported and not used. An empty or all-zero file is what an OS
crash leaves of a mark whose first write never reached the disk: *blank*, no evidence either
way. Any other file that does not check was damaged, and so may have covered the log's last
record: unless the other file checks, recovery then does not cut a partial last record as a
torn write (recovery.py). A mark from before the copy was kept is the one file, and the copy
is written at the next sync. Under ``never`` no mark is kept (an OS crash may take back
acknowledged records there by definition) and one left over is removed.
"""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Callable
from typing import NamedTuple

from .files import FileOps

MARK_NAME = "synced"
COPY_NAME = "synced.copy"
MARK_NAMES = (MARK_NAME, COPY_NAME)
"""The mark and its copy, written and synced alike (see the module docstring)."""
_MAGIC = b"RSHX"
_LAYOUT = struct.Struct(">4sQQ")
_MAGIC_1 = b"RSHW"  # the first layout: no start offset
_LAYOUT_1 = struct.Struct(">4sQ")


def encode(offset: int, first: int) -> bytes:
    body = _LAYOUT.pack(_MAGIC, offset, first)
    return body + struct.pack(">I", zlib.crc32(body))


class Mark(NamedTuple):
    """What :func:`read` found."""

    offset: int | None
    """Every record below it was synced; None if there is no usable mark."""
    first: int | None = None
    """No record below it is kept (retention deleted them); None if the mark does not say."""
    problem: str | None = None
    """Why each file of the mark that is there was not used, or that ``synced`` is missing beside
    its copy, named; None if there is nothing to say."""
    damaged: bool = False
    """No file could be used, and one holds bytes that are not a mark, or cannot be read: it
    may have covered any record. False for a blank file (see the module docstring)."""


def read(directory: str) -> Mark:
    """The mark in ``directory``: the larger of each offset its files that check hold (the
    later write: see the module docstring), with the problems of those that do not."""
    found = [_read_file(directory, name) for name in MARK_NAMES]
    if found[0] == Mark(None) and found[1] != Mark(None):
        # Written first, so never missing beside its copy but by a fault (a crash, a hand).
        # The copy missing beside it is what a log written before the copy was kept has.
        found[0] = Mark(None, problem=f"{MARK_NAME}: missing beside {COPY_NAME}")
    problems = "; ".join(mark.problem for mark in found if mark.problem is not None) or None
    offsets = [mark.offset for mark in found if mark.offset is not None]
    if not offsets:
        return Mark(None, problem=problems, damaged=any(mark.damaged for mark in found))
    firsts = [mark.first for mark in found if mark.first is not None]
    return Mark(max(offsets), max(firsts) if firsts else None, problems)


def _read_file(directory: str, name: str) -> Mark:
    try:
        with open(os.path.join(directory, name), "rb") as file:
            data = file.read(_LAYOUT.size + 5)
    except FileNotFoundError:
        return Mark(None)
    except OSError as exc:  # not a file (a directory, say) or unreadable: reported, not fatal
        return Mark(None, problem=f"{name}: cannot be read ({exc.strerror or exc})", damaged=True)
    if not data.strip(b"\0"):
        return Mark(
            None, problem=f"{name}: blank ({len(data)} bytes, all zero): its first write did not reach the disk"
        )
    for magic, layout in ((_MAGIC, _LAYOUT), (_MAGIC_1, _LAYOUT_1)):
        if len(data) == layout.size + 4 and data.startswith(magic):
            if struct.unpack_from(">I", data, layout.size)[0] != zlib.crc32(data[: layout.size]):
                break
            _, offset, *first = layout.unpack_from(data)
            return Mark(offset, first[0] if first else None)
    else:
        return Mark(None, problem=f"{name}: {len(data)} bytes, not a mark", damaged=True)
    return Mark(None, problem=f"{name}: the bytes do not check (CRC)", damaged=True)


def write(ops: FileOps, directory: str, offset: int, first: int) -> None:
    """Record that every record below ``offset`` is synced and none below ``first`` is kept,
    in both files (overwriting each in place). Raises the first OSError a write raised, after
    trying both: one written is evidence still."""
    data = encode(offset, first)
    _each(ops, directory, os.O_WRONLY | os.O_CREAT, lambda fd: ops.write_all(fd, data))


def sync(ops: FileOps, directory: str) -> None:
    """Make what the mark holds durable, in both files. Raises OSError as an fsync does."""
    _each(ops, directory, os.O_RDONLY, ops.datasync)


def _each(ops: FileOps, directory: str, flags: int, action: Callable[[int], object]) -> None:
    failure: OSError | None = None
    for name in MARK_NAMES:
        try:
            fd = ops.open(os.path.join(directory, name), flags)
            try:
                action(fd)
            finally:
                os.close(fd)
        except OSError as exc:
            failure = failure or exc
    if failure is not None:
        raise failure
