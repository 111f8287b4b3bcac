"""One segment file: its format, its in-memory index, and reading it through frame by frame.

A segment file is::

    b"rsnetlog" | version (u32, big-endian, = 1)
    header frame: {"base_offset": int, "producers": {producer id: highest sequence},
                   "written": {producer id: timestamp of its latest records}}
    record frame, record frame, ...        (frames and record bodies: see records.py)

It is named by its first offset (20 digits, ``.log``). The header carries the producers'
sequences as they were when the segment was created (see ``segments.py`` for why), and when
each last wrote (``written``, for their age bound; segments from before it have none). A new
segment is written to ``NAME.log.tmp``, synced and renamed into place (:func:`create`), so a
segment file that exists always has a whole header.

:class:`Segment` is one segment's place in the log and its sparse index: one entry per
``INDEX_INTERVAL_BYTES`` of records (offset, file position, highest timestamp so far), built
while scanning and while appending; a read seeks to the entry at or before its offset and
scans forward from there. :func:`scan` reads a file through and says where its valid records
end; :func:`frames` is the one loop that walks frames in a file.

This module imports msgpack, the standard library and this package only.
"""

from __future__ import annotations

import bisect
import dataclasses
import os
import re
import struct
import zlib
from array import array
from collections.abc import Iterator
from typing import Any

import msgpack

from .files import FileOps, replace_atomically
from .log import ProducerState
from .records import FRAME_HEAD, BadRecord, check_frame, decode_fields, frame, stored_offset, unpack

MAGIC = b"rsnetlog"
FORMAT_VERSION = 1
PREAMBLE = struct.Struct(">8sI")
"""Magic and format version, the first bytes of every segment (and sidecar) file."""

INDEX_INTERVAL_BYTES = 4096
"""Bytes of records between two index entries: a read scans at most about this much first."""
SCAN_CHUNK = 1 << 20

SEGMENT_NAME = re.compile(r"(\d{20})\.log")
NO_TIMESTAMP = -(2**63) - 1  # below every timestamp: the highest timestamp of an empty segment
MIN_FRAME_BYTES = FRAME_HEAD.size + 6
"""The smallest framed record: a 5-element array of one-byte fields."""


@dataclasses.dataclass(frozen=True, slots=True)
class Damage:
    """Offsets ``first`` .. ``end - 1`` of a segment are unreadable: bytes ``start`` .. ``stop - 1``
    of its file hold them, damaged as ``problem`` says. The record at ``end`` (if any) is intact."""

    first: int
    end: int
    start: int
    stop: int
    problem: str


def segment_name(base_offset: int) -> str:
    return f"{base_offset:020d}.log"


class Segment:
    """One segment file's place in the log and its sparse index (in memory)."""

    __slots__ = (
        "_indexed_at",
        "_maxima",
        "_offsets",
        "_positions",
        "base_offset",
        "crc",
        "damage",
        "max_timestamp",
        "next_offset",
        "path",
        "sequences",
        "size",
    )

    def __init__(self, path: str, base_offset: int, header_bytes: int) -> None:
        self.path = path
        self.base_offset = base_offset
        self.size = header_bytes  # bytes of the file that hold the header and whole records
        self.next_offset = base_offset
        self.max_timestamp = NO_TIMESTAMP
        self.crc: int | None = None  # CRC-32 of the file's first ``size`` bytes, None if unknown
        self.sequences: dict[str, int] = {}  # highest per producer in its records (active segment only)
        self.damage: list[Damage] = []  # unreadable offsets inside it, in order (found by recovery)
        self._offsets = array("q")
        self._positions = array("q")
        self._maxima = array("q")  # highest timestamp up to and including the entry's record
        self._indexed_at = -INDEX_INTERVAL_BYTES

    @property
    def records(self) -> int:
        return self.next_offset - self.base_offset

    def add(self, position: int, timestamp_ms: int, length: int) -> None:
        """The record with offset ``next_offset`` is at ``position``, ``length`` bytes long."""
        if timestamp_ms > self.max_timestamp:
            self.max_timestamp = timestamp_ms
        if position - self._indexed_at >= INDEX_INTERVAL_BYTES:
            self._offsets.append(self.next_offset)
            self._positions.append(position)
            self._maxima.append(self.max_timestamp)
            self._indexed_at = position
        self.next_offset += 1
        self.size = position + length

    def skip_damage(self, damage: Damage) -> None:
        """Offsets ``next_offset`` .. ``damage.end - 1`` are damaged; the next record added (if
        any) is the one with offset ``damage.end``, and gets an index entry of its own so a
        read of it or after it never scans through the damage."""
        self.damage.append(damage)
        self.next_offset = damage.end
        self._indexed_at = -INDEX_INTERVAL_BYTES

    def checkpoint(self) -> tuple[int, int, int | None, int, int, int, dict[str, int]]:
        """What appending changes, to :meth:`rewind` to after a failed fsync."""
        return (
            self.next_offset,
            self.size,
            self.crc,
            self.max_timestamp,
            len(self._offsets),
            self._indexed_at,
            dict(self.sequences),
        )

    def rewind(self, checkpoint: tuple[int, int, int | None, int, int, int, dict[str, int]]) -> None:
        """Forget every record added since ``checkpoint`` was taken."""
        self.next_offset, self.size, self.crc, self.max_timestamp, entries, self._indexed_at, sequences = checkpoint
        self.sequences = dict(sequences)
        del self._offsets[entries:], self._positions[entries:], self._maxima[entries:]

    def locate(self, offset: int) -> tuple[int, int]:
        """(offset, position) of the indexed record at or before ``offset``."""
        entry = bisect.bisect_right(self._offsets, offset) - 1
        return self._offsets[entry], self._positions[entry]

    def locate_timestamp(self, timestamp_ms: int) -> tuple[int, int]:
        """(offset, position) of an indexed record at or before the first with a timestamp >= t."""
        entry = max(bisect.bisect_left(self._maxima, timestamp_ms) - 1, 0)
        return self._offsets[entry], self._positions[entry]

    def index(self) -> tuple[array[int], array[int], array[int]]:
        """The sparse index: offsets, positions, highest timestamps so far (one entry each)."""
        return self._offsets, self._positions, self._maxima

    def load_index(self, offsets: array[int], positions: array[int], maxima: array[int]) -> None:
        """Take a sparse index built earlier (from a sidecar) instead of building it."""
        self._offsets, self._positions, self._maxima = offsets, positions, maxima
        self._indexed_at = positions[-1]


def create(
    ops: FileOps, directory: str, base_offset: int, producers: dict[str, ProducerState], durable: bool
) -> Segment:
    """Write a new segment file holding only its header (temporary, synced if ``durable``,
    renamed into place) and return it; the caller syncs the directory."""
    path = os.path.join(directory, segment_name(base_offset))
    fields = {
        "base_offset": base_offset,
        "producers": {producer: state.sequence for producer, state in producers.items()},
        "written": {producer: state.written_ms for producer, state in producers.items()},
    }
    header = PREAMBLE.pack(MAGIC, FORMAT_VERSION) + frame(msgpack.packb(fields, use_bin_type=True))
    replace_atomically(ops, path, header, durable)
    segment = Segment(path, base_offset, len(header))
    segment.crc = zlib.crc32(header)
    return segment


@dataclasses.dataclass
class Scan:
    """What scanning one segment file (or trusting its sidecar) found."""

    path: str
    base_offset: int
    file_bytes: int
    segment: Segment = None  # type: ignore[assignment]  # left None when the header is unreadable
    header_problem: str | None = None
    header_producers: dict[str, int] | None = None  # None when the header is unreadable
    header_written: dict[str, int] = dataclasses.field(default_factory=dict)  # empty in older segments
    sequences: dict[str, int] = dataclasses.field(default_factory=dict)  # highest per producer in the records
    written: dict[str, int] = dataclasses.field(default_factory=dict)  # its timestamp (scanned segments only)
    problem: str | None = None  # what ended the valid records early
    valid_bytes: int = 0
    from_sidecar: bool = False  # taken from its checked sidecar, not scanned
    unknown_version: int | None = None  # the preamble's format version, if not FORMAT_VERSION

    @property
    def name(self) -> str:
        return os.path.basename(self.path)


def scan(path: str, base_offset: int) -> Scan:
    """Read a segment file through; the valid records end at the first damaged one. An
    unreadable header (a format version this code does not know included) leaves
    ``found.header_problem`` set and no records read: :func:`scan_past_header` may look on."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        found = Scan(path, base_offset, os.fstat(fd).st_size)
        records = read_header(fd, found)
        if records is not None:
            _read_records(fd, found, records)
        return found
    finally:
        os.close(fd)


def intact_past_header(found: Scan) -> bool:
    """Whether an intact record of the segment follows its unreadable header."""
    fd = os.open(found.path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return resync(fd, 0, found.file_bytes, found.base_offset - 1) is not None
    finally:
        os.close(fd)


def scan_past_header(found: Scan, next_base: int | None) -> str | None:
    """A segment whose header is unreadable (``found.header_problem``): find its first intact
    record after the preamble and read on from there, as :func:`scan` does. Offsets from
    ``base_offset`` to that record are a damaged range (with the header's bytes); if no intact
    record is found in a sealed segment, followed by one starting at ``next_base``, the whole
    segment is, up to ``next_base``. The active segment (``next_base`` None) must have one
    (:func:`intact_past_header`). Only what the header alone held is lost otherwise: the
    producers' sequences as of the segment's creation. Returns what to report when no offset
    was lost (the damage is then in the header alone), else None (the damaged range says it)."""
    problem = found.header_problem
    assert problem is not None
    found.header_problem = None
    fd = os.open(found.path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        intact = resync(fd, 0, found.file_bytes, found.base_offset - 1)
        if next_base is not None and (intact is None or intact[1] >= next_base):
            found.segment = Segment(found.path, found.base_offset, found.file_bytes)
            found.segment.skip_damage(Damage(found.base_offset, next_base, 0, found.file_bytes, problem))
            found.valid_bytes = found.file_bytes
            return None
        assert intact is not None, "the active segment's caller checked intact_past_header"
        position, offset = intact
        found.segment = Segment(found.path, found.base_offset, position)
        if offset > found.base_offset:
            found.segment.skip_damage(Damage(found.base_offset, offset, 0, position, f"header: {problem}"))
        _read_records(fd, found, frames(fd, position, found.file_bytes, SCAN_CHUNK))
    finally:
        os.close(fd)
    if offset > found.base_offset:
        return None
    return (
        f"{found.name}: header unreadable (bytes 0 to {position - 1}: {problem}); every record after it is intact "
        "and kept; only the producers' sequences it held as of the segment's creation are lost"
    )


def _read_records(fd: int, found: Scan, records: Iterator[tuple[int, bytes]]) -> None:
    """Read ``found.segment``'s records from ``records`` on, past damaged ones where an intact
    record follows; the valid records end at damage that runs to the end of the file."""
    segment = found.segment
    sequences, written = found.sequences, found.written
    while True:
        try:
            for position, body in records:
                offset, timestamp_ms, _, producer, sequence = decode_fields(body)
                if offset != segment.next_offset:
                    raise BadRecord(f"record holds offset {offset} where {segment.next_offset} was expected")
                segment.add(position, timestamp_ms, FRAME_HEAD.size + len(body))
                if sequence is not None:
                    sequences[producer] = sequence
                    written[producer] = timestamp_ms
            break
        except BadRecord as exc:
            intact = resync(fd, segment.size, found.file_bytes, segment.next_offset)
            if intact is None:  # nothing intact follows: the damage runs to the end of the file
                found.problem = str(exc)
                break
            position, offset = intact
            segment.skip_damage(Damage(segment.next_offset, offset, segment.size, position, str(exc)))
            records = frames(fd, position, found.file_bytes, SCAN_CHUNK)
    found.valid_bytes = segment.size


def resync(fd: int, start: int, end: int, expected: int) -> tuple[int, int] | None:
    """(position, offset) of the first intact record after a damaged one at byte ``start``
    that should have had offset ``expected``; None if none follows before byte ``end``.

    Searches byte by byte. A candidate counts only if its frame checks (length, CRC-32), its
    body is a record, its offset is after ``expected`` by no more records than the skipped
    bytes could have held, and the frame after it is the next record or the end of the
    file: bytes inside a stored value that merely look like a frame are not taken for one.

    Limit: a value that embeds whole framed records with the right offsets (written to fool
    this search) could still be taken for records, but only if damage strikes just before
    it; the CRC-32 alone would not stop that, a stronger check would cost records in logs
    with two damages close together.
    """
    data = os.pread(fd, end - start, start)
    view = memoryview(data)
    size = len(data)
    for here in range(1, size - MIN_FRAME_BYTES + 1):
        if data[here] > 0x04:  # a length's first byte: MAX_BODY_BYTES is 0x04000000
            continue
        # First what costs nothing: the body starts as a record does, with an offset in range.
        # Only then the CRC, over a body up to 64 MiB long. Checking every plausible length
        # first made the search quadratic in large values (an outside check: 20 records of
        # 1 MB of random bytes and one flipped bit held a start for 10 s, 63 for minutes).
        body = here + FRAME_HEAD.size
        if data[body] != 0x95:
            continue
        peeked = stored_offset(data[body : body + 10])
        if peeked is None or not expected < peeked <= expected + here // MIN_FRAME_BYTES:
            continue
        offset = _record_offset(view, here)
        if offset is None or not expected < offset <= expected + here // MIN_FRAME_BYTES:
            continue
        after = here + FRAME_HEAD.size + int.from_bytes(data[here : here + 4], "big")
        if after == size or _record_offset(view, after) == offset + 1:
            return start + here, offset
    return None


def _record_offset(view: memoryview, position: int) -> int | None:
    """The offset of the record framed at ``position``, or None if there is none there."""
    try:
        offset: int = decode_fields(check_frame(view, position))[0]
    except BadRecord:
        return None
    return offset


def read_header(fd: int, found: Scan) -> Iterator[tuple[int, bytes]] | None:
    """Check the segment's preamble and header; then ``found.segment`` holds no records yet and
    the frames after the header are returned. None (and ``found.header_problem`` set) if the
    header is unreadable or of a format version this code does not know (``unknown_version``)."""
    path, base_offset = found.path, found.base_offset
    preamble = os.pread(fd, PREAMBLE.size, 0)
    if len(preamble) < PREAMBLE.size or not preamble.startswith(MAGIC):
        if MAGIC.startswith(preamble[: len(MAGIC)]):
            found.header_problem = f"header cut off at byte {len(preamble)}"
        else:
            found.header_problem = "not a segment file (wrong magic bytes at byte 0)"
        return None
    _, version = PREAMBLE.unpack(preamble)
    if version != FORMAT_VERSION:  # written by another rsnet, or damaged: recovery tells which
        found.unknown_version = version
        found.header_problem = f"format version {version} where this rsnet reads {FORMAT_VERSION}"
        return None
    records = frames(fd, PREAMBLE.size, found.file_bytes, SCAN_CHUNK)
    try:
        _, body = next(records)
        try:
            header = unpack(body)
        except Exception as exc:  # any decoder failure: the checked bytes are not a header
            raise BadRecord(f"header is not msgpack: {exc}") from None
        if not (
            isinstance(header, dict)
            and header.get("base_offset") == base_offset
            and isinstance(header.get("producers"), dict)
            and all(type(k) is str and type(v) is int for k, v in header["producers"].items())
            and isinstance(header.get("written", {}), dict)
            and all(type(k) is str and type(v) is int for k, v in header.get("written", {}).items())
        ):
            raise BadRecord(f"header does not describe a segment starting at offset {base_offset}")
    except StopIteration:
        found.header_problem = f"header cut off at byte {PREAMBLE.size}"
        return None
    except BadRecord as exc:
        found.header_problem = f"header at byte {PREAMBLE.size}: {exc}"
        return None
    found.header_producers = header["producers"]
    found.header_written = header.get("written", {})
    found.segment = Segment(path, base_offset, PREAMBLE.size + FRAME_HEAD.size + len(body))
    return records


def file_crc(fd: int | None, path: str, end: int) -> int | None:
    """CRC-32 of the first ``end`` bytes of the file (open as ``fd``, or at ``path``); None if shorter."""
    own = fd is None
    if own:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    assert fd is not None
    try:
        crc = 0
        position = 0
        while position < end:
            data = os.pread(fd, min(SCAN_CHUNK, end - position), position)
            if not data:
                return None
            crc = zlib.crc32(data, crc)
            position += len(data)
        return crc
    finally:
        if own:
            os.close(fd)


def take_records(
    buffer: bytes, here: int, offset: int, wanted: int, end: int, records: list[Any], stored: bool = False
) -> tuple[int, int]:
    """The hot loop of every read that is not at a topic's head: walk the frames in ``buffer``
    from ``here`` (where the record at ``offset`` starts), hop over those before ``wanted`` by
    their length fields, then append to ``records`` each record up to ``end`` whose frame is
    whole in ``buffer``, whose CRC holds and whose body is a 5-element array holding the offset
    expected: what this log wrote (its fields were checked then). Each record is appended
    decoded, or with ``stored`` as its body's bytes; then only the first and the last body
    taken have their offsets read: each frame starts where the CRC-checked length of the one
    before it ends, so a frame missing or repeated in between shows as a wrong last offset.

    Returns ``(here, offset)`` of the first frame not taken: cut off by the end of ``buffer``
    (read on from there), or not as expected, which the caller's checked path (:func:`frames`,
    :func:`~.records.decode_fields`) then reads again to say what is wrong. A hop may end past
    the end of ``buffer``: that is where the next frame starts.
    """
    size = len(buffer)
    head = FRAME_HEAD.size
    while offset < wanted and here + 4 <= size:
        here += head + int.from_bytes(buffer[here : here + 4], "big")
        offset += 1
    if offset < wanted:
        return here, offset
    append = records.append
    unpack_head = FRAME_HEAD.unpack_from
    crc32 = zlib.crc32
    start, first, taken = here, offset, len(records)
    while offset < end and here + head <= size:
        length, crc = unpack_head(buffer, here)
        after = here + head + length
        if after > size:
            break
        body = buffer[here + head : after]  # a bytes copy: msgpack decodes it twice as fast as a view
        if crc32(body, crc32(buffer[here : here + 4])) != crc:
            break
        if stored:
            append(body)
        else:
            try:
                record = unpack(body)
            except Exception:  # any decoder failure: the checked path says what is wrong
                break
            if type(record) is not list or len(record) != 5 or record[0] != offset:
                break
            append(record)
        offset += 1
        here = after
    if stored and offset > first:
        if stored_offset(records[taken]) != first or stored_offset(records[-1]) != offset - 1:
            del records[taken:]
            return start, first  # for the checked path to find which
    return here, offset


def frames(
    fd: int, position: int, end: int, chunk: int, first_chunk: int | None = None, skip: int = 0
) -> Iterator[tuple[int, bytes]]:
    """(position, body) of each checked frame from ``position`` up to ``end`` in the file.

    The first ``skip`` frames are hopped over by their length fields alone, unchecked: a
    caller that then checks the offset in the first frame it gets detects a bad hop. Raises
    BadRecord at the first frame that is cut off (by ``end``, or by the file ending sooner)
    or fails its check. Reads ``first_chunk`` bytes first, then ``chunk`` bytes at a time,
    more for a larger frame.
    """
    buffer = b""
    start = position  # file position of buffer[0]; the buffer never extends past end
    head = FRAME_HEAD.size
    while position < end:
        here = position - start
        held = len(buffer) - here
        if held >= head:
            length = int.from_bytes(buffer[here : here + 4], "big")
            if skip:
                position += head + length
                skip -= 1
                continue
            if held >= head + length:  # the whole frame is in the buffer: the common case
                body = check_frame(buffer, here)
                yield position, body
                position += head + len(body)
                continue
            need = head + length
        else:
            need = head
        if start + len(buffer) >= end:  # nothing more to read: the frame is cut off
            check_frame(buffer, here)  # raises, saying how
        wanted = min(max(first_chunk or chunk, need), end - position)
        first_chunk = None
        buffer = os.pread(fd, wanted, position)
        if len(buffer) < wanted:  # the file is shorter than it should be
            end = position + len(buffer)
            if not buffer:
                check_frame(buffer, 0)  # raises: cut off
        start = position
