"""Sidecars: what scanning a sealed segment at open would rebuild, stored next to it.

When a segment is sealed, ``SegmentLog`` writes ``NAME.idx`` (temporary, fsynced unless
NEVER, renamed) before the next segment is created, so every sealed segment normally has one::

    b"rsnetidx" | version (u32, big-endian, = 1)
    frame (length, CRC-32, msgpack map; see records.py), nothing after it:
      base_offset, next_offset   the segment's records are base_offset .. next_offset-1
      size, crc                  the segment file's byte length and CRC-32 of all of it
      max_timestamp              highest record timestamp (retention by age, offset_for_timestamp)
      sequences                  {producer: highest sequence among this segment's records}
      index                      bin: the sparse index, (offset, position, highest timestamp so
                                 far) as three big-endian int64 per entry

At open a sealed segment is taken from its sidecar (:func:`trust`) only if the sidecar is
whole (magic, version, CRC, well-formed fields) and the segment file has exactly ``size``
bytes with exactly ``crc``: it is read through once for the CRC (gigabytes per second) but no
record is decoded. Otherwise (missing, damaged, unknown version, size or CRC mismatch) it is
scanned as if sidecars did not exist. A sidecar therefore never changes what recovery keeps,
only how fast it gets there.

This module imports msgpack, the standard library and this package only.
"""

from __future__ import annotations

import operator
import os
import re
import struct
import sys
from array import array
from typing import Any

import msgpack

from .files import FileOps, replace_atomically, unlink_if_present
from .records import FRAME_HEAD, BadRecord, check_frame, frame, unpack
from .segment_file import PREAMBLE, Scan, Segment, file_crc, read_header

SIDECAR_MAGIC = b"rsnetidx"
SIDECAR_VERSION = 1
SIDECAR_NAME = re.compile(r"(\d{20})\.idx")
SIDECAR_KEYS = frozenset({"base_offset", "next_offset", "size", "crc", "max_timestamp", "sequences", "index"})
INDEX_ENTRY = struct.Struct(">qqq")
"""One sparse index entry in a sidecar: offset, file position, highest timestamp so far."""


def sidecar_name(base_offset: int) -> str:
    return f"{base_offset:020d}.idx"


def sidecar_path(segment_path: str) -> str:
    return segment_path[: -len(".log")] + ".idx"


def write(ops: FileOps, segment: Segment, durable: bool) -> None:
    """Write ``segment``'s sidecar (temporary, synced if ``durable``, renamed into place).

    Best effort: the sidecar only saves the next open a scan, so a failure to write it (a
    full disk, say) leaves no sidecar and is not an error of the log. The caller syncs the
    directory entry. A segment without a known CRC, or without records, gets none.
    """
    if segment.crc is None or not segment.records:
        return
    path = sidecar_path(segment.path)
    try:
        replace_atomically(ops, path, sidecar_bytes(segment), durable)
    except OSError:
        unlink_if_present(ops, path, quiet=True)  # never leave an older sidecar in its place


def sidecar_bytes(segment: Segment) -> bytes:
    """The sidecar of a sealed segment (see the module docstring for the format)."""
    offsets, positions, maxima = segment.index()
    entries = array("q", bytes(INDEX_ENTRY.size * len(offsets)))
    entries[0::3] = offsets
    entries[1::3] = positions
    entries[2::3] = maxima
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


def parse(data: bytes, base_offset: int) -> dict[str, Any]:
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
    except Exception as exc:  # any decoder failure means the bytes are not a sidecar
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


def trust(path: str, base_offset: int) -> tuple[Scan | None, str]:
    """What scanning the sealed segment at ``path`` would find, taken from its sidecar; or
    (None, why not) if the sidecar is missing, damaged, or does not match the segment.

    The sidecar is used only if the segment file is exactly as it was when sealed: the same
    size and the same CRC-32 over every byte (read through, but not decoded). A segment
    changed since (bit rot, a hand edit, a write lost in a power failure under NEVER) is
    scanned, so the sidecar never changes what recovery keeps. Raises StorageError, like
    ``segment_file.scan``, for a segment format version this code does not know.
    """
    try:
        with open(sidecar_path(path), "rb") as file:
            data = file.read()
    except FileNotFoundError:
        return None, "missing"
    except OSError as exc:
        return None, f"unreadable ({exc})"
    try:
        facts = parse(data, base_offset)
    except BadRecord as exc:
        return None, str(exc)
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        found = Scan(path, base_offset, os.fstat(fd).st_size)
        if found.file_bytes != facts["size"]:
            return None, f"says the segment is {facts['size']} bytes, but it is {found.file_bytes}"
        if read_header(fd, found) is None:
            return None, "the segment's header is unreadable"
        offsets, positions, maxima = facts["index"]
        if positions[0] != found.segment.size:
            return (
                None,
                f"its first index entry is at byte {positions[0]}, but the records start at {found.segment.size}",
            )
        if file_crc(fd, path, found.file_bytes) != facts["crc"]:
            return None, "the segment's bytes do not match the CRC-32 recorded when it was sealed"
    finally:
        os.close(fd)
    segment = found.segment
    segment.size = found.valid_bytes = found.file_bytes
    segment.next_offset = facts["next_offset"]
    segment.max_timestamp = facts["max_timestamp"]
    segment.crc = facts["crc"]
    segment.load_index(offsets, positions, maxima)
    found.sequences = facts["sequences"]
    found.from_sidecar = True
    return found, ""
