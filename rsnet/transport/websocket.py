"""WebSocket, as :class:`Transport`: websockets' sans-I/O protocol driven over a trio stream.

websockets' own trio API costs a task switch and an await per message; driving its sans-I/O
core directly lets one ``send_all`` carry many messages, as the protocol's batching wants
(field notes: ~640k frames/s sans-I/O against ~190k/s through the high-level API).
Only binary messages carry protocol bytes (SPEC.md section 2.2); the subprotocol is ``rsnet``.

websockets keeps the handshake, the control frames and the closing handshake; the binary data
frames, which are nearly all the bytes, the transport frames and reads itself
(:func:`binary_frames`, :meth:`WebSocketTransport._split`) so that payloads are not copied on
the way: a WebSocket costs about what TCP costs per byte.

Violations of the WebSocket rules are connection-level protocol violations (SPEC 2.2), and the
transport answers them itself, because websockets sends no data once it has failed a
connection: a CONN_ERROR frame in a binary message first, then the closing handshake. A text
message gets ``PROTOCOL_ERROR`` and close code 1003 (unsupported data); a message over the size
limit, which websockets refuses with 1009 (message too big), gets ``FRAME_TOO_LARGE``; broken
WebSocket framing (1002, 1007) gets ``PROTOCOL_ERROR``. This layer does not know the protocol's
frames: the driver passes the CONN_ERROR encoder (``conn_error``); without one, the closing
handshake goes out alone. Then ``receive`` raises :class:`WebSocketProtocolError`.
"""

from __future__ import annotations

import logging
import secrets
import ssl
import struct
from collections.abc import Callable, Sequence
from typing import TypeVar

import trio
from websockets.client import ClientProtocol
from websockets.exceptions import InvalidURI
from websockets.frames import Frame, Opcode
from websockets.http11 import Request, Response
from websockets.protocol import Side, State
from websockets.server import ServerProtocol
from websockets.typing import Subprotocol
from websockets.uri import parse_uri

try:  # websockets' C masking, as websockets itself picks it
    from websockets.speedups import apply_mask
except ImportError:  # pragma: no cover - the pure Python fallback
    from websockets.utils import apply_mask

from ..errors import ErrorCode
from .base import STREAM_BROKE, Bytes, Transport, TransportClosed
from .tcp import (
    RECEIVE_SIZE,
    SocketReader,
    describe_peer,
    direct_socket,
    open_stream,
    send_all_pieces,
    send_all_tls,
    write_nowait,
)

_OPEN, _CLOSED = State.OPEN, State.CLOSED
"""websockets' states, looked at per message: an Enum member through its class costs ~70 ns, a
module constant ~6."""

SUBPROTOCOL = Subprotocol("rsnet")

LINGER_S = 1.0
"""How long a connection failed over what the peer sent is still read (and dropped) before
it is closed: the bound on what a violating peer costs after its violation."""

_Event = TypeVar("_Event", Request, Response)


ConnErrorEncoder = Callable[[int, str], bytes]
"""``(code, message) -> bytes``: a CONN_ERROR frame, as the protocol layer encodes it."""

_BINARY_FIN = 0x82  # FIN set, opcode 2 (binary): a whole message in one frame
_PONG_FIN = 0x8A  # FIN set, opcode 10 (pong)
_MASKED = 0x80

CONTROL_BACKLOG = 64 * 1024
"""Bytes of control frames queued for a peer that does not take them, past which its pings go
unanswered (RFC 6455 5.5.3 lets an endpoint answer only some): a peer that sent pings and read
nothing grew the queue of pongs without bound (an attack round: 41 -> 269 MB in 18 s)."""


def binary_frames(messages: Sequence[Bytes], *, mask: bool) -> list[Bytes]:
    """The WebSocket frames (RFC 6455 5.2) carrying each of ``messages`` as one binary
    message, as pieces to write in order: header, then payload.

    Data frames are framed here rather than by websockets' ``send_binary``, whose
    ``Frame.serialize`` copies every payload twice more (into a BytesIO and out of it): an
    unmasked payload (server to client) is written as it is. ``mask``: client to server,
    masked with a fresh random key per frame (RFC 6455 5.3). No extension is ever
    negotiated (neither end offers one), so the reserved bits stay 0.
    """
    pieces: list[Bytes] = []
    bit = _MASKED if mask else 0
    for message in messages:
        size = len(message)
        if size < 126:
            head = bytes((_BINARY_FIN, bit | size))
        elif size < 65536:
            head = struct.pack("!BBH", _BINARY_FIN, bit | 126, size)
        else:
            head = struct.pack("!BBQ", _BINARY_FIN, bit | 127, size)
        if mask:
            key = secrets.token_bytes(4)
            pieces += (head, key, apply_mask(message, key))
        else:
            pieces += (head, message)
    return pieces


class WebSocketProtocolError(TransportClosed):
    """The peer broke the WebSocket rules the protocol relies on (e.g. sent a text message).

    ``conn_error_code`` is the protocol's code for it (``PROTOCOL_ERROR``, ``FRAME_TOO_LARGE``),
    already answered with CONN_ERROR if the transport was given an encoder.
    """

    def __init__(self, message: str, conn_error_code: int) -> None:
        super().__init__(message)
        self.conn_error_code = conn_error_code


_FIN, _RSV, _OPCODE, _LENGTH = 0x80, 0x70, 0x0F, 0x7F
_CONT, _TEXT, _BINARY = Opcode.CONT.value, Opcode.TEXT.value, Opcode.BINARY.value


class WebSocketTransport(Transport):
    """An open WebSocket connection carrying the protocol's bytes in binary messages.

    ``receive`` returns the payload of binary messages as it arrives, not message by message:
    messages hold whole protocol frames (SPEC 2.2), so the protocol's decoder reads their
    payloads as one byte stream, as it reads TCP. The transport parses the WebSocket frame
    headers itself and hands binary payloads over without copying them (server-to-client
    payloads are not masked; client-to-server ones are unmasked once), where websockets'
    parser would copy each payload twice and hold a whole message before the decoder saw a
    byte of it. Every other frame (ping, pong, close, text) goes to websockets, which answers
    it as usual; a binary frame that breaks the rules (reserved bits, a wrong mask bit, a
    continuation out of place, a message over the size limit) fails the connection through
    websockets (close code 1002, or 1009 for the size), as websockets' own parser would.
    """

    message_based = True

    def __init__(
        self,
        stream: trio.abc.Stream,
        protocol: ServerProtocol | ClientProtocol,
        peer: str,
        *,
        conn_error: ConnErrorEncoder | None = None,
        received: bytes = b"",
    ) -> None:
        """``received``: bytes that came after the opening handshake in its last read (a
        client that sent its first frames without waiting for the response); they are read
        first."""
        self._stream = stream
        self._received = received
        self._conn_error = conn_error
        self._protocol = protocol
        self._peer = peer
        # The frame being received (see _split): an unfinished header; payload bytes still to
        # come; whether they are message data (else they are websockets'); its mask key and
        # the offset reached in it; whether a binary message, or a text one, awaits its
        # continuation; the size of that binary message so far.
        self._head = b""
        self._left = 0
        self._data = False
        self._key = b""
        self._at = 0
        self._binary_open = False
        self._text_open = False
        self._size = 0
        self._max_size = protocol.max_message_size
        self._masked = protocol.side is Side.SERVER  # frames from a client must be masked
        self._eof = False
        self._closing = False  # this side started the closing handshake (send_eof, aclose)
        self._violation: WebSocketProtocolError | None = None
        self._control: list[bytes] = []  # written before what websockets queued: a CONN_ERROR
        # Whether websockets was given anything (bytes, EOF, a failure) since its events were
        # last taken: a read of binary payload only gives it nothing to answer or report.
        self._fed = False
        # Control frames (pong, close) are written by the receiving task, data by the sender.
        self._send_lock = trio.Lock()
        self._direct = direct_socket(stream)
        # Over a plain socket a cancelled receive loses nothing (what it read is handed over
        # before any wait: _flush_control_nowait), so a consumer may read in the session
        # reader's place (Session.lend_socket). Over TLS the receive may be cancelled with
        # decoded bytes in hand.
        self.cancel_safe_receive = self._direct is not None
        self._reader = SocketReader(stream, self._peer)
        self._mask = protocol.side is Side.CLIENT  # client-to-server frames are masked
        self._held: list[Bytes] = []  # messages send_nowait could not start: send frames them
        self._rest: list[Bytes] = []  # framed bytes send_nowait could not write: written before any others
        self._control_queued = 0  # bytes of control frames put in _rest since it was last empty

    @property
    def peer(self) -> str:
        return self._peer

    async def receive(self) -> Bytes:
        while not self._eof:
            data: bytes | bytearray
            if self._received:  # (once, at most: what came with the handshake)
                data, self._received = self._received, b""
            else:
                data = await self._reader.read()  # (TransportClosed if the socket broke)
            if data:
                payload = self._split(data)
            else:
                payload = []
                self._protocol.receive_eof()
                self._fed = self._eof = True
            if self._fed:
                self._fed = False
                self._take_events()
                if self._direct is not None:
                    self._flush_control_nowait()  # no wait once bytes are taken: cancel-safe
                else:
                    await self._flush_control()
                if self._violation is not None:
                    raise self._violation
            if payload:
                return payload[0] if len(payload) == 1 else b"".join(payload)
        return b""

    def _split(self, data: bytes | bytearray) -> list[Bytes]:
        """The binary message payload in ``data``, in order; the bytes of every other frame
        go to websockets (see the class docstring)."""
        protocol = self._protocol
        end = len(data)
        if self._left >= end and self._data and not self._key and protocol.state is _OPEN:
            self._left -= end  # (most reads of a long stream: all of it a message's payload)
            return [data]
        view = memoryview(data)
        pos = 0
        payload: list[Bytes] = []
        while pos < end:
            if protocol.state is not _OPEN:
                # Closing or failed: websockets answers the closing handshake or discards.
                self._feed(bytes(view[pos:]))
                break
            if self._left:
                take = min(self._left, end - pos)
                piece: Bytes = view[pos : pos + take]
                pos += take
                self._left -= take
                if not self._data:
                    self._feed(bytes(piece))
                    continue
                if self._key:
                    at = self._at & 3
                    piece = apply_mask(piece, self._key[at:] + self._key[:at])
                    self._at += take
                payload.append(piece)
                continue
            pos = self._header(view, pos)
        return payload

    def _header(self, view: memoryview, pos: int) -> int:
        """Read (the rest of) a frame header from ``view`` at ``pos``; returns where it ended."""
        head = self._head + bytes(view[pos : pos + 14 - len(self._head)])  # 14: the longest header
        if len(head) < 2:
            self._head = head
            return len(view)
        first, second = head[0], head[1]
        size = second & _LENGTH
        extended = 2 if size == 126 else 8 if size == 127 else 0
        needed = 2 + extended + (4 if second & _MASKED else 0)
        if len(head) < needed:
            self._head = head
            return len(view)
        taken = needed - len(self._head)
        self._head = b""
        if extended:
            size = int.from_bytes(head[2 : 2 + extended], "big")
        opcode = first & _OPCODE
        if opcode != _BINARY and (opcode != _CONT or self._text_open):
            # Not message data: websockets handles it (answers a ping, a close; reports text).
            if opcode in (_TEXT, _CONT):
                self._text_open = not first & _FIN
            self._data, self._left = False, size
            self._feed(head[:needed])
            return pos + taken
        # A binary message's frame: checked as websockets' parser would.
        if first & _RSV:
            self._fail(1002, "reserved bits must be 0")
        elif bool(second & _MASKED) != self._masked:
            self._fail(1002, "incorrect masking")
        elif (opcode == _CONT) != self._binary_open:
            self._fail(1002, "unexpected continuation frame" if opcode == _CONT else "expected a continuation frame")
        elif self._max_size is not None and self._size + size > self._max_size:
            self._fail(1009, f"message of at least {self._size + size} bytes exceeds limit of {self._max_size} bytes")
        else:
            self._binary_open = not first & _FIN
            self._size = self._size + size if self._binary_open else 0
            self._data, self._left = True, size
            self._key = head[needed - 4 : needed] if self._masked else b""
            self._at = 0
        return pos + taken

    def _feed(self, data: bytes) -> None:
        """Bytes of frames websockets handles (control, text, anything once not open)."""
        self._protocol.receive_data(data)
        self._fed = True

    def _fail(self, code: int, reason: str) -> None:
        """A binary frame broke the rules: websockets fails the connection, as its parser would."""
        self._protocol.fail(code, reason)
        self._fed = True

    def _take_events(self) -> None:
        protocol = self._protocol
        for event in protocol.events_received():
            if not isinstance(event, Frame):
                continue
            if event.opcode is Opcode.TEXT and protocol.state is _OPEN:
                # SPEC 2.2: the CONN_ERROR goes out while the WebSocket is still open for data.
                # (Not open: a frame after the text failed the connection, as said below.)
                reason = "a text message: rsnet uses binary messages only (SPEC 2.2)"
                if self._conn_error is not None:
                    protocol.send_binary(self._conn_error(ErrorCode.PROTOCOL_ERROR, reason))
                protocol.fail(1003, "rsnet uses binary messages only")
                self._violation = WebSocketProtocolError(f"{self._peer} sent {reason}", ErrorCode.PROTOCOL_ERROR)
                self._eof = True
                return
            if event.opcode is Opcode.CLOSE:
                self._eof = True  # websockets has queued the closing handshake's reply
        failed = protocol.close_sent
        if failed is not None and protocol.close_rcvd is None and not self._closing and not self._eof:
            # websockets failed the connection itself (it discards all further input): put a
            # CONN_ERROR ahead of the close frame it queued, and end the stream of messages.
            code = ErrorCode.FRAME_TOO_LARGE if failed.code == 1009 else ErrorCode.PROTOCOL_ERROR
            reason = f"WebSocket: {failed.reason or 'protocol violation'} (close code {failed.code})"
            if self._conn_error is not None:
                frame = Frame(Opcode.BINARY, self._conn_error(code, reason))
                self._control.append(frame.serialize(mask=protocol.side is Side.CLIENT))
            self._violation = WebSocketProtocolError(f"{self._peer}: {reason}", code)
            self._eof = True
        if protocol.state is _CLOSED:
            self._eof = True

    def _pending_control(self) -> list[bytes]:
        """Our own control frames (a CONN_ERROR ahead of a close), then what websockets queued
        (a pong, a close), taken."""
        pending = self._protocol.data_to_send()
        if self._control:
            pending = [*self._control, *pending]
            self._control = []
        return pending

    async def _flush_control(self) -> None:
        pending = self._pending_control()
        if pending:
            await self._write(pending)

    def _flush_control_nowait(self) -> None:
        """What :meth:`_flush_control` writes, written as far as the socket takes it now: the
        rest, whole frames or their ends, goes first in the next write (:meth:`_write` also
        writes what came while it was writing). A rest that finds no write after it waits
        for the session's next one, a keepalive PING at the latest."""
        pending = self._pending_control()
        if not pending:
            return
        if self._rest or self._send_lock.locked():
            if self._control_queued > CONTROL_BACKLOG:
                pending = [frame for frame in pending if not frame or frame[0] != _PONG_FIN]
            self._control_queued += sum(map(len, pending))
            self._rest += pending
        else:
            assert self._direct is not None
            self._rest = write_nowait(self._direct, pending)
            self._control_queued = sum(map(len, self._rest))

    def interrupt_receive(self) -> None:
        if self._direct is not None:
            # As TcpTransport does: a consumer reading in the session reader's place hears
            # that the connection is ending (the session closes the transport after its linger).
            trio.lowlevel.notify_closing(self._direct)

    def send_nowait(self, chunks: Sequence[Bytes]) -> bool:
        protocol = self._protocol
        if (
            self._held
            or self._rest
            or self._direct is None
            or self._send_lock.locked()  # the receiving task is writing a control frame
            or protocol.state is not _OPEN
        ):
            self._held += chunks
            return False
        pieces = [*protocol.data_to_send(), *binary_frames(chunks, mask=self._mask)]
        self._rest = write_nowait(self._direct, pieces)
        return not self._rest

    async def send(self, chunks: Sequence[Bytes]) -> None:
        if self._held:
            chunks = [*self._held, *chunks]
            self._held = []
        protocol = self._protocol
        if protocol.state is not _OPEN:
            raise TransportClosed(f"the WebSocket to {self._peer} is closing")
        # What websockets queued (a pong, say) goes before the data, as it was queued first.
        await self._write([*protocol.data_to_send(), *binary_frames(chunks, mask=self._mask)])

    async def _write(self, pieces: Sequence[Bytes]) -> None:
        lock = self._send_lock
        if lock.locked():
            await lock.acquire()
        else:
            lock.acquire_nowait()  # uncontended (nearly always): no extra trip through the scheduler
        try:
            if self._rest:  # the end of what send_nowait began goes first: frames stay whole
                pieces, self._rest = [*self._rest, *pieces], []
                self._control_queued = 0
            if not any(pieces):
                return
            if self._direct is None:
                await send_all_tls(self._stream, pieces)
            else:  # headers and payloads as they are, gathered by the kernel
                await send_all_pieces(self._direct, pieces)
                while self._rest:  # control frames the receiving task queued meanwhile
                    pieces, self._rest = self._rest, []
                    self._control_queued = 0
                    await send_all_pieces(self._direct, pieces)
        except STREAM_BROKE as error:
            raise TransportClosed(f"send to {self._peer} failed: {error!r}") from error
        finally:
            lock.release()

    async def send_eof(self) -> None:
        if self._protocol.state is _OPEN:
            self._closing = True
            self._protocol.send_close(1000)
            try:
                await self._flush_control()
            except TransportClosed:
                pass

    async def aclose(self) -> None:
        if self._protocol.state is _OPEN:
            self._closing = True
            self._protocol.send_close(1000)
            with trio.move_on_after(1) as scope:
                scope.shield = True
                try:
                    await self._flush_control()
                except TransportClosed:
                    pass
        elif self._violation is not None:
            await self._linger()
        self._held, self._rest = [], []  # never to be written: not to be held either
        await trio.aclose_forcefully(self._stream)

    async def _linger(self) -> None:
        """After failing the connection over what the peer sent (a message over the size
        limit, say), the peer may still be sending it: read and drop what comes, one read's
        worth at a time, until it closes or ``LINGER_S`` pass. Closing with its bytes unread
        would make the kernel reset the connection, which can destroy our CONN_ERROR and
        close frame before the peer has read them. Half-closing first tells the peer we are
        done (a client waiting for us to close the TCP connection then closes its side)."""
        with trio.move_on_after(LINGER_S) as scope:
            scope.shield = True
            try:
                await self._flush_control()
                if isinstance(self._stream, trio.abc.HalfCloseableStream):
                    await self._stream.send_eof()
                while await self._stream.receive_some(RECEIVE_SIZE):
                    pass
            except (TransportClosed, *STREAM_BROKE):
                pass  # the peer is gone: nothing left to protect


class NotHttp(Exception):
    """A WebSocket server's peer began with a byte no HTTP request begins with: rsnet's own
    protocol (a ``tcp://`` client given the WebSocket port), most likely."""


async def _handshake_events(
    stream: trio.abc.Stream, protocol: ServerProtocol | ClientProtocol, want: type[_Event]
) -> tuple[_Event, bytes]:
    """The handshake's request or response, and the bytes read after it: websockets is given
    the HTTP message only, up to its blank line (a request or a 101 response has no body),
    since it would take frames that follow in the same read for its own, and the transport
    reads the frames."""
    tail = b""  # the end of what was read before: the blank line may be cut across reads
    first = True
    while True:
        pending = protocol.data_to_send()
        if pending:
            await stream.send_all(b"".join(pending))
        for event in protocol.events_received():
            if isinstance(event, want):
                return event, b""
        data = await stream.receive_some(RECEIVE_SIZE)
        if data and want is Request and first and not data[:1].isupper():
            raise NotHttp  # (an HTTP request starts with its method's capital letter)
        if data and want is Response and first and not b"HTTP/".startswith(bytes(data[:5])):
            if 0x90 <= data[0] <= 0x9F:  # a msgpack array: an rsnet frame (its CONN_ERROR)
                raise TransportClosed("the server answered in the rsnet protocol, not HTTP: connect with tcp://")
            raise TransportClosed(f"the server did not answer in HTTP (its first bytes: {bytes(data[:16])!r})")
        first = False
        if data:
            seen = tail + data
            end = seen.find(b"\r\n\r\n")
            if end < 0:
                protocol.receive_data(data)
                tail = seen[-3:]
                continue
            cut = end + 4 - len(tail)
            protocol.receive_data(data[:cut])
            for event in protocol.events_received():
                if isinstance(event, want):
                    return event, bytes(data[cut:])
            tail = b""  # not the message wanted after all (websockets refused it): it answers
        else:
            protocol.receive_eof()
            for event in protocol.events_received():
                if isinstance(event, want):
                    return event, b""
            raise TransportClosed("the peer closed during the WebSocket handshake")


async def accept_websocket(
    stream: trio.abc.Stream,
    *,
    max_message_size: int,
    path: str | None = None,
    conn_error: ConnErrorEncoder | None = None,
) -> WebSocketTransport | None:
    """Run the server side of the WebSocket handshake on ``stream``.

    Returns the open transport, or ``None`` after answering an HTTP error (a plain HTTP
    request, a wrong ``path``): the caller then closes the stream. ``conn_error`` encodes the
    CONN_ERROR the transport answers WebSocket violations with (see the module docs).
    """
    protocol = ServerProtocol(
        subprotocols=[SUBPROTOCOL],
        select_subprotocol=_rsnet_if_offered,
        max_size=max_message_size,
        logger=_quiet,
    )
    try:
        try:
            request, received = await _handshake_events(stream, protocol, Request)
        except NotHttp:
            # Without this the HTTP parser would wait for a request line that never comes and the
            # client's handshake would time out: an rsnet client reads this CONN_ERROR at once.
            if conn_error is not None:
                message = "this is an rsnet WebSocket port: connect with ws:// (rsnet over TCP has its own port)"
                await stream.send_all(conn_error(ErrorCode.PROTOCOL_ERROR, message))
            return None
        if path is not None and request.path.split("?", 1)[0] != path:
            response = protocol.reject(404, f"no rsnet endpoint at {request.path}\n")
        else:
            response = protocol.accept(request)
        protocol.send_response(response)
        pending = protocol.data_to_send()
        if pending:
            await stream.send_all(b"".join(pending))
    except (*STREAM_BROKE, TransportClosed):
        return None
    if protocol.state is not _OPEN:
        return None
    return WebSocketTransport(stream, protocol, describe_peer(stream), conn_error=conn_error, received=received)


def _rsnet_if_offered(protocol: ServerProtocol, offered: Sequence[Subprotocol]) -> Subprotocol | None:
    """SPEC 2.2: clients SHOULD offer ``rsnet`` and servers SHOULD select it; a client that
    offers nothing (or only others) is still served, without a subprotocol (websockets would
    refuse it with HTTP 400)."""
    return SUBPROTOCOL if SUBPROTOCOL in offered else None


# websockets logs "connection open" and "connection closed" at INFO for every connection: a
# line a peer could make us write as fast as it connects. Its warnings and errors still go out;
# connection-level lines are the server's own, at a bounded rate (rsnet.net.server).
_quiet = logging.getLogger("rsnet.transport.websocket")
_quiet.setLevel(logging.WARNING)


async def connect_websocket(
    url: str,
    *,
    max_message_size: int,
    ssl_context: ssl.SSLContext | None = None,
    conn_error: ConnErrorEncoder | None = None,
) -> WebSocketTransport:
    """Connect to a ``ws://`` or ``wss://`` URL and complete the WebSocket handshake.

    ``conn_error``: as for :func:`accept_websocket`."""
    try:
        uri = parse_uri(url)
    except InvalidURI as error:
        raise ValueError(f"not a WebSocket URL: {url!r}") from error
    if uri.secure and ssl_context is None:
        ssl_context = ssl.create_default_context()
    stream = await open_stream(uri.host, uri.port, ssl_context if uri.secure else None)
    protocol = ClientProtocol(uri, subprotocols=[SUBPROTOCOL], max_size=max_message_size)
    protocol.send_request(protocol.connect())
    try:
        _, received = await _handshake_events(stream, protocol, Response)
    except STREAM_BROKE as error:
        await trio.aclose_forcefully(stream)
        raise TransportClosed(f"WebSocket handshake with {url} failed: {error!r}") from error
    except TransportClosed as error:
        await trio.aclose_forcefully(stream)
        raise TransportClosed(f"WebSocket handshake with {url} failed: {error}") from error
    if protocol.state is not _OPEN:
        await trio.aclose_forcefully(stream)
        raise TransportClosed(f"WebSocket handshake with {url} failed: {protocol.handshake_exc}")
    return WebSocketTransport(stream, protocol, f"{uri.host}:{uri.port}", conn_error=conn_error, received=received)
