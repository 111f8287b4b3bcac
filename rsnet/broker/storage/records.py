"""The bytes of one stored record, and the frame every stored thing is written in.

A frame is ``length`` (u32, big-endian) | ``crc`` (u32, big-endian) | ``body`` (``length``
bytes), where ``crc`` is CRC-32 (``zlib.crc32``) of the four length bytes followed by the body:
a flipped bit in the length is caught like one in the body. A record's body is the msgpack
array ``[offset, timestamp_ms, value, producer, sequence]``. Carrying the offset in every
record lets recovery prove the log contiguous instead of trusting positions.

Values are what the wire protocol carries (``rsnet.protocol.codec``): any msgpack value
except nil, with map keys that are strings or binary. Each value is decoded again right after
encoding, so what ``append`` accepts is exactly what ``read`` can give back, and a value a
subscriber's decoder would refuse is refused here, at the producer.

This module imports msgpack and the standard library only.
"""

from __future__ import annotations

import dataclasses
import struct
import zlib
from typing import Any

import msgpack

FRAME_HEAD = struct.Struct(">II")
"""``length`` and ``crc`` of a frame."""

MAX_BODY_BYTES = 64 << 20
"""Largest body a frame may hold: a larger length field is damage, not a record."""

MAX_VALUE_LEVELS = 509
"""Deepest a record's value may nest, a scalar counting as one level, as SPEC 3 counts: a frame
nests at most 512 levels, and a subscriber receives the value three levels down (the BATCH
frame, its list of items, the record map or array). A deeper value could be stored but not
delivered (a conforming receiver may refuse the frame, and the JavaScript client does, which
ends its connection), so it is refused at the producer."""

_NOT_CONTAINER_HEADERS = bytes(b for b in range(256) if not (0x80 <= b <= 0x9F or 0xDC <= b <= 0xDF))
"""Every byte value but those of map and array headers (fixmap, fixarray, 16 and 32 bits)."""

MAX_INT64 = 2**63 - 1
MIN_INT64 = -(2**63)


@dataclasses.dataclass(frozen=True, slots=True)
class Record:
    """One record of a topic's log, as ``read`` returns it."""

    offset: int
    """Position in the topic: contiguous from 0."""
    timestamp_ms: int
    """Broker time when the record was appended."""
    value: Any
    """Any msgpack value except None."""
    producer: str | None
    """Producer id, half of the idempotency key; None if the producer gave none."""
    sequence: int | None
    """The producer's own sequence number, the other half; None if not given."""


class BadRecord(ValueError):
    """Bytes that are not a well-formed frame or record body; the message says what is wrong."""


def new_packer() -> msgpack.Packer:
    """The packer records are encoded with (str as str, bytes as bin), as the wire protocol's."""
    return msgpack.Packer(use_bin_type=True)


def unpack(body: bytes | memoryview) -> Any:
    """Decode one msgpack value as the wire protocol does (``raw=False``, ``strict_map_key``).

    Those are msgpack's defaults (since 1.0, and pyproject requires more): spelling them
    out costs 10% of decoding a small record, so they are not passed.
    """
    return msgpack.unpackb(body)


_UINT_WIDTHS = {0xCC: 1, 0xCD: 2, 0xCE: 4, 0xCF: 8}  # msgpack's uint 8/16/32/64 markers


def stored_offset(body: bytes) -> int | None:
    """The offset in a record's ``body``, read from its first bytes without decoding the rest;
    None if the body does not start as a record does (a 5-element array, then a uint)."""
    if len(body) < 2 or body[0] != 0x95:
        return None
    first = body[1]
    if first < 0x80:  # positive fixint
        return first
    width = _UINT_WIDTHS.get(first)
    return None if width is None else int.from_bytes(body[2 : 2 + width], "big")


def frame(body: bytes) -> bytes:
    """``body`` framed: length, CRC, body."""
    length = len(body).to_bytes(4, "big")
    return length + zlib.crc32(body, zlib.crc32(length)).to_bytes(4, "big") + body


def check_frame(data: bytes | memoryview | bytearray, position: int) -> Any:
    """The body of the frame at ``position`` in ``data``, its length and CRC checked: a
    slice of ``data`` (a copy from bytes, which decodes twice as fast as a memoryview).

    Raises :class:`BadRecord` saying what is wrong: cut off (``data`` ends inside the frame),
    an impossible length, or a CRC mismatch.
    """
    try:
        length, crc = FRAME_HEAD.unpack_from(data, position)
    except struct.error:
        available = max(0, len(data) - position)
        raise BadRecord(f"frame cut off: {available} of the {FRAME_HEAD.size} header bytes present") from None
    if length == 0 or length > MAX_BODY_BYTES:
        raise BadRecord(f"impossible frame length {length}")
    start = position + FRAME_HEAD.size
    body = data[start : start + length]
    if len(body) < length:
        raise BadRecord(f"frame cut off: its length says {length} body bytes, {len(body)} present")
    if zlib.crc32(body, zlib.crc32(data[position : position + 4])) != crc:
        raise BadRecord(f"CRC mismatch (stored {crc:#010x}) over a frame of {length} body bytes")
    return body


def encode_record(
    packer: msgpack.Packer,
    offset: int,
    timestamp_ms: int,
    value: Any,
    producer: str | None,
    sequence: int | None,
    max_bytes: int = MAX_BODY_BYTES,
) -> bytes:
    """The framed record; raises TypeError (not a msgpack type) or ValueError (anything else
    that cannot be stored: None, a str that is not UTF-8, a map key that is not str or bytes,
    an int beyond 64 bits, a body over ``max_bytes``)."""
    if value is None:
        raise ValueError("None cannot be stored: a record's value is any msgpack value except nil")
    try:
        body = packer.pack([offset, timestamp_ms, value, producer, sequence])
        fields = unpack(body)  # what cannot be read back must not be written
    except (TypeError, ValueError, OverflowError) as exc:  # a type msgpack lacks; a bad str, key or int
        raise (TypeError if isinstance(exc, TypeError) else ValueError)(
            f"value cannot be stored as msgpack: {exc}"
        ) from exc
    # Every level below the value is a map or array header, one byte at least, so only a body
    # with more bytes that could be such headers than the limit can nest too deep: small
    # records pay one comparison, and a long map or list one count in C before any walk.
    value = fields[2]
    if (
        len(body) > MAX_VALUE_LEVELS
        and type(value) in (list, dict)
        and len(body.translate(None, _NOT_CONTAINER_HEADERS)) > MAX_VALUE_LEVELS
        and _nests_deeper(value, MAX_VALUE_LEVELS)
    ):
        raise ValueError(
            f"value nests deeper than {MAX_VALUE_LEVELS} levels, so no subscriber could be sent it "
            "(SPEC 3: a frame nests at most 512 levels, and a delivered record is 3 levels down)"
        )
    if len(body) > max_bytes:
        raise ValueError(f"record too large: {len(body)} bytes encoded, at most {max_bytes}")
    return frame(body)


def _nests_deeper(value: Any, limit: int) -> bool:
    """Whether ``value`` (as msgpack decodes: lists, dicts, scalars) nests deeper than ``limit``
    levels, a scalar counting as one. Iterative: the value may be deeper than Python recurses."""
    if type(value) is not list and type(value) is not dict:
        return limit < 1
    stack = [(value, 1)]
    while stack:
        item, level = stack.pop()
        children = item.values() if type(item) is dict else item
        for child in children:
            if level == limit:  # any element is one level too many
                return True
            if type(child) is list or type(child) is dict:
                stack.append((child, level + 1))
    return False


def decode_record(body: bytes | memoryview) -> Record:
    """The record a checked frame body holds; raises :class:`BadRecord` if it is not one."""
    return Record(*decode_fields(body))


def decode_fields(body: bytes | memoryview) -> list[Any]:
    """``[offset, timestamp_ms, value, producer, sequence]``, checked as :func:`decode_record` does."""
    try:
        fields = unpack(body)
    except Exception as exc:  # any decoder failure means the bytes are not a record
        raise BadRecord(f"body is not msgpack: {exc}") from None
    if type(fields) is not list or len(fields) != 5:
        raise BadRecord("body is not a 5-element record array")
    offset, timestamp_ms, value, producer, sequence = fields
    if (
        type(offset) is not int
        or offset < 0
        or type(timestamp_ms) is not int
        or not MIN_INT64 <= timestamp_ms <= MAX_INT64
        or value is None
        or not (producer is None or type(producer) is str)
        or not (sequence is None or (type(sequence) is int and sequence >= 0 and producer is not None))
    ):
        raise BadRecord("record fields have the wrong types")
    return fields
