"""A small file holding one map of names to offsets, checked as a record is: the cursors of a
topic (``cursors.py``) and the next offsets of deleted topics (``broker/retired.py``).

The file is an 8-byte magic of its kind | version (u32, big-endian, = 1) | one frame
(``records.py``) whose body is the msgpack map ``{name: offset}``. Each kind replaces the
whole file the safe way (write ``PATH.tmp``, fsync it, rename it over ``PATH``, fsync the
directory), so a file that fails its check was damaged after it was written.

This module imports msgpack and the standard library only.
"""

from __future__ import annotations

import os
import struct

import msgpack

from .files import FileOps, replace_atomically
from .log import CorruptData
from .records import BadRecord, check_frame, frame, unpack

FORMAT_VERSION = 1
PREAMBLE = struct.Struct(">8sI")


def encode(magic: bytes, offsets: dict[str, int]) -> bytes:
    """The file's bytes for ``offsets``."""
    return PREAMBLE.pack(magic, FORMAT_VERSION) + frame(msgpack.packb(offsets, use_bin_type=True))


def write(ops: FileOps, path: str, magic: bytes, offsets: dict[str, int]) -> None:
    """Make ``path`` hold ``offsets``, durably (the file, then its directory entry, synced);
    raises OSError as the file operations do, ``path`` then unchanged."""
    replace_atomically(ops, path, encode(magic, offsets), durable=True)
    ops.sync_directory(os.path.dirname(path))


def decode(path: str, data: bytes, magic: bytes, kind: str) -> dict[str, int]:
    """The map in ``data`` (read from ``path``, a ``kind`` file). Raises :class:`CorruptData`
    naming the file, the byte and the problem if it does not check."""
    if len(data) < PREAMBLE.size or not data.startswith(magic):
        raise CorruptData(path, 0, f"not a {kind} file (wrong magic bytes or cut off)")
    _, version = PREAMBLE.unpack_from(data)
    if version != FORMAT_VERSION:
        raise CorruptData(path, 8, f"{kind} file format version {version}; this rsnet reads {FORMAT_VERSION}")
    try:
        body = check_frame(data, PREAMBLE.size)
    except BadRecord as exc:
        raise CorruptData(path, PREAMBLE.size, str(exc)) from None
    if PREAMBLE.size + 8 + len(body) != len(data):
        raise CorruptData(path, PREAMBLE.size + 8 + len(body), f"extra bytes after the {kind}s")
    try:
        offsets = unpack(body)
    except Exception as exc:  # any decoder failure: the checked bytes are still not offsets
        raise CorruptData(path, PREAMBLE.size + 8, f"not msgpack: {exc}") from None
    if not isinstance(offsets, dict) or not all(
        type(name) is str and type(offset) is int and offset >= 0 for name, offset in offsets.items()
    ):
        raise CorruptData(path, PREAMBLE.size + 8, "not a map of names to offsets")
    return offsets
