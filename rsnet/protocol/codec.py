"""Bytes to frames and back: msgpack framing with a hard limit on frame size.

On a byte stream, frames are msgpack arrays written back to back; msgpack values delimit
themselves, so there is no length prefix (protocol/SPEC.md, "Framing"). Decoding uses one
streaming ``msgpack.Unpacker`` per connection: the C extension finds frame boundaries faster
than any Python length-prefix parser could.

The decoder never holds more than ``max_frame_size`` bytes of an unfinished frame: it feeds
the unpacker at most as many bytes as the current frame may still grow by, and fails with
``FRAME_TOO_LARGE`` as soon as an unfinished frame reaches the limit.

This module imports msgpack and the standard library only: no sockets, no trio, no clocks.
"""

from __future__ import annotations

import base64
import collections
from collections.abc import Iterator
from typing import Any

import msgpack

from .errors import ErrorCode, RemoteProtocolError
from .frames import DEFAULT_MAX_FRAME_SIZE, Frame, frame_fields

INITIAL_BUFFER = 16 * 1024
"""Bytes a decoder allocates for its buffer before a frame needs more (msgpack's default is
max_buffer_size). It grows on demand; a decoder holds it only while a frame is unfinished."""

MAX_IDLE_UNPACKERS = 8
"""Unpackers kept between frames per frame size limit, per process (see _IdleUnpackers)."""

PACKER_BUFFER = 1024
"""Bytes a packer allocates for its buffer before a frame needs more (msgpack's default is
256 KiB: a connection keeps its packer, idle or not). It grows on demand, and keeps the size
of the largest value it packed: see PACKER_KEEP."""

PACKER_KEEP = 64 * 1024
"""The largest buffer a connection's packer keeps: after packing more at once, the connection
takes a new packer (``Connection._renew_packer``), so a connection that once sent a large
frame does not hold its size for the rest of its life."""


class Encoded(bytes):
    """One item, already encoded: the msgpack bytes of a value (not nil), given to
    ``Connection.send_next``/``send_batch`` in place of the value itself.

    The bytes go on the wire as they are, so a value encoded once can be sent to any number
    of subscribers without packing it again (the broker shares each recent record this way).
    Whoever makes one vouches that it holds exactly one msgpack value that SPEC 3 allows as an
    item; the connection does not decode it again. Only subscribers that have
    ``on_next_encoded`` (rsnet's network session) are handed them.
    """

    __slots__ = ()


def text_keys(value: Any) -> Any:
    """``value`` with each map's binary keys (SPEC 3 allows them in values) as their base64
    text, for JSON, whose keys are strings; the rest as it is."""
    if type(value) is dict:
        return {
            (base64.b64encode(key).decode("ascii") if type(key) is bytes else key): text_keys(item)
            for key, item in value.items()
        }
    if type(value) is list:
        return [text_keys(item) for item in value]
    return value


def new_packer() -> msgpack.Packer:
    """A ``msgpack.Packer`` configured as the spec requires (str as str, bytes as bin, float64).

    ``pack(value)`` returns the encoding of ``value`` as bytes; keep one per connection.
    """
    return msgpack.Packer(use_bin_type=True, buf_size=PACKER_BUFFER)  # type: ignore[call-arg]  # msgpack-types lacks buf_size (msgpack >= 1.0 has it)


SCRATCH_KEEP = DEFAULT_MAX_FRAME_SIZE + 64 * 1024
"""The largest buffer a :class:`ScratchPacker` keeps: one that packed more at once (a batch too
large to go out as one frame) is dropped rather than given back."""

MAX_IDLE_SCRATCH = 4
"""Scratch packers kept between frames, per process: one is in use at a time per thread."""


class ScratchPacker:
    """Packs a frame into a buffer kept for the next one, for a caller that copies the bytes
    out at once (into a connection's output) instead of keeping them.

    A connection's own packer returns a new bytes object per frame, and a large frame (a
    BATCH of 256 items of 1 KiB) also makes it grow its buffer from scratch and be replaced
    (PACKER_KEEP). Scratch packers are shared by every connection in the process and keep
    their size, so a large frame costs one copy out of a warm, mapped buffer rather than
    three copies through memory allocated afresh, which the kernel maps a page fault per
    4 KiB at a time. Measured on scenario 1 with 1 KiB items: the server's page faults per
    million items 140,000 -> 28,000-80,000, its CPU time about a fifth less.

    Take one with :func:`scratch_packer`, pack one frame, copy it out, :meth:`release` it
    (a packer not released, as after an error while copying, is simply not reused).
    Taking and giving back are single deque operations, atomic under the GIL, so threads
    (the blocking client's) never share one, and the module needs no thread module.
    """

    __slots__ = ("_packer",)

    def __init__(self) -> None:
        self._packer = msgpack.Packer(use_bin_type=True, autoreset=False)

    def pack(self, value: Any) -> memoryview:
        """The encoding of ``value``: a view to release (``with`` it) before :meth:`release`.
        If ``value`` cannot be packed, raises as ``msgpack`` does, and the packer goes back."""
        packer = self._packer
        try:
            packer.pack(value)
        except BaseException:
            _idle_scratch.append(self)  # (msgpack empties its buffer when it refuses a value)
            raise
        return packer.getbuffer()

    def release(self, size: int) -> None:
        """Done with the ``size`` bytes :meth:`pack` returned, whose view the caller has
        released: the packer goes back for the next frame, unless it grew too large to keep."""
        if size <= SCRATCH_KEEP:
            self._packer.reset()
            _idle_scratch.append(self)


_idle_scratch: collections.deque[ScratchPacker] = collections.deque(maxlen=MAX_IDLE_SCRATCH)


def scratch_packer() -> ScratchPacker:
    """An idle :class:`ScratchPacker`, or a new one: the caller's until it releases it."""
    try:
        return _idle_scratch.pop()
    except IndexError:
        return ScratchPacker()


def encode_frame(frame: Frame) -> bytes:
    """The exact bytes of ``frame`` on the wire. Convenient, not fast: see ``Connection``."""
    return new_packer().pack(frame_fields(frame))


class FrameDecoder:
    """Splits a byte stream into frames, each a decoded (not yet validated) msgpack value.

    ``frames`` may be called with chunks cut anywhere; frames come out whole and in order.
    Map keys must be strings or binary (``strict_map_key``): other keys would let a peer
    choose hash collisions and make decoding quadratic.
    """

    __slots__ = ("_base", "_fed", "_idle", "_keep", "_limit", "_unpacker", "position")

    def __init__(self, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> None:
        self._limit = max_frame_size
        # msgpack's Unpacker embeds its parse stack: 41 KiB each, more than everything else an
        # idle connection holds. So a decoder has one only while a frame is unfinished: it takes
        # one from the process's idle ones when bytes arrive (:class:`_IdleUnpackers`) and gives
        # it back when they end on a frame boundary.
        self._unpacker: msgpack.Unpacker | None = None
        self._idle = _idle.for_limit(max_frame_size)
        # Stream offsets: bytes fed so far, and where the current unpacker's stream began (its
        # tell() counts from there).
        self._fed = 0
        self._base = 0
        self.position = 0
        """Bytes of whole frames decoded so far: where the unfinished frame begins. While a
        :meth:`frames` generator is suspended after a frame, that is where the frame ends.
        The unpacker's tell() cannot say where an unfinished frame began, because it parses
        unfinished frames partway, so this is recorded after every whole frame."""
        # Whether the current unpacker goes back to the idle ones: not once it held more than
        # INITIAL_BUFFER bytes at once (its unfinished frame and a chunk fed after it).
        self._keep = True

    @property
    def buffered(self) -> int:
        """Bytes of the unfinished frame held so far; always below ``max_frame_size``."""
        return self._fed - self.position

    def frames(self, data: bytes | bytearray | memoryview) -> Iterator[Any]:
        """Yield every frame that ``data`` completes, in order.

        Raises :class:`RemoteProtocolError` with ``FRAME_TOO_LARGE`` when a frame reaches
        ``max_frame_size`` bytes without ending, and with ``PROTOCOL_ERROR`` when the bytes
        are not msgpack; frames completed before the fault have been yielded. After an error
        the decoder is unusable: the connection is closing.
        """
        # A generator, not a list: each frame array is freed as soon as the caller is done
        # with it, so decoding does not feed the cyclic garbage collector (measured: a list
        # of a chunk's frames costs a quarter of the decoding rate in collections).
        # Taking and giving back an idle unpacker, and the frame positions, are written out
        # here rather than in methods: per chunk of one small frame, that took the decoder's
        # cost above a bare Unpacker's from 1.0 to 0.65 us.
        if not data:
            return
        unpacker = self._unpacker
        if unpacker is None:
            try:
                unpacker = self._idle.pop()
            except IndexError:  # none idle (or another thread took the last one meanwhile)
                unpacker = _new_unpacker(self._limit)
            self._unpacker = unpacker
            self._base = self._fed - unpacker.tell()
            self._keep = True
        start = self.position
        fed = self._fed
        base = self._base
        tell = unpacker.tell
        try:
            while True:
                # Feed no more than the unfinished frame may still grow by, so every frame
                # that completes is within the limit and the unpacker's buffer never exceeds
                # it. Nearly always all of data fits at once: then no frame can reach the
                # limit, and this is the only round.
                room = self._limit - (fed - start)
                rest: memoryview | None = None
                if len(data) < room:
                    piece = data
                else:
                    rest = memoryview(data)  # the rest is fed as views: no bytes copied
                    piece, rest = rest[:room], rest[room:]
                unpacker.feed(piece)
                fed += len(piece)
                if fed - start > INITIAL_BUFFER:
                    self._keep = False  # its buffer grew, and msgpack never shrinks it
                for frame in unpacker:
                    self.position = start = base + tell()
                    yield frame
                    if start == fed:
                        # The bytes fed end with this frame. Asking the unpacker for another
                        # would only raise StopIteration inside it, which costs as much as
                        # decoding a small frame: a SUBSCRIBE chunk 0.83 us fed and iterated
                        # to the end, 0.43 stopping at the last frame.
                        break
                if rest is None:
                    return
                data = rest
                if fed - start >= self._limit:
                    raise RemoteProtocolError(
                        ErrorCode.FRAME_TOO_LARGE,
                        f"frame exceeds max_frame_size ({self._limit} bytes)",
                    )
        except (ValueError, TypeError, msgpack.UnpackException) as exc:
            # The decoder is unusable now; its unpacker is not given back.
            self._unpacker = None
            self._keep = False
            # msgpack reports a refused length header as "N exceeds max_..._len(M)".
            if "exceeds max_" in str(exc):
                raise RemoteProtocolError(
                    ErrorCode.FRAME_TOO_LARGE, f"a length header exceeds max_frame_size: {exc}"
                ) from None
            raise RemoteProtocolError(ErrorCode.PROTOCOL_ERROR, f"bytes are not a msgpack value: {_why(exc)}") from None
        finally:
            self._fed = fed
            if fed == start:  # no unfinished frame: nothing to hold
                # Appending is a single deque operation, atomic under the GIL (see _IdleUnpackers).
                if self._keep:
                    self._idle.append(unpacker)
                self._unpacker = None


def _why(exc: Exception) -> str:
    """What msgpack refused, in words: its FormatError and StackError carry no message."""
    if isinstance(exc, msgpack.FormatError):
        return "a byte no msgpack value starts with (0xc1 is never used)"
    if isinstance(exc, msgpack.StackError):
        return "values nested deeper than the decoder's stack of 1,024 levels (SPEC 3 allows 512)"
    text = str(exc)
    if "strict_map_key" in text:  # msgpack names its own option: "int is not allowed for map key when ..."
        return f"a map key that is not a string or binary ({text.split(' is not allowed', 1)[0]}; SPEC 3)"
    return text or type(exc).__name__


class _IdleUnpackers:
    """Unpackers between frames, kept for the next decoder that receives bytes in this process.

    Making an Unpacker allocates and zeroes its 41 KiB parse stack and a buffer: about 2 us in
    a warm loop, three times that on the path of a round trip (a fresh 41 KiB also pushes the
    rest of the work out of the CPU's first-level cache, 32 KiB here). So a decoder gives its
    unpacker back when its bytes end on a frame boundary instead of freeing it. Only unpackers
    whose buffer never grew past INITIAL_BUFFER come back (msgpack never shrinks it), and at
    most MAX_IDLE_UNPACKERS are kept per frame size limit: at most MAX_IDLE_UNPACKERS x
    (41 + 16) KiB per limit in use. Taking and giving back are single deque operations, atomic
    under the GIL, so decoders in several threads (the blocking client's) may share them; a
    full deque drops its oldest when one more comes back (no length check per chunk).
    """

    __slots__ = ("_by_limit",)

    def __init__(self) -> None:
        self._by_limit: dict[int, collections.deque[msgpack.Unpacker]] = {}

    def for_limit(self, limit: int) -> collections.deque[msgpack.Unpacker]:
        """The idle unpackers of one frame size limit: a decoder pops one and appends it back."""
        return self._by_limit.setdefault(limit, collections.deque(maxlen=MAX_IDLE_UNPACKERS))


def _new_unpacker(limit: int) -> msgpack.Unpacker:
    # No frame can hold more array elements than bytes, nor more map entries than half as
    # many: the unpacker refuses a larger count before allocating for it. String, binary and
    # ext lengths get the same bound, though the size check in FrameDecoder.frames(), which
    # counts bytes as they arrive, usually stops such frames first.
    # read_size: the buffer allocated up front (see INITIAL_BUFFER); it grows on demand, up
    # to max_frame_size, for the frames that need it.
    return msgpack.Unpacker(
        raw=False,
        strict_map_key=True,
        read_size=min(INITIAL_BUFFER, limit),
        max_buffer_size=limit,
        max_str_len=limit,
        max_bin_len=limit,
        max_ext_len=limit,
        max_array_len=limit,
        max_map_len=limit // 2,
    )


_idle = _IdleUnpackers()
