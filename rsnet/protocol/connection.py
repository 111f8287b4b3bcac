"""The sans-I/O state machine of one rsnet connection (protocol/SPEC.md is the contract).

Feed received bytes to :meth:`Connection.receive_data`, take what happened from
:meth:`Connection.events_received`, call ``send_*`` methods to produce frames, and write
:meth:`Connection.data_to_send` to the transport. The connection enforces every rule of the
spec on both directions: it answers a peer's violation with the documented code (a stream
error keeps the connection, anything else closes it), and it refuses, by raising
:class:`LocalProtocolError` before anything is written, to let this side break a rule, so a
bug in our own publisher can never over-send.

Each open stream is a row in a table keyed by stream id; what each end may send in each state
is the lifecycle table of :mod:`rsnet.protocol.lifecycle`, consulted for every stream frame
either way. A stream leaves the table as soon as either side ends it. Stream ids are never reused, so any id below the next one a side will
allocate that is not in the table belongs to a closed stream: frames for it are dropped
(late frames after CANCEL are expected, rule 2.8) and sends on it are no-ops (rules 3.6, 3.7).

This module must never import sockets, trio, asyncio, threads or clocks: timeouts and
keepalive scheduling belong to the I/O layer that drives it.
"""

from __future__ import annotations

import enum
import itertools
from collections.abc import Callable
from typing import Any

from .codec import PACKER_KEEP, Encoded, FrameDecoder, new_packer, scratch_packer
from .errors import ErrorCode, LocalProtocolError, RemoteProtocolError
from .events import ConnectionClosed, Event, Items
from .frames import (
    DEFAULT_KEEPALIVE_INTERVAL,
    DEFAULT_MAX_FRAME_SIZE,
    DEFAULT_MAX_STREAMS,
    MAGIC,
    MAX_ERROR_DATA,
    MAX_ERROR_MESSAGE,
    MAX_INT,
    MAX_MAX_FRAME_SIZE,
    MAX_SETTING,
    MIN_MAX_FRAME_SIZE,
    PARSERS,
    PROTOCOL_VERSION,
    TRUNCATED,
    VALIDATE_BATCH,
    VALIDATE_NEXT,
    Accept,
    Batch,
    Cancel,
    Complete,
    ConnError,
    Error,
    FrameType,
    GoAway,
    Hello,
    Next,
    Offer,
    Ping,
    Pong,
    Request,
    Subscribe,
    Welcome,
    frame_fields,
    parse_frame,
)
from .lifecycle import Side, StreamEvent, StreamState, allowed

_NEXT = FrameType.NEXT.value
_BATCH = FrameType.BATCH.value
# The wire numbers of the frames the stream-level sends write as arrays (_write_fields).
_SUBSCRIBE_TYPE, _OFFER_TYPE = FrameType.SUBSCRIBE.value, FrameType.OFFER.value
_ACCEPT_TYPE, _REQUEST_TYPE = FrameType.ACCEPT.value, FrameType.REQUEST.value
_CANCEL_TYPE, _COMPLETE_TYPE = FrameType.CANCEL.value, FrameType.COMPLETE.value
_ENCODED_ONLY = {Encoded}
# Module constants: looking a member up on its Enum class costs a Python-level call.
_OPENING, _OPEN, _CLOSED = StreamState.OPENING, StreamState.OPEN, StreamState.CLOSED
_ACCEPT, _REQUEST, _ITEMS = StreamEvent.ACCEPT, StreamEvent.REQUEST, StreamEvent.ITEMS
_COMPLETE, _ERROR, _CANCEL = StreamEvent.COMPLETE, StreamEvent.ERROR, StreamEvent.CANCEL
_SUBSCRIBER_OPENER, _PUBLISHER_OPENER = Side.SUBSCRIBER_OPENER, Side.PUBLISHER_OPENER
_SUBSCRIBER_ACCEPTOR, _PUBLISHER_ACCEPTOR = Side.SUBSCRIBER_ACCEPTOR, Side.PUBLISHER_ACCEPTOR
_NEXT_HEAD = b"\x93" + new_packer().pack(_NEXT)  # the first bytes of every NEXT: [NEXT, ...
_MAX_NEXT_PREFIX = 11  # array header, type, and a stream id of up to 9 bytes


class Role(enum.Enum):
    """Which end of the transport this connection is: the client sends HELLO."""

    CLIENT = "client"
    SERVER = "server"


class State(enum.Enum):
    """Connection lifecycle (SPEC "Handshake")."""

    AWAIT_HELLO = "await_hello"
    """Server: nothing received yet."""
    AWAIT_ACCEPT = "await_accept"
    """Server: HELLO received; the application answers with send_welcome or send_conn_error."""
    AWAIT_WELCOME = "await_welcome"
    """Client: HELLO sent."""
    OPEN = "open"
    CLOSED = "closed"


_OUT_OF_TURN = {
    State.AWAIT_HELLO: "before HELLO: a client's first frame is HELLO (SPEC 6.1)",
    State.AWAIT_ACCEPT: "before WELCOME: a client sends nothing after its HELLO until the WELCOME (SPEC 6.1)",
    State.AWAIT_WELCOME: "before WELCOME: the server's first frame is WELCOME or CONN_ERROR (SPEC 6.1)",
    State.OPEN: "on an open connection: there is one handshake per connection (SPEC 6.1)",
}
"""Why a frame the state does not take is a violation, as the message of its PROTOCOL_ERROR."""


# receive_data looks at these per chunk or per frame: no Enum lookup there.
_AWAIT_WELCOME, _CONN_OPEN, _CONN_CLOSED = State.AWAIT_WELCOME, State.OPEN, State.CLOSED


class _Phase:
    """One end of a stream in one state: the lifecycle table's rows for it, each frame they
    allow leading straight to the phase after it, and what the connection keeps per state.

    One per (side, state), made once (_PHASES). A stream holds its phase, so a transition is
    one store, and what a state implies (is the stream ended, in ``_sendable``, counted as
    ours) is a flag here: a stream kept its side and state before, and each transition
    derived the rest again (making, accepting and completing one stream, as the server does
    per subscription: 136 bytecodes executed before, 57 now).
    """

    __slots__ = ("closed", "opened", "receives", "sendable", "sends", "side", "state")

    def __init__(self, side: Side, state: StreamState) -> None:
        self.side = side
        """This side's end of the stream: publisher or subscriber, opener or acceptor."""
        self.state = state
        self.closed = state is _CLOSED
        self.opened = side.opened
        """This side allocated the stream's id: it counts in ``_local_open``, not ``_peer_open``."""
        self.sendable = state is _OPEN and side.publishes
        """send_next may write to the stream: it is in ``Connection._sendable``."""
        self.sends: dict[StreamEvent, _Phase] = {}
        """What this side may send, each with the phase after it."""
        self.receives: dict[StreamEvent, _Phase] = {}
        """What the peer may send, each with the phase after it."""


_PHASES = {(side, state): _Phase(side, state) for side in Side for state in StreamState}
for (_side, _state), _phase in _PHASES.items():
    _phase.sends = {event: _PHASES[_side, after] for event, after in allowed(_side, _state).items()}
    _phase.receives = {event: _PHASES[_side, after] for event, after in allowed(_side.peer, _state).items()}
del _side, _state, _phase
# Each stream's first phase, by the frame that opened it.
_SUBSCRIBE_SENT, _OFFER_SENT = _PHASES[_SUBSCRIBER_OPENER, _OPENING], _PHASES[_PUBLISHER_OPENER, _OPENING]
_SUBSCRIBE_RECEIVED, _OFFER_RECEIVED = _PHASES[_PUBLISHER_ACCEPTOR, _OPENING], _PHASES[_SUBSCRIBER_ACCEPTOR, _OPENING]
_ANSWERED = _SUBSCRIBE_RECEIVED.sends[_ACCEPT].sends[_COMPLETE]  # after send_whole_stream
# [ACCEPT, stream_id, {}] and [COMPLETE, stream_id] around their packed id: a fixarray, the
# frame type (a positive fixint), and the empty map's fixmap.
_ACCEPT_HEAD, _NO_METADATA = bytes((0x93, _ACCEPT_TYPE)), b"\x80"
_COMPLETE_HEAD = bytes((0x92, _COMPLETE_TYPE))


class _Stream:
    """One open stream, from this side's point of view."""

    __slots__ = ("demand", "next_prefix", "phase")

    def __init__(self, phase: _Phase, demand: int) -> None:
        self.phase = phase
        self.demand = demand
        """Publishing: items we may still send. Subscribing: items the peer may still send.
        MAX_INT is unbounded and stays so (rule 3.17)."""
        self.next_prefix = b""
        """A stream we publish: the first bytes of every NEXT on it, encoded at the first ([NEXT, stream_id, ...)."""


_Run = tuple[int, list[Any], _Stream, Items]
"""An Items event being filled: its stream id, its item list, the stream, and the event."""


class Connection:
    """One end of an rsnet v1 connection, without I/O.

    A client connection queues its HELLO at construction: the first ``data_to_send()`` holds
    it. A server connection waits for HELLO, reports it as a :class:`Hello` event, and the
    application answers with :meth:`send_welcome` or rejects with :meth:`send_conn_error`.

    The keyword arguments are this side's settings: the largest frame it accepts, how many
    concurrent streams it lets the peer open, the keepalive interval in milliseconds (the
    client's is a proposal, the server's is what both use), and for a client an auth token
    and handshake metadata.

    ``receive_data`` never raises for anything the peer sends; ``send_*`` methods raise
    :class:`LocalProtocolError` when the frame would break the protocol, and write nothing.
    A connection is not thread-safe: one task or thread drives it.
    """

    def __init__(
        self,
        role: Role,
        *,
        max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
        max_streams: int = DEFAULT_MAX_STREAMS,
        keepalive_interval: int = DEFAULT_KEEPALIVE_INTERVAL,
        auth_token: str | bytes | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> None:
        if not MIN_MAX_FRAME_SIZE <= max_frame_size <= MAX_MAX_FRAME_SIZE:
            raise ValueError(f"max_frame_size must be in {MIN_MAX_FRAME_SIZE}..{MAX_MAX_FRAME_SIZE}")
        if not 0 <= max_streams <= MAX_SETTING or not 0 <= keepalive_interval <= MAX_SETTING:
            raise ValueError(f"max_streams and keepalive_interval must be in 0..{MAX_SETTING}")
        self.role = role
        self._state = State.AWAIT_WELCOME if role is Role.CLIENT else State.AWAIT_HELLO
        self._settings: dict[str, Any] = {
            "max_frame_size": max_frame_size,
            "max_streams": max_streams,
            "keepalive_interval": keepalive_interval,
        }
        if auth_token is not None:
            self._settings["auth_token"] = auth_token
        if metadata is not None:
            self._settings["metadata"] = _metadata(metadata)
        self._decoder = FrameDecoder(max_frame_size)
        self._pack = new_packer().pack
        self._out = bytearray()
        self._events: list[Event] = []
        self._streams: dict[int, _Stream] = {}
        # The streams send_next may write to: ours to publish, and accepted. A second table
        # so that the hot path checks one thing instead of three.
        self._sendable: dict[int, _Stream] = {}
        # Client ids are odd, server ids even; each side counts up by 2 and never reuses one.
        self._parity = 1 if role is Role.CLIENT else 0
        self._next_id = 1 if role is Role.CLIENT else 2
        self._peer_next_id = 2 if role is Role.CLIENT else 1
        self._local_open = 0
        self._peer_open = 0
        self._go_away_sent = False
        self._go_away_received = False
        self.version: int | None = None
        """The negotiated protocol version, once the handshake has completed."""
        self.peer_settings: dict[str, Any] = {}
        """The settings map of the peer's HELLO or WELCOME."""
        self.keepalive_interval = keepalive_interval
        """Milliseconds between keepalives; the WELCOME's value once the handshake is done."""
        # Until the peer says otherwise, send only what every peer must accept.
        self._peer_max_frame_size = MIN_MAX_FRAME_SIZE
        self._peer_max_streams = DEFAULT_MAX_STREAMS
        # WebSocket grouping: offsets in _out where a new message must start, and the length
        # of _out beyond which the current message would exceed the peer's max_frame_size
        # (SPEC "Framing on WebSocket").
        self._cuts: list[int] = []
        self._cut_at = MIN_MAX_FRAME_SIZE
        if role is Role.CLIENT:
            self._write_frame(Hello(MAGIC, [PROTOCOL_VERSION], self._settings))

    # ------------------------------------------------------------------ inspection

    @property
    def state(self) -> State:
        return self._state

    @property
    def stream_count(self) -> int:
        """Streams currently open in either direction."""
        return len(self._streams)

    @property
    def going_away(self) -> bool:
        """GO_AWAY was sent or received: no new streams; close once ``stream_count`` is 0."""
        return self._go_away_sent or self._go_away_received

    def outstanding_demand(self, stream_id: int) -> int:
        """Items that may still flow on the stream: for a stream we publish, how many we may
        send; for one we subscribe to, how many the peer may still send. 0 once it closed."""
        stream = self._streams.get(stream_id)
        return 0 if stream is None else stream.demand

    # ------------------------------------------------------------------ receiving

    def receive_data(self, data: bytes | bytearray | memoryview) -> None:
        """Process bytes received from the transport; never raises for what the peer sent.

        Violations are answered as the spec says: a stream error is written to
        ``data_to_send()`` and reported as an :class:`Error` event; a connection error is
        written as CONN_ERROR and reported as :class:`ConnectionClosed`, after which further
        data is ignored. Frames before the violation are processed.
        """
        if self._state is _CONN_OPEN:
            receivers = _RECEIVERS
        else:
            if self._state is _CONN_CLOSED:
                return
            # What the first bytes of the connection say (never a later chunk: the byte after a
            # split inside a frame may be any letter).
            first = not self._decoder.position and not self._decoder.buffered
            if self._state is _AWAIT_WELCOME and first and bytes(data[:5]) == b"HTTP/":
                # A web server's answer (an HTTP port given for an rsnet one): say so, not "a
                # frame must be an array". Only the first bytes a client receives can be this.
                self._fail(
                    ErrorCode.PROTOCOL_ERROR,
                    "the server answered in HTTP, not the rsnet protocol: is it a web port?",
                )
                return
            if self._state is State.AWAIT_HELLO and first and data[:1]:
                guess = _not_rsnet(bytes(data[:1]))
                if guess:  # (these bytes fail as frames anyway: the message says what they are)
                    self._fail(ErrorCode.PROTOCOL_ERROR, guess)
                    return
            receivers = _HANDSHAKING
        decoder = self._decoder
        frames = decoder.frames(data)
        # Bytes per Items event (Items.nbytes): ``mark`` is where the last frame counted ended;
        # ``given`` the event that the frame after a run of NEXT frames was counted for already.
        mark = decoder.position
        given = None
        try:
            for fields in frames:
                while True:
                    # Each frame type's parser and handler in one (the exact type check: msgpack's
                    # true and 16.0 hash as 1 and 16 do). Before the handshake completes every
                    # frame, and after it extension frames, malformed ones and CONN_ERROR (the one
                    # frame that closes the connection), take _receive_frame.
                    kind = fields[0] if type(fields) is list and fields else None
                    receiver = receivers.get(kind) if type(kind) is int else None
                    if receiver is None:
                        self._receive_frame(fields)
                        if self._state is _CONN_CLOSED:
                            return
                        receivers = _RECEIVERS if self._state is _CONN_OPEN else _HANDSHAKING
                        run = None
                    else:
                        run = receiver(self, fields)
                    if run is None:
                        mark = decoder.position
                        given = None
                        break
                    # An item frame: its bytes count for its Items event, unless they already
                    # did as the end of a run of NEXT frames of that same event (below).
                    run_id, run_items, run_stream, event = run
                    end = decoder.position
                    if event is not given:
                        event.nbytes += end - mark
                    mark = end
                    counted = len(run_items)
                    # Hot path: the NEXT frames that follow for the same stream. `is _NEXT` holds
                    # for the decoded int 21 because CPython shares small ints; a miss only means
                    # the frame takes its handler, which validates everything. The exact type
                    # check keeps msgpack's true and 1.0 from passing for stream id 1.
                    for fields in frames:
                        if type(fields) is list and len(fields) == 3:
                            frame_type, stream_id, item = fields
                            if (
                                frame_type is _NEXT
                                and stream_id == run_id
                                and item is not None
                                and type(stream_id) is int
                            ):
                                demand = run_stream.demand
                                if demand:
                                    if demand != MAX_INT:
                                        run_stream.demand = demand - 1
                                    run_items.append(item)
                                    continue
                        break
                    else:  # the data ended
                        if len(run_items) != counted:
                            event.nbytes += decoder.position - mark
                        return
                    # ``fields`` ends the run. The bytes since ``mark``, of the NEXT frames the hot
                    # path took and of this frame, count for the run's event, and for this
                    # frame's too if it is an item frame of another event (an estimate that can
                    # only be high: the decoder is not asked for a position per NEXT frame).
                    given = None
                    if len(run_items) != counted:
                        event.nbytes += decoder.position - mark
                        given = event
        except RemoteProtocolError as exc:
            self._fail(exc.code, exc.message)

    def receive_eof(self) -> None:
        """The transport reached end of file: the connection is over (SPEC "Closing")."""
        if self._state is State.CLOSED:
            return
        if self._decoder.buffered:
            message = "connection closed in the middle of a frame"
        elif self._state is not State.OPEN:
            message = "connection closed during the handshake"
        elif self._streams:
            message = f"connection closed with {len(self._streams)} stream(s) open"
        else:
            message = "connection closed"
        self._close()
        self._events.append(ConnectionClosed(None, message))

    def events_received(self) -> list[Event]:
        """The events since the last call, in the order the frames arrived."""
        events = self._events
        self._events = []
        return events

    # ------------------------------------------------------------------ output

    @property
    def peer_max_frame_size(self) -> int:
        """The largest frame the peer accepts (the smallest any peer must, until it said)."""
        return self._peer_max_frame_size

    @property
    def buffered(self) -> int:
        """Bytes written and not yet taken by ``data_to_send``."""
        return len(self._out)

    def data_to_send(self) -> bytearray:
        """All bytes written since the last call (whole frames); the caller owns the buffer."""
        out = self._out
        self._out = bytearray()
        if self._cuts:  # else _cut_at is the peer's max_frame_size already (see _cut)
            self._cuts = []
            self._cut_at = self._peer_max_frame_size
        return out

    def data_to_send_messages(self) -> list[bytearray] | list[memoryview]:
        """``data_to_send()`` cut into WebSocket binary messages at frame boundaries.

        Each message holds whole frames and is at most the peer's max_frame_size bytes. The
        messages are views of one buffer the caller owns (no copy).
        """
        cuts = self._cuts
        out = self.data_to_send()
        if not cuts:
            return [out] if out else []
        view = memoryview(out)
        bounds = [0, *cuts, len(out)]
        return [view[a:b] for a, b in itertools.pairwise(bounds) if b > a]

    # ------------------------------------------------------------------ connection frames

    def send_welcome(self, metadata: dict[str, Any] | None = None) -> None:
        """Server: accept the client's HELLO; the connection is open.

        A no-op if the connection has closed meanwhile: bytes that arrived with the HELLO broke
        the protocol (SPEC 6.1), so the CONN_ERROR answering them is already written and must
        be the first and last frame this side sends.
        """
        if self._state is State.CLOSED:
            return
        if self._state is not State.AWAIT_ACCEPT:
            raise LocalProtocolError(ErrorCode.PROTOCOL_ERROR, f"WELCOME in state {self._state.name}")
        settings = {key: self._settings[key] for key in ("max_frame_size", "max_streams", "keepalive_interval")}
        if metadata is not None:
            settings["metadata"] = _metadata(metadata)
        self._write_frame(Welcome(PROTOCOL_VERSION, settings))
        self._state = State.OPEN

    def send_conn_error(self, code: int, message: str = "", data: Any = None) -> None:
        """Close the connection with an error (or reject a HELLO); write nothing more after it.

        No event is reported for it. A no-op if the connection is already closed.
        """
        if self._state is State.CLOSED:
            return
        self._write_frame(ConnError(_code(code), _bounded_message(message), self._bounded_data(data)))
        self._close()

    def send_ping(self, token: int = 0) -> None:
        """Write a PING; the peer's PONG with the same token arrives as a :class:`Pong` event."""
        self._require_open()
        self._write_frame(Ping(_uint(token, "token")))

    def send_go_away(self, message: str = "") -> None:
        """Start a graceful shutdown: no new streams either way; open ones run to their end."""
        self._require_open()
        if not self._go_away_sent:
            self._go_away_sent = True
            self._write_frame(GoAway(_bounded_message(message)))

    # ------------------------------------------------------------------ opening streams

    def send_subscribe(
        self,
        name: str,
        params: Any = None,
        *,
        initial_demand: int = 0,
        metadata: dict[str, Any] | None = None,
    ) -> int:
        """Subscribe to the peer's publisher ``name``; returns the new stream id.

        ``initial_demand`` is requested along with the subscription (0: none yet). The peer
        answers with an :class:`Accept` event, or an :class:`Error` event that rejects it.
        """
        stream_id = self._allocate()
        if type(initial_demand) is not int or initial_demand < 0 or type(name) is not str:
            _uint(initial_demand, "initial_demand")  # raises, or else:
            _name(name)
        demand = min(initial_demand, MAX_INT)
        metadata = {} if metadata is None else _metadata(metadata)
        fields = [_SUBSCRIBE_TYPE, stream_id, name, params, demand, metadata]
        return self._open(stream_id, fields, _Stream(_SUBSCRIBE_SENT, demand))

    def send_offer(self, name: str, params: Any = None, *, metadata: dict[str, Any] | None = None) -> int:
        """Offer a publisher to the peer under ``name``; returns the new stream id.

        The peer answers with :class:`Accept` and then :class:`Request` events, or an
        :class:`Error` event that rejects it. Items may be sent once demand arrives.
        """
        stream_id = self._allocate()
        fields = [_OFFER_TYPE, stream_id, _name(name), params, {} if metadata is None else _metadata(metadata)]
        return self._open(stream_id, fields, _Stream(_OFFER_SENT, 0))

    def send_accept(self, stream_id: int, metadata: dict[str, Any] | None = None) -> None:
        """Accept a stream the peer opened with SUBSCRIBE or OFFER (the remote ``on_subscribe``).

        To reject it instead, use :meth:`send_error`.
        """
        metadata = {} if metadata is None else _metadata(metadata)
        self._send_transition(stream_id, _ACCEPT, [_ACCEPT_TYPE, stream_id, metadata])

    # ------------------------------------------------------------------ subscriber side

    def send_request(self, stream_id: int, n: int) -> None:
        """Grant ``n`` more items (rule 3.8); demand saturates at 2**63-1, unbounded (3.17).

        Raises ``INVALID_REQUEST`` for ``n <= 0``: rule 3.9 is the local subscription's to
        signal, so such a REQUEST never goes on the wire. A no-op on a closed stream (3.6).
        """
        stream = self._streams.get(stream_id)
        if stream is None or _REQUEST not in stream.phase.sends or type(stream_id) is not int:
            self._refuse_send(stream_id, _REQUEST)
            return
        if type(n) is not int or n <= 0:
            raise LocalProtocolError(ErrorCode.INVALID_REQUEST, f"rule 3.9: request({n!r}) must be positive")
        n = min(n, MAX_INT)
        self._write_fields([_REQUEST_TYPE, stream_id, n])
        stream.demand = min(stream.demand + n, MAX_INT)

    def send_cancel(self, stream_id: int) -> None:
        """Cancel the subscription (rule 3.12). Idempotent (rule 3.7): a no-op once closed.

        Items, COMPLETE or ERROR already in flight are dropped when they arrive.
        """
        self._send_transition(stream_id, _CANCEL, [_CANCEL_TYPE, stream_id])

    # ------------------------------------------------------------------ publisher side

    def send_next(self, stream_id: int, item: Any) -> None:
        """Send one item on a stream we publish.

        Raises ``FLOW_CONTROL`` when the peer has no outstanding demand (rule 1.1),
        ``PROTOCOL_ERROR`` for ``None`` (rule 2.13) or before ACCEPT, ``FRAME_TOO_LARGE``
        when the frame exceeds the peer's max_frame_size, ``APPLICATION_ERROR`` when the item
        is not encodable. A no-op when the stream was closed (e.g. the peer cancelled).
        An :class:`~rsnet.protocol.codec.Encoded` item goes out as the bytes it holds.
        """
        try:
            stream = self._sendable[stream_id]
        except KeyError:
            return self._refuse_items(stream_id, [item])
        demand = stream.demand
        if not demand or item is None or type(stream_id) is not int:
            return self._refuse_items(stream_id, [item])
        prefix = stream.next_prefix
        if not prefix:  # made at the stream's first NEXT: most streams send BATCH frames only
            prefix = stream.next_prefix = _NEXT_HEAD + self._pack(stream_id)
        body: bytes
        if type(item) is Encoded:
            body = item
        else:
            try:
                body = self._pack(item)
            except Exception as exc:
                raise _not_encodable(exc) from exc
            if len(body) > PACKER_KEEP:
                self._renew_packer()
        out = self._out
        # Measuring the body against a limit lowered by the longest prefix saves work per item;
        # the cost is that a WebSocket message may end a few bytes before it had to.
        if len(out) + len(body) > self._cut_at - _MAX_NEXT_PREFIX:
            self._cut(len(prefix) + len(body))
        if demand != MAX_INT:
            stream.demand = demand - 1
        out += prefix
        out += body

    def send_batch(self, stream_id: int, items: list[Any] | tuple[Any, ...], *, encoded: bool = False) -> None:
        """Send several items on a stream we publish, in as few BATCH frames as fit.

        All or nothing: raises as :meth:`send_next` would, before writing anything, when the
        items exceed the demand, contain ``None``, or one item alone exceeds the frame limit.
        With ``encoded``, items may be :class:`~rsnet.protocol.codec.Encoded` (each goes out
        as the bytes it holds); without it, every item is a value to pack (checking each
        item's type would cost a quarter of the packing).
        """
        stream = self._sendable.get(stream_id)
        count = len(items)
        if stream is None or count > stream.demand or None in items or type(stream_id) is not int:
            return self._refuse_items(stream_id, items)
        if not count:
            return
        if encoded:
            frames = self._join_batch(stream_id, self._item_bytes(items))
        elif count == 1:
            # One item (a round trip's answer): the connection's packer, whose bytes cost less
            # to make than a scratch packer's take and release (50 bytecodes on the server's
            # path of every first item), and which an item bigger than PACKER_KEEP renews.
            frames = self._encode_batch(stream_id, items)
        elif self._append_batch(stream_id, items):
            frames = []
        else:  # too large for one frame: in halves, each split again until it fits
            half = count // 2
            frames = self._encode_batch(stream_id, items[:half]) + self._encode_batch(stream_id, items[half:])
        out = self._out
        for frame in frames:  # appended as in _write_fields
            if len(out) + len(frame) > self._cut_at:
                self._cut(len(frame))
            out += frame
        if stream.demand != MAX_INT:
            stream.demand -= count

    def send_complete(self, stream_id: int) -> None:
        """Complete a stream we publish (rule 1.5). A no-op once the stream is closed."""
        self._send_transition(stream_id, _COMPLETE, [_COMPLETE_TYPE, stream_id])

    def send_whole_stream(self, stream_id: int, items: list[Any]) -> bool:
        """Answer the peer's SUBSCRIBE with the whole stream at once, as a request's answer:
        ACCEPT, ``items`` in one BATCH (no BATCH for none), COMPLETE. The same bytes as
        :meth:`send_accept`, :meth:`send_batch` and :meth:`send_complete` one after the other,
        with one stream lookup and one transition instead of three.

        Returns False, with nothing written, where it takes more than that: the stream is not a
        SUBSCRIBE waiting for its ACCEPT, the items exceed its demand or hold None, an item
        cannot be packed, or the frames do not fit the peer's max_frame_size or the current
        WebSocket message. Then send them one by one, which says why or cuts where needed.
        """
        stream = self._streams.get(stream_id)
        if (
            stream is None
            or stream.phase is not _SUBSCRIBE_RECEIVED
            or type(stream_id) is not int
            or len(items) > stream.demand
            or None in items
        ):
            return False
        try:
            batch = self._pack([_BATCH, stream_id, items]) if items else b""
            packed_id = self._pack(stream_id)
        except Exception:
            return False
        if len(batch) > PACKER_KEEP:
            self._renew_packer()
        out = self._out
        size = len(_ACCEPT_HEAD) + 2 * len(packed_id) + len(_NO_METADATA) + len(batch) + len(_COMPLETE_HEAD)
        if len(batch) > self._peer_max_frame_size or len(out) + size > self._cut_at:
            return False
        out += _ACCEPT_HEAD
        out += packed_id
        out += _NO_METADATA
        out += batch
        out += _COMPLETE_HEAD
        out += packed_id
        self._enter(stream_id, stream, _ANSWERED)
        return True

    def _send_transition(self, stream_id: int, event: StreamEvent, fields: list[Any]) -> None:
        """Write ``fields``, the frame of ``event`` (ACCEPT, CANCEL, COMPLETE or ERROR), and move
        the stream along the lifecycle table; a no-op once the stream is closed."""
        stream = self._streams.get(stream_id)
        if stream is not None and type(stream_id) is int:
            after = stream.phase.sends.get(event)
            if after is not None:
                self._write_fields(fields)
                self._enter(stream_id, stream, after)
                return
        self._refuse_send(stream_id, event)

    # ------------------------------------------------------------------ either side

    def send_error(self, stream_id: int, code: int, message: str = "", data: Any = None) -> None:
        """End a stream with an error; a no-op once the stream is closed.

        From the publisher side it is the remote ``on_error``; in answer to SUBSCRIBE or
        OFFER, before ACCEPT, it rejects the stream; from the subscriber side it cancels and
        says why. ``code`` is an :class:`ErrorCode` or an application code (>= 4096).
        """
        error = Error(stream_id, _code(code), _bounded_message(message), self._bounded_data(data))
        self._send_transition(stream_id, _ERROR, frame_fields(error))

    # ------------------------------------------------------------------ internals: sending

    def _write_frame(self, frame: Any) -> None:
        self._write_fields(frame_fields(frame))

    def _write_fields(self, fields: list[Any]) -> None:
        """Write a frame given as its wire array (the stream-level sends build it directly:
        a frame object and frame_fields would double what writing one costs).

        The frame goes in the current WebSocket message if it fits, else _cut starts a new
        one. send_next and send_batch append the same way, written out as here: a method for
        these three lines cost as much again to call (7 of 22 bytecodes a frame)."""
        try:
            frame = self._pack(fields)
        except Exception as exc:
            raise _not_encodable(exc) from exc
        if len(frame) > PACKER_KEEP:
            self._renew_packer()
        out = self._out
        if len(out) + len(frame) > self._cut_at:
            self._cut(len(frame))
        out += frame

    def _bounded_data(self, data: Any) -> Any:
        """``data`` if it encodes to at most MAX_ERROR_DATA bytes, else a marker saying how big it was."""
        if data is None or type(data) in (bool, int, float):
            return data
        try:
            size = len(self._pack(data))
        except Exception as exc:
            raise _not_encodable(exc) from exc
        if size > PACKER_KEEP:
            self._renew_packer()
        if size <= MAX_ERROR_DATA:
            return data
        return f"{TRUNCATED} {size} bytes of data, over the limit of {MAX_ERROR_DATA}"

    def _cut(self, size: int) -> None:
        """Start a new WebSocket message before a frame of ``size`` bytes, or refuse it."""
        if size > self._peer_max_frame_size:
            raise LocalProtocolError(
                ErrorCode.FRAME_TOO_LARGE,
                f"a {size}-byte frame exceeds the peer's max_frame_size ({self._peer_max_frame_size})",
            )
        self._cuts.append(len(self._out))
        self._cut_at = len(self._out) + self._peer_max_frame_size

    def _append_batch(self, stream_id: int, items: list[Any] | tuple[Any, ...]) -> bool:
        """Write ``items`` as one BATCH frame, packed by the thread's :class:`ScratchPacker`
        and copied straight into the output; False, with nothing written, if the frame would
        exceed the peer's max_frame_size."""
        scratch = scratch_packer()
        try:
            frame = scratch.pack([_BATCH, stream_id, items])
        except Exception as exc:
            raise _not_encodable(exc) from exc
        with frame:
            size = len(frame)
            fits = size <= self._peer_max_frame_size
            if fits:
                out = self._out  # appended as in _write_fields (_cut cannot refuse it: it fits)
                if len(out) + size > self._cut_at:
                    self._cut(size)
                out += frame
        scratch.release(size)
        return fits

    def _encode_batch(self, stream_id: int, items: Any) -> list[bytes]:
        # Encode the whole batch; if it is too large, split it in halves until each fits.
        try:
            frame = self._pack([_BATCH, stream_id, items])
        except Exception as exc:
            raise _not_encodable(exc) from exc
        if len(frame) > PACKER_KEEP:
            self._renew_packer()
        if len(frame) <= self._peer_max_frame_size:
            return [frame]
        if len(items) == 1:
            raise LocalProtocolError(
                ErrorCode.FRAME_TOO_LARGE,
                f"an item of {len(frame)} bytes exceeds the peer's max_frame_size ({self._peer_max_frame_size})",
            )
        half = len(items) // 2
        return self._encode_batch(stream_id, items[:half]) + self._encode_batch(stream_id, items[half:])

    def _item_bytes(self, items: list[Any] | tuple[Any, ...]) -> list[Any] | tuple[Any, ...]:
        """Each item's encoding: Encoded items as they are, other values packed."""
        if set(map(type, items)) == _ENCODED_ONLY:
            return items
        try:
            parts = [item if type(item) is Encoded else self._pack(item) for item in items]
        except Exception as exc:
            raise _not_encodable(exc) from exc
        if max(map(len, parts), default=0) > PACKER_KEEP:
            self._renew_packer()
        return parts

    def _renew_packer(self) -> None:
        """A new packer in place of one that packed more than PACKER_KEEP bytes at once: a
        packer keeps the buffer of the largest value it packed for as long as it lives, the
        connection's lifetime (a BATCH packed whole before it is split to fit: several MiB per
        connection, outside every budget)."""
        self._pack = new_packer().pack

    def _join_batch(self, stream_id: int, parts: list[Any] | tuple[Any, ...]) -> list[bytes]:
        # The BATCH frames of already encoded items: a frame head, then the items' bytes as
        # they are; split in halves, as _encode_batch does, until each frame fits.
        pack = self._pack
        head = b"\x93" + pack(_BATCH) + pack(stream_id) + _array_header(len(parts))
        frame = head + b"".join(parts)
        if len(frame) <= self._peer_max_frame_size:
            return [frame]
        if len(parts) == 1:
            raise LocalProtocolError(
                ErrorCode.FRAME_TOO_LARGE,
                f"an item of {len(frame)} bytes exceeds the peer's max_frame_size ({self._peer_max_frame_size})",
            )
        half = len(parts) // 2
        return self._join_batch(stream_id, parts[:half]) + self._join_batch(stream_id, parts[half:])

    def _refuse_items(self, stream_id: int, items: list[Any] | tuple[Any, ...]) -> None:
        """Why items cannot be sent: raise the reason, or return if the stream is closed."""
        stream = self._streams.get(stream_id)
        if stream is None or _ITEMS not in stream.phase.sends or type(stream_id) is not int:
            self._refuse_send(stream_id, _ITEMS)
            return
        if None in items:
            raise LocalProtocolError(ErrorCode.PROTOCOL_ERROR, "rule 2.13: items must not be None")
        raise LocalProtocolError(
            ErrorCode.FLOW_CONTROL,
            f"rule 1.1: the peer's outstanding demand on stream {stream_id} is {stream.demand}",
        )

    def _ours(self, stream_id: int) -> bool:
        """Whether this side allocated (opened) ``stream_id``: client ids are odd."""
        return (stream_id & 1) == self._parity

    def _was_opened(self, stream_id: int) -> bool:
        """Whether ``stream_id`` was ever opened: ids are allocated in order, never reused."""
        return 0 < stream_id < (self._next_id if self._ours(stream_id) else self._peer_next_id)

    def _refuse_send(self, stream_id: int, event: StreamEvent) -> None:
        """Why this side may not send ``event`` on the stream now: raises
        :class:`LocalProtocolError` if it was never opened or the lifecycle table does not let
        this side send it; returns if it was open once and has ended (the send is a no-op,
        rules 3.6, 3.7). The sends look the stream and the transition up themselves, as the
        handlers of received frames do (see _refuse_received).

        A stream id that is not exactly an int is refused first: ``True`` and ``1.0`` equal 1,
        so they find stream 1, and would go on the wire as a boolean or a float."""
        if type(stream_id) is not int:
            raise LocalProtocolError(
                ErrorCode.PROTOCOL_ERROR, f"a stream id is an int, not {type(stream_id).__name__} ({stream_id!r})"
            )
        stream = self._streams.get(stream_id)
        if stream is None:
            if self._was_opened(stream_id):
                return
            raise LocalProtocolError(ErrorCode.PROTOCOL_ERROR, f"stream {stream_id!r} was never opened")
        raise LocalProtocolError(
            ErrorCode.PROTOCOL_ERROR, _forbidden(stream_id, stream.phase.side, stream.phase.state, event)
        )

    def _allocate(self) -> int:
        """The id of the stream this side opens next, or the reason it may not open one."""
        stream_id = self._next_id
        # Every reason at once; which one holds only on the way to the error.
        if (
            self._state is not _CONN_OPEN
            or self._go_away_sent
            or self._go_away_received
            or self._local_open >= self._peer_max_streams
            or stream_id > MAX_INT
        ):
            self._require_open()
            if self.going_away:
                raise LocalProtocolError(ErrorCode.GOING_AWAY, "no new streams after GO_AWAY")
            if self._local_open >= self._peer_max_streams:
                raise LocalProtocolError(
                    ErrorCode.TOO_MANY_STREAMS, f"the peer allows {self._peer_max_streams} concurrent streams"
                )
            raise LocalProtocolError(ErrorCode.PROTOCOL_ERROR, "stream ids exhausted: open a new connection")
        return stream_id

    def _open(self, stream_id: int, fields: list[Any], stream: _Stream) -> int:
        """Write a SUBSCRIBE or OFFER and open its stream, with the id _allocate gave (the
        peer's opens in _on_open); returns the id. The sends check their
        arguments at once, and call the checkers for what is wrong, in order: with _allocate
        testing every reason it may not open at once, client-open's bytecodes in the
        protocol 199 -> 174 per subscription (eight calls, now five)."""
        self._write_fields(fields)
        self._streams[stream_id] = stream
        self._next_id = stream_id + 2
        self._local_open += 1
        return stream_id

    def _enter(self, stream_id: int, stream: _Stream, phase: _Phase) -> None:
        """Move the stream to ``phase`` (a transition the lifecycle table allowed): it leaves
        the table if that ends it."""
        if phase.closed:
            del self._streams[stream_id]
            left = stream.phase
            if left.sendable:
                del self._sendable[stream_id]
            if left.opened:
                self._local_open -= 1
            else:
                self._peer_open -= 1
        else:
            stream.phase = phase
            if phase.sendable:
                self._sendable[stream_id] = stream

    def _close(self) -> None:
        self._state = State.CLOSED
        self._streams.clear()
        self._sendable.clear()
        self._local_open = self._peer_open = 0

    def _require_open(self) -> None:
        if self._state is not State.OPEN:
            raise LocalProtocolError(ErrorCode.PROTOCOL_ERROR, f"the connection is {self._state.name}")

    # ------------------------------------------------------------------ internals: receiving

    def _receive_frame(self, fields: Any) -> None:
        """Handle a frame the open connection's table (_RECEIVERS) does not: any frame before
        the handshake completes, an extension frame, or one that is not a v1 frame at all."""
        frame = parse_frame(fields)
        if frame is None:
            return  # an extension frame this version does not know: ignored
        if type(frame) is ConnError:
            self._on_conn_error(frame)
            return
        if self._state is State.AWAIT_HELLO and type(frame) is Hello:
            self._on_hello(frame)
            return
        if self._state is State.AWAIT_WELCOME and type(frame) is Welcome:
            self._on_welcome(frame)
            return
        raise _violation(f"{frame.TYPE.name} {_OUT_OF_TURN.get(self._state, 'in state ' + self._state.name)}")

    def _fail(self, code: int, message: str, data: Any = None) -> None:
        """A connection-level violation by the peer: answer with CONN_ERROR and close."""
        self._write_frame(ConnError(code, message, data))
        self._close()
        self._events.append(ConnectionClosed(code, message, data, by_peer=False))

    def _stream_error(self, stream_id: int, stream: _Stream, code: int, message: str) -> None:
        """A stream-level violation by the peer: end the stream with ERROR, keep the connection."""
        error = Error(stream_id, code, message, None)
        self._write_frame(error)
        self._enter(stream_id, stream, _PHASES[stream.phase.side, _CLOSED])
        self._events.append(error)

    def _on_hello(self, hello: Hello) -> None:
        if PROTOCOL_VERSION not in hello.versions:
            self._fail(
                ErrorCode.UNSUPPORTED_VERSION,
                f"no common version: offered {hello.versions}, supported [{PROTOCOL_VERSION}]",
                {"versions": [PROTOCOL_VERSION]},
            )
            return
        self._handshake(PROTOCOL_VERSION, hello.settings, self.keepalive_interval)
        self._state = State.AWAIT_ACCEPT
        self._events.append(hello)

    def _on_welcome(self, welcome: Welcome) -> None:
        if welcome.version != PROTOCOL_VERSION:
            raise _violation(f"WELCOME chose version {welcome.version}, which was not offered")
        self._handshake(
            welcome.version, welcome.settings, welcome.settings.get("keepalive_interval", DEFAULT_KEEPALIVE_INTERVAL)
        )
        self._state = State.OPEN
        self._events.append(welcome)

    def _handshake(self, version: int, settings: dict[str, Any], keepalive_interval: int) -> None:
        self.version = version
        self.peer_settings = settings
        self.keepalive_interval = keepalive_interval
        self._peer_max_streams = settings.get("max_streams", DEFAULT_MAX_STREAMS)
        self._peer_max_frame_size = settings.get("max_frame_size", DEFAULT_MAX_FRAME_SIZE)
        self._cut_at = (self._cuts[-1] if self._cuts else 0) + self._peer_max_frame_size

    # The handlers of the open connection's frames (_RECEIVERS) take the decoded array, and
    # parse it themselves: an item frame's handler returns the Items run it extended (see
    # receive_data's hot path), every other handler None.

    def _unexpected(self, fields: list[Any]) -> None:
        frame = PARSERS[fields[0]](fields)  # a malformed one is refused as such first
        raise _violation(f"{frame.TYPE.name} after the handshake")

    def _on_ping(self, fields: list[Any]) -> None:
        self._write_frame(Pong(_parse_ping(fields).token))

    def _on_pong(self, fields: list[Any]) -> None:
        self._events.append(_parse_pong(fields))

    def _on_go_away(self, fields: list[Any]) -> None:
        go_away = _parse_go_away(fields)
        if not self._go_away_received:
            self._go_away_received = True
            self._events.append(go_away)

    def _on_conn_error(self, error: ConnError) -> None:
        self._close()
        self._events.append(ConnectionClosed(error.code, error.message, error.data, by_peer=True))

    def _on_open(self, fields: list[Any]) -> None:
        """SUBSCRIBE or OFFER: the peer opens a stream, which it subscribes to or publishes."""
        subscribes = fields[0] == _SUBSCRIBE_TYPE
        frame = _parse_subscribe(fields) if subscribes else _parse_offer(fields)
        stream_id = frame.stream_id
        if (
            stream_id != self._peer_next_id
            or self._go_away_sent
            or self._go_away_received
            or self._peer_open >= self._settings["max_streams"]
        ):
            self._refuse_open(frame)
            return
        self._peer_next_id = stream_id + 2
        self._streams[stream_id] = (
            _Stream(_SUBSCRIBE_RECEIVED, frame.initial_demand) if subscribes else _Stream(_OFFER_RECEIVED, 0)
        )
        self._peer_open += 1
        self._events.append(frame)

    def _refuse_open(self, frame: Subscribe | Offer) -> None:
        """Why the peer's SUBSCRIBE or OFFER does not open a stream: raises
        :class:`RemoteProtocolError` if it breaks the protocol, or answers it with ERROR (a
        stream error the connection answers itself; the id is used up anyway). _on_open tests all
        of it at once, and comes here only when one of it holds."""
        stream_id = frame.stream_id
        if stream_id != self._peer_next_id:
            raise _violation(f"{frame.TYPE.name} opened stream {stream_id}, expected {self._peer_next_id}")
        if self._go_away_received:
            raise _violation(f"{frame.TYPE.name} after the peer's own GO_AWAY")
        self._peer_next_id += 2
        if self._go_away_sent:
            self._write_frame(Error(stream_id, ErrorCode.GOING_AWAY, "going away: retry on a new connection", None))
        else:
            self._write_frame(Error(stream_id, ErrorCode.TOO_MANY_STREAMS, "too many concurrent streams", None))

    def _refuse_received(self, stream_id: int, event: StreamEvent) -> None:
        """Why the peer may not send ``event`` on the stream now: raises
        :class:`RemoteProtocolError` if the stream was never opened or the lifecycle table does
        not let the peer send it; returns if the stream has ended (drop the frame: late frames
        are expected, rule 2.8).

        The handlers look the stream and the transition up themselves, and come here only when
        that fails: a call fewer per frame on the path of every stream frame."""
        stream = self._streams.get(stream_id)
        if stream is None:
            if self._was_opened(stream_id):
                return
            raise _violation(f"{event.value} for stream {stream_id}, which was never opened")
        raise _violation(_forbidden(stream_id, stream.phase.side.peer, stream.phase.state, event))

    def _on_request(self, fields: list[Any]) -> None:
        request = _parse_request(fields)
        stream_id = request.stream_id
        stream = self._streams.get(stream_id)
        if stream is None or _REQUEST not in stream.phase.receives:
            self._refuse_received(stream_id, _REQUEST)
            return
        if request.n <= 0:
            self._stream_error(
                stream_id, stream, ErrorCode.INVALID_REQUEST, f"rule 3.9: request({request.n}) is not positive"
            )
            return
        stream.demand = min(stream.demand + request.n, MAX_INT)
        self._events.append(request)


def _on_items(
    validate: Callable[[list[Any]], list[Any]], batch: bool
) -> Callable[[Connection, list[Any]], _Run | None]:
    """The handler of NEXT or BATCH frames: they are not events, their items are (Items)."""

    def on_items(conn: Connection, fields: list[Any]) -> _Run | None:
        validate(fields)
        stream_id = fields[1]
        stream = conn._streams.get(stream_id)
        if stream is None or _ITEMS not in stream.phase.receives:
            conn._refuse_received(stream_id, _ITEMS)
            return None
        # The decoded array's own list: nothing else holds it, so the event takes it uncopied.
        items = fields[2] if batch else [fields[2]]
        if None in items:
            conn._stream_error(stream_id, stream, ErrorCode.PROTOCOL_ERROR, "rule 2.13: an item is nil")
            return None
        demand = stream.demand
        count = len(items)
        if count > demand:
            conn._stream_error(
                stream_id, stream, ErrorCode.FLOW_CONTROL, f"rule 1.1: {count} items with {demand} outstanding demand"
            )
            return None
        if demand != MAX_INT:
            stream.demand = demand - count
        events = conn._events
        last = events[-1] if events else None
        if type(last) is Items and last.stream_id == stream_id:
            last.items.extend(items)
        else:
            last = Items(stream_id, items)
            events.append(last)
        return stream_id, last.items, stream, last

    return on_items


def _on_transition(event: StreamEvent, parse: Callable[[list[Any]], Any]) -> Callable[[Connection, list[Any]], None]:
    """The handler of a stream frame that only moves its stream along the lifecycle table
    (ACCEPT, CANCEL, COMPLETE, ERROR): the frame is the event."""

    def on_frame(conn: Connection, fields: list[Any]) -> None:
        frame = parse(fields)
        stream_id = frame.stream_id
        stream = conn._streams.get(stream_id)
        if stream is not None:
            after = stream.phase.receives.get(event)
            if after is not None:
                conn._enter(stream_id, stream, after)
                conn._events.append(frame)
                return
        conn._refuse_received(stream_id, event)

    return on_frame


_parse_ping, _parse_pong, _parse_go_away = (PARSERS[cls.TYPE.value] for cls in (Ping, Pong, GoAway))
_parse_subscribe, _parse_offer, _parse_request = (PARSERS[cls.TYPE.value] for cls in (Subscribe, Offer, Request))

# Once the connection is open, what each frame type number does (CONN_ERROR aside: it closes
# the connection, so it takes the slow path, after which receive_data looks at the state).
# One table of plain functions for every connection: a table of bound methods in each
# Connection made every connection a reference cycle, which only a full garbage collection
# freed (with its buffers). Each handler parses its frame itself and finds its stream without
# a helper, and NEXT and BATCH make no frame object. receive_data only dispatches, and keeps
# the Items runs' bookkeeping to item frames: bytecodes executed for the client's receive of
# an answer (ACCEPT, a BATCH of one item, COMPLETE) 377 -> 224 in receive_data, and for the
# server's of a SUBSCRIBE 143 -> 77 (a parser and handler pair per frame type before, and a
# NEXT check, the Items accounting and a state check on every frame).
_RECEIVERS: dict[int, Callable[[Connection, list[Any]], _Run | None]] = {
    cls.TYPE.value: handle
    for cls, handle in (
        (Hello, Connection._unexpected),
        (Welcome, Connection._unexpected),
        (Ping, Connection._on_ping),
        (Pong, Connection._on_pong),
        (GoAway, Connection._on_go_away),
        (Subscribe, Connection._on_open),
        (Offer, Connection._on_open),
        (Accept, _on_transition(_ACCEPT, PARSERS[Accept.TYPE.value])),
        (Request, Connection._on_request),
        (Cancel, _on_transition(_CANCEL, PARSERS[Cancel.TYPE.value])),
        (Next, _on_items(VALIDATE_NEXT, batch=False)),
        (Batch, _on_items(VALIDATE_BATCH, batch=True)),
        (Complete, _on_transition(_COMPLETE, PARSERS[Complete.TYPE.value])),
        (Error, _on_transition(_ERROR, PARSERS[Error.TYPE.value])),
    )
}
_HANDSHAKING: dict[int, Callable[[Connection, list[Any]], _Run | None]] = {}
"""Until the handshake completes, every frame takes _receive_frame."""


def _array_header(count: int) -> bytes:
    """The msgpack header of an array of ``count`` elements."""
    if count < 16:
        return bytes((0x90 | count,))
    if count < 0x10000:
        return b"\xdc" + count.to_bytes(2, "big")
    return b"\xdd" + count.to_bytes(4, "big")


def _not_rsnet(first: bytes) -> str | None:
    """What a client's first byte says it speaks, when that is not rsnet (SPEC 6.1): an HTTP
    request starts with a method's capital letter (a WebSocket client or a browser at the TCP
    port), a TLS handshake with record type 22 (a ``tls://`` client at a plain port)."""
    if first.isupper():
        return "an HTTP request, not the rsnet protocol: WebSocket clients connect to the WebSocket port (ws://)"
    if first == b"\x16":
        return "a TLS handshake on a plain rsnet port: connect with tcp://, or turn TLS on ([listen.tls])"
    return None


def _violation(message: str) -> RemoteProtocolError:
    return RemoteProtocolError(ErrorCode.PROTOCOL_ERROR, message)


def _bounded_message(message: str) -> str:
    """``message`` cut to at most MAX_ERROR_MESSAGE bytes of UTF-8, ending with the marker if cut.

    One stream's huge error text (a validation error listing 100,000 bad keys) must never
    make a frame the peer refuses, which would end the connection and every other stream on it.
    """
    if type(message) is not str:
        message = str(message)
    if len(message) <= MAX_ERROR_MESSAGE // 4:  # at most 4 bytes per character: fits for sure
        return message
    encoded = message.encode("utf-8", "surrogatepass")
    if len(encoded) <= MAX_ERROR_MESSAGE:
        return message
    marker = f" {TRUNCATED} {len(encoded)} bytes in all"
    head = encoded[: MAX_ERROR_MESSAGE - len(marker.encode())].decode("utf-8", "ignore")
    return head + marker


def _forbidden(stream_id: int, sender: Side, state: StreamState, event: StreamEvent) -> str:
    return f"{event.value} on stream {stream_id} from the end that {sender.value}, while {state.name}: not allowed"


def _not_encodable(exc: Exception) -> LocalProtocolError:
    return LocalProtocolError(ErrorCode.APPLICATION_ERROR, f"not encodable as msgpack: {exc}")


def _uint(value: Any, name: str) -> int:
    if type(value) is not int or value < 0:
        raise LocalProtocolError(ErrorCode.PROTOCOL_ERROR, f"{name} must be a non-negative int, got {value!r}")
    return value


def _code(code: int) -> int:
    code = int(code)  # an ErrorCode member goes on the wire as its plain number
    if not 0 <= code <= MAX_INT:
        raise LocalProtocolError(ErrorCode.PROTOCOL_ERROR, f"error code {code} is not in 0..2**63-1")
    return code


def _name(name: str) -> str:
    if type(name) is not str:
        raise LocalProtocolError(ErrorCode.PROTOCOL_ERROR, f"a stream name must be a str, got {name!r}")
    return name


def _metadata(metadata: dict[str, Any]) -> dict[str, Any]:
    if type(metadata) is not dict or not all(type(key) is str for key in metadata):
        raise LocalProtocolError(ErrorCode.PROTOCOL_ERROR, "metadata must be a dict with str keys")
    return metadata
