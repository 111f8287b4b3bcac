"""How far a log was ever synced: a trace of acknowledged records kept outside the segments.

Recovery knows what the segments hold, not what they held: a damaged last record reads like a
torn write, and a deleted newest segment leaves no trace at all. Either way the records would
be cut or missing without a word, and their offsets given to new records, though they may
have been acknowledged. So a durable log (``always``, ``interval``) writes, after every sync
that succeeded, the offset below which everything is synced, into the file ``synced`` next to
its segments; recovery then refuses (:class:`UncleanRecoveryNeeded`) to end the log before it.

The mark is written after the fsync it reports has returned, and is not itself fsynced: an OS
crash may lose its latest writes, leaving it lower than it could be (less is checked), never
higher than what is durable (nothing acknowledged is ever claimed that was not synced). A
process crash loses nothing the OS has. It costs one small file write per sync. The file is
16 bytes: ``RSHW``, the offset (unsigned 64-bit, big-endian) and the CRC-32 of those 12 bytes.
A file that does not check is reported and not used. An empty or all-zero file is what an OS
crash leaves of a mark whose first write never reached the disk: *blank*, no evidence either
way. Any other file that does not check was damaged, and so may have covered the log's last
record: recovery then does not cut a partial last record as a torn write (recovery.py). Under
``never`` no mark is kept (an OS crash may take back acknowledged records there by definition)
and one left over is removed.
"""

from __future__ import annotations

import os
import struct
import zlib
from typing import NamedTuple

from .files import FileOps

MARK_NAME = "synced"
_MAGIC = b"RSHW"
_LAYOUT = struct.Struct(">4sQ")


def encode(offset: int) -> bytes:
    body = _LAYOUT.pack(_MAGIC, offset)
    return body + struct.pack(">I", zlib.crc32(body))


class Mark(NamedTuple):
    """What :func:`read` found."""

    offset: int | None
    """Every record below it was synced; None if there is no usable mark."""
    problem: str | None = None
    """Why a mark file was not used; None if there is none, or it was used."""
    damaged: bool = False
    """The file holds bytes that are not a mark, or cannot be read: it may have covered any
    record. False for a blank file (see the module docstring)."""


def read(directory: str) -> Mark:
    """The mark in ``directory``, if there is one and it checks."""
    try:
        with open(os.path.join(directory, MARK_NAME), "rb") as file:
            data = file.read(17)
    except FileNotFoundError:
        return Mark(None)
    except OSError as exc:  # not a file (a directory, say) or unreadable: reported, not fatal
        return Mark(None, f"{MARK_NAME}: cannot be read ({exc.strerror or exc})", damaged=True)
    if not data.strip(b"\0"):
        return Mark(None, f"{MARK_NAME}: blank ({len(data)} bytes, all zero): its first write did not reach the disk")
    if len(data) != 16:
        return Mark(None, f"{MARK_NAME}: {len(data)} bytes, not 16", damaged=True)
    magic, offset = _LAYOUT.unpack_from(data)
    if magic != _MAGIC or struct.unpack_from(">I", data, 12)[0] != zlib.crc32(data[:12]):
        return Mark(None, f"{MARK_NAME}: the bytes do not check (magic or CRC)", damaged=True)
    return Mark(offset)


def write(ops: FileOps, directory: str, offset: int) -> None:
    """Record that every record below ``offset`` is synced (overwriting the 16 bytes in place).
    Raises OSError as the write does."""
    fd = ops.open(os.path.join(directory, MARK_NAME), os.O_WRONLY | os.O_CREAT)
    try:
        ops.write_all(fd, encode(offset))
    finally:
        os.close(fd)
