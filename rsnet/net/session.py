"""One live rsnet connection on trio: the I/O shell around the sans-I/O protocol.

A :class:`Session` drives a :class:`rsnet.protocol.Connection` over a
:class:`rsnet.transport.Transport` and bridges its streams to Reactive Streams objects:

- a stream the peer opens with SUBSCRIBE becomes a real subscription to a publisher this side
  hosts (:class:`Host` finds it): remote REQUEST is a local ``request``, remote CANCEL a local
  ``cancel``, and the local signals become frames;
- :meth:`Session.publisher` is a :class:`RemotePublisher` for a publisher the peer hosts;
- :meth:`Session.offer` serves a local publisher to the peer (OFFER); an OFFER from the peer
  is handed to :class:`Host` as a publisher to subscribe a sink to.

Speed is designed in (field notes): signals never await. ``on_next`` only appends to the
stream's pending list; a single writer task encodes each stream's pending items as BATCH
frames and flushes everything in one transport write whenever it runs, so while one write is
in progress the next batch builds up.
Demand requested locally is accumulated per stream and sent as one REQUEST per stream per
write, however many ``request`` calls made it up. Received frames are dispatched synchronously
by the reader task, so a slow consumer on one stream never delays another (it only stops
requesting).

Latency is designed in too: a round trip should cost what the transport costs. So the reader,
once it has handled a chunk of received bytes, writes whatever it produced in answer itself
(the items a REQUEST released, the ACCEPT for a SUBSCRIBE, the next REQUEST of a stop-and-wait
subscriber), and a task that opens a stream or grants demand writes that frame itself: no
hand-over to the writer task, which would cost a trip through the scheduler before the bytes
leave. Such a write is only ever non-blocking (:meth:`Transport.send_nowait`) and only while
the writer is idle; whatever would wait (bytes the socket did not take, a write in progress,
refilling windows, closing) stays the writer's, so the reader never blocks on a send and two
peers can never both stop reading because both are stuck writing. The same goes for reading: a
consumer that waits for its stream's next item may read the socket in the reader's place
(:meth:`Session.lend_socket`), so an answer reaches it without a hand-over between tasks.

Every task belongs to the session's nursery (reader, writer, and the producer tasks of hosted
publishers, which get the session's nursery through :class:`StreamContext`), so all
of them end with the connection.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import time
from collections.abc import Callable, Sequence
from itertools import repeat
from operator import is_
from typing import Any, Protocol, TypeVar

import trio

from ..client_rules import (
    FLUSH_TIMEOUT,
    Due,
    Keepalive,
    connection_lost,
    handshake_outcome,
    handshake_timed_out,
    refused_after_go_away,
)
from ..errors import ConnectionLost, StreamError, error_frame_fields
from ..protocol import (
    Accept,
    Cancel,
    Complete,
    Connection,
    ConnectionClosed,
    ConnError,
    Encoded,
    Error,
    ErrorCode,
    GoAway,
    Items,
    LocalProtocolError,
    Offer,
    Request,
    State,
    Subscribe,
    encode_frame,
)
from ..streams import Publisher, Subscriber, Subscription
from ..streams.rules import (
    MAX_DEMAND,
    add_demand,
    check_signal_argument,
    check_subscriber,
    invalid_request,
    report_undeliverable,
    validate_subscription,
)
from ..streams.subscriptions import deliver_safely, subscribe_failed
from ..transport import Transport, TransportClosed
from ..transport.base import Bytes
from .failures import failure_log

_T = TypeVar("_T")
_OPEN, _CLOSED = State.OPEN, State.CLOSED
"""The connection's states, looked at on every read and write: an Enum member through its class
costs ~70 ns, a module constant ~6."""

DEFAULT_SEND_WINDOW = 1024
"""Items a hosted publisher may have requested and not yet delivered, per stream."""

DEFAULT_SEND_WINDOW_BYTES = 4 << 20
"""Bytes of items a stream may hold between its publisher and the socket, about: the window in
items is this over the size of the stream's items as encoded so far (before the first are
encoded, the size of the largest frame the peer takes), so a publisher of 1 MiB items gets
requests for 4 at a time, one of small items for ``send_window``."""

DEFAULT_CONNECTION_WINDOW_BYTES = 16 << 20
"""Bytes the windows of all of a connection's outbound streams may hold together, about: when
its open streams at ``send_window_bytes`` each would come to more, each stream's byte window is
an equal share of this (and at least one item). A peer that opens ``max_streams`` streams and
reads none then makes the server hold this much, or one item per stream if that is more; it
held ``max_streams`` full windows, 4 GiB at the defaults. Publishers that can wait (the
broker's subscriptions) also deliver only while the connection holds less than this unwritten
(:meth:`Session.room`), which takes the item per stream away."""

DEFAULT_OUTPUT_BUDGET_BYTES = 256 << 20
"""Bytes a server's connections may hold unwritten for their peers, in all (:class:`OutputBudget`)."""


class OutputBudget:
    """What a server's connections may hold, in all, for peers that have not read it: each
    connection's :meth:`Session.room` counts against an equal share of ``total`` (and against
    its own ``connection_window_bytes``), so peers that read nothing hold about ``total``
    together, however many they are, not ``connection_window_bytes`` each. A share is taken
    when the connection reads, and kept until its peer reads it: connections opened one after
    another, each taking its share of those open then, hold more, up to about ``total`` x
    (1 + ln(connections x ``connection_window_bytes`` / ``total``)) in the worst order
    (server/README.md, the resource budget). Holding them all to ``total`` would let the
    first peer that reads nothing starve every later connection instead."""

    __slots__ = ("connections", "total")

    def __init__(self, total: int = DEFAULT_OUTPUT_BUDGET_BYTES) -> None:
        if total < 1:
            raise ValueError(f"an output budget must be at least 1 byte, got {total!r}")
        self.total = total
        self.connections = 0  # open connections that share it

    def share(self) -> int:
        return self.total // max(1, self.connections)


BATCH_ITEMS = 256
"""The most items one BATCH frame carries (a hosted publisher's items go out in BATCH frames)."""

MAX_UNTAKEN_ANSWERS = 64 * 1024
"""Bytes of answers to the peer's frames (PONGs, the protocol's refusals, the ACCEPT or refusal
of each stream it opens, and all of a stream that ended as it opened) that the reader may queue
while a write to the peer waits for it to read: beyond that, the reader reads nothing more from
it until that write is done. A peer that keeps sending and never reads is so held to this bound
plus the answers to one read, where it could grow the output without limit; with nothing
received meanwhile, the writer gives it up three keepalive intervals later (SPEC 10.1). The
items of a stream that runs on are bounded by its window instead and do not count: two peers
streaming to each other, each waiting for the other to read, must never both stop reading."""

OPENING_SLICE = 0.005
"""Seconds of opening streams (an application's ``open_publisher`` and ``subscribe`` may be
costly: a broker's pattern subscription over thousands of topics) the reader spends on one
received chunk before it lets the other tasks run, then goes on: one peer's burst of openings
delays the process's other connections by about one opening, not by all of them."""


@dataclasses.dataclass(frozen=True, slots=True)
class StreamContext:
    """What a hosted publisher's factory may use: the session's nursery for producer tasks
    (they are cancelled with the connection), the peer's address and identity, and the
    stream's metadata."""

    nursery: trio.Nursery
    peer: str
    principal: Any
    metadata: dict[str, Any]


def _set_stream_context(
    self: StreamContext, nursery: trio.Nursery, peer: str, principal: Any, metadata: dict[str, Any]
) -> None:
    # The frozen dataclass's __init__ sets each field with object.__setattr__ (its own
    # __setattr__ refuses): 530 ns a context against 150 through the slots' descriptors, and
    # one is made for every stream a peer opens. The same fields, set to the same values.
    _SET_NURSERY(self, nursery)
    _SET_PEER(self, peer)
    _SET_PRINCIPAL(self, principal)
    _SET_METADATA(self, metadata)


_SET_NURSERY, _SET_PEER, _SET_PRINCIPAL, _SET_METADATA = (
    getattr(StreamContext, name).__set__ for name in ("nursery", "peer", "principal", "metadata")
)
StreamContext.__init__ = _set_stream_context  # type: ignore[method-assign]


class Host(Protocol):
    """What a session asks when the peer opens a stream."""

    def open_publisher(self, name: str, params: Any, context: StreamContext) -> Publisher[Any]:
        """The publisher for a SUBSCRIBE; raise :class:`StreamError` to reject it."""

    def open_sink(self, name: str, params: Any, context: StreamContext) -> Subscriber[Any]:
        """The subscriber for an OFFER's publisher; raise :class:`StreamError` to reject it."""


class NoHost:
    """Hosts nothing: every stream the peer opens is rejected with UNKNOWN_PUBLISHER."""

    def open_publisher(self, name: str, params: Any, context: StreamContext) -> Publisher[Any]:
        raise StreamError(ErrorCode.UNKNOWN_PUBLISHER, f"no publisher named {name!r}")

    def open_sink(self, name: str, params: Any, context: StreamContext) -> Subscriber[Any]:
        raise StreamError(ErrorCode.UNKNOWN_PUBLISHER, f"nothing accepts offers named {name!r}")


# -- the publisher side: a local publisher serving a remote subscriber ---------------------------


class _Outbound(Subscriber[Any]):
    """Subscribed to a local publisher; turns its signals into frames on one stream.

    Items are collected in ``pending`` and encoded by :meth:`flush` as BATCH frames (one
    ``send_batch`` per stream per write, instead of one NEXT frame and one writer wake-up
    per item); the session flushes before every write, before processing received bytes and
    before any other frame on the stream (COMPLETE, ERROR), so frames keep their order.
    Demand the peer grants (``remote``) is passed to the local publisher in windows: at most
    ``window`` items are requested locally and not yet delivered, and the window is refilled
    after the writer has flushed. So ``pending`` plus the output buffer hold at most one
    window per stream whatever the peer granted (2**63-1 included), a synchronous publisher
    gives the event loop back after each window, and a slow socket holds the publisher
    back. Every item taken is within the peer's demand (``remote``). A publisher that emits
    beyond what was requested locally broke rule 1.1 and is cut off with FLOW_CONTROL
    instead of buffered.
    """

    __slots__ = (
        "_accept",
        "_refill_queued",
        "_session",
        "done",
        "encoded",
        "failure",
        "item_bytes",
        "local",
        "on_end",
        "pending",
        "pending_bytes",
        "remote",
        "stream_id",
        "subscription",
    )

    def __init__(
        self,
        session: Session,
        stream_id: int,
        initial: int,
        accept: bool,
        on_end: Callable[[BaseException | None], None] | None = None,
    ) -> None:
        self._session = session
        self.stream_id = stream_id
        self.subscription: Subscription | None = None
        self.remote = initial  # granted by the peer, not yet taken (MAX_DEMAND: unbounded)
        self.local = 0  # requested from the local publisher, not yet delivered
        self._accept = accept
        self.done = False
        self.failure: BaseException | None = None  # signalled from a cancelled task, not yet sent
        self.on_end = on_end
        self._refill_queued = False
        self.pending: list[Any] = []  # items taken, not yet encoded (at most one window)
        self.pending_bytes = 0  # what they will take encoded: exact for Encoded ones, else estimated
        self.encoded = False  # whether pending items may be Encoded (see on_next_encoded)
        self.item_bytes = 0  # encoded size of an item as measured at the last flush; 0: none yet

    def on_subscribe(self, subscription: Subscription) -> None:
        if not validate_subscription(self.subscription, subscription, wanted=not self.done):
            return  # rule 2.5, or the stream already ended
        self.subscription = subscription
        poll = getattr(subscription, "poll_sync", None)
        if poll is not None and self.remote:
            # A source with its items at hand hands over the first window in one call, with
            # no request, signal or pending list per item (synchronous fusion: see
            # Subscription), and a short stream is answered whole: its ACCEPT, items and
            # COMPLETE in one call. The server's leg of a first-item round trip, interleaved
            # runs: 25-27 -> 22-23 us by the first, -> 20-21 us by the second.
            items, end = poll(min(self._window(), self.remote))
            if (
                end is True
                and self._accept
                and len(items) <= BATCH_ITEMS
                and self._session.conn.send_whole_stream(self.stream_id, items)
            ):
                self._ended()
                return
            self._send_accept()
            if end is not False:
                self.pending = items  # (none were: the stream has just opened)
                if end is True:
                    self.on_complete()
                else:
                    self.on_error(end)
                return
            if items:
                self.local += len(items)
                self._take(items, 0)  # the window's worth: refilled after the write, as requested ones
                return
        else:
            self._send_accept()
        self.refill()

    def _send_accept(self) -> None:
        if self._accept:
            self._session.conn.send_accept(self.stream_id)  # the remote on_subscribe
            self._session._wake_writer()

    def refill(self) -> None:
        """Top the local request up to the window (called on remote demand and after writes)."""
        self._refill_queued = False
        if self.remote > self.local:  # else the window cannot matter: the peer's demand is all requested
            self._request_up_to(min(self._window(), self.remote))

    def _request_up_to(self, limit: int) -> None:
        """Request from the local publisher what brings the items it owes to ``limit``."""
        if self.done or self.subscription is None:
            return
        amount = limit - self.local
        if amount > 0:
            self.local += amount
            self.subscription.request(amount)

    def refill_wanted(self) -> bool:
        """Whether :meth:`refill` would request anything now."""
        return not self.done and self.subscription is not None and min(self._window(), self.remote) > self.local

    def _window(self) -> int:
        """Items the local publisher may have requested and not delivered: the session's item
        window, within its byte window at the stream's item size."""
        session = self._session
        size = self.item_bytes or session.conn.peer_max_frame_size  # the largest an item can be
        return min(session.send_window, max(1, session._window_bytes() // size))

    def on_next(self, item: Any) -> None:
        if item is None:
            check_signal_argument(item, "on_next")  # raises: rule 2.13
        if self.done:
            return
        if not self.local:
            self._cut_off(ErrorCode.FLOW_CONTROL, "rule 1.1: the publisher emitted more items than requested")
            return
        pending = self.pending
        if not pending or not self._refill_queued:
            self._taken(first=not pending)
        pending.append(item)
        self._hold(self.item_bytes or self._session.conn.peer_max_frame_size)
        self.local -= 1
        if self.remote != MAX_DEMAND:
            self.remote -= 1

    def on_next_many(self, items: list[Any]) -> None:
        """``on_next`` for each of ``items``, in order, in one call (the sources use it)."""
        self._take(items, 0)

    def on_next_encoded(self, items: list[Encoded]) -> None:
        """``on_next_many`` for items already encoded (the broker shares each recent record's
        bytes among its subscribers this way): they go on the wire as they are."""
        self.encoded = True
        self._take(items, sum(map(len, items)))

    def _take(self, items: list[Any], nbytes: int) -> None:
        """``on_next_many``, the items' encoded size known (``nbytes``) or not (0)."""
        if any(map(is_, items, repeat(None))):
            check_signal_argument(None, "on_next")  # raises: rule 2.13
        if self.done:
            return
        count = len(items)
        if count > self.local:
            if self.local:
                self._take(items[: self.local], 0)
            self._cut_off(ErrorCode.FLOW_CONTROL, "rule 1.1: the publisher emitted more items than requested")
            return
        pending = self.pending
        if not pending or not self._refill_queued:
            self._taken(first=not pending)
        pending += items
        self._hold(nbytes or count * (self.item_bytes or self._session.conn.peer_max_frame_size))
        self.local -= count
        if self.remote != MAX_DEMAND:
            self.remote -= count

    def _hold(self, nbytes: int) -> None:
        self.pending_bytes += nbytes
        self._session._pending_bytes += nbytes

    def room(self) -> int:
        """Bytes the connection may still be handed before the peer reads what it holds (see
        :meth:`Session.room`): a publisher that can wait delivers only while it is positive."""
        return self._session.room()

    def wait_for_room(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` (once) when :meth:`room` is positive again."""
        self._session._room_waiters.append(callback)

    def _taken(self, first: bool) -> None:
        """Items were taken: the first since the last flush (``first``: encode them before the
        next write), or the first since the last refill (refill the window after that write)."""
        session = self._session
        if first:
            session._unsent.append(self)
        if not self._refill_queued:
            self._refill_queued = True
            session._refill.append(self)
        session._wake_writer()

    def flush(self) -> None:
        """Encode the pending items into the connection's output (:meth:`_encode_pending`),
        and size the window by them."""
        count = len(self.pending)
        if not count:
            return
        conn = self._session.conn
        before = conn.buffered
        self._encode_pending()
        # The window follows the items' size: up at once, down by at most half a flush.
        encoded = conn.buffered - before
        measured = max(1, encoded // count)
        first = not self.item_bytes
        self.item_bytes = measured if first else max(measured, self.item_bytes // 2)
        if first:
            self._refill_beside(encoded)

    def _refill_beside(self, encoded: int) -> None:
        """The stream's first items are encoded, so their size is known: request now, in the
        same write, as many more as fit the byte window beside those ``encoded`` bytes. The
        first request counted each item as the largest frame (4 of them, by default), so a
        short stream of small items would otherwise take a second write through the writer."""
        if self.remote > self.local:  # else nothing more may be requested (stop-and-wait)
            room = max(0, self._session._window_bytes() - encoded) // self.item_bytes
            self._request_up_to(min(self._window(), self.remote, room))

    def _encode_pending(self) -> None:
        """Encode the pending items as BATCH frames of at most ``BATCH_ITEMS`` items (so large
        items never make one huge frame to re-split). Before the stream's last frame (COMPLETE
        or ERROR) it is called alone: no window is sized for items that end the stream."""
        items, self.pending = self.pending, []
        session = self._session
        session._pending_bytes -= self.pending_bytes  # in the output now, as it is counted
        self.pending_bytes = 0
        conn, stream_id = session.conn, self.stream_id
        for start in range(0, len(items), BATCH_ITEMS):
            chunk = items if len(items) <= BATCH_ITEMS else items[start : start + BATCH_ITEMS]
            try:
                conn.send_batch(stream_id, chunk, encoded=self.encoded)
            except LocalProtocolError:
                # An item a batch cannot carry (FRAME_TOO_LARGE, APPLICATION_ERROR): send the
                # items before it, then end the stream with the reason; the connection lives.
                for item in chunk:
                    try:
                        conn.send_next(stream_id, item)
                    except LocalProtocolError as refused:
                        self._cut_off(refused.code, refused.message)
                        return

    def _cut_off(self, code: int, message: str) -> None:
        self.subscription.cancel()  # type: ignore[union-attr]
        self._finish(code, message, None, StreamError(code, message))

    def on_error(self, error: BaseException) -> None:
        check_signal_argument(error, "on_error")
        if self.done or self.failure is not None:
            return
        if trio.lowlevel.in_trio_task() and trio.current_effective_deadline() == -math.inf:
            # From a cancelled task: perhaps the whole session is being cancelled (a server
            # cancelled in its nursery fails its producers with ProducerCancelledError), and
            # then the peer must see the connection end, as when a process dies, not a stream
            # error it would not retry. Only the writer sends it, once it is sure it is not
            # cancelled itself; a direct write from a task woken before the cancel would not
            # know (``_send_failures``).
            self.failure = error
            self._session._fail_later(self)
            return
        self.fail(error)

    def fail(self, error: BaseException) -> None:
        code, message, data = error_frame_fields(error)
        self._finish(code, message, data, error)

    def on_complete(self) -> None:
        if not self.done:
            self._encode_pending()  # the stream's items go before its COMPLETE
            if not self.done:  # (an item a batch could not carry ends it with ERROR instead)
                self._session.conn.send_complete(self.stream_id)
                self._ended()

    def _ended(self) -> None:
        """The stream's COMPLETE is written: it is over here."""
        self.done = True
        session = self._session
        session._end_outbound(self)
        session._wake_writer()
        if self.on_end is not None:
            self.on_end(None)

    def _finish(self, code: int, message: str, data: Any, error: BaseException) -> None:
        self._encode_pending()  # the stream's items go before its ERROR
        self.done = True
        session = self._session
        session._end_outbound(self)
        try:
            session.conn.send_error(self.stream_id, code, message, data)
        except LocalProtocolError:  # e.g. unencodable data: send the error without it
            session.conn.send_error(self.stream_id, code, message)
        session._wake_writer()
        if self.on_end is not None:
            self.on_end(error)

    def remote_request(self, n: int) -> None:
        self.remote = add_demand(self.remote, n)  # the protocol has checked n > 0
        self.refill()

    def remote_cancel(self, reason: BaseException | None) -> None:
        """The peer cancelled (or failed the stream, or the connection ended)."""
        if self.done:
            return
        self.done = True
        self.pending = []  # the stream is closed: nothing more goes out on it
        self._session._pending_bytes -= self.pending_bytes
        self.pending_bytes = 0
        if self.subscription is not None:
            self.subscription.cancel()
        if self.on_end is not None:
            self.on_end(reason)


# -- the subscriber side: a remote publisher serving a local subscriber --------------------------


# Ctrl-C: the methods a user's task calls into (a subscription's request and cancel, opening a
# stream, closing) and the writer hand-off they use change the session's state in several steps;
# a KeyboardInterrupt landing between two of them could leave the writer never woken, so that
# closing the connection waited forever. They are KI-protected: trio delivers the interrupt at
# the caller's next checkpoint instead.


_SIZED, _MANY, _EACH = "on_next_sized", "on_next_many", "on_next"
"""How an inbound stream's subscriber takes a batch (:meth:`_Inbound.deliver`)."""


class _Inbound(Subscription):
    """The local Subscription for a stream whose publisher is on the peer.

    Demand is accumulated in ``pending`` and granted by the writer in one REQUEST. Items,
    COMPLETE and ERROR for the stream are delivered from the reader task; after ``cancel``
    the protocol drops whatever is still in flight, so the subscriber sees nothing more.
    """

    __slots__ = (
        "_bad_request",
        "_delivering",
        "_session",
        "_takes",
        "cancelled",
        "pending",
        "stream_id",
        "subscriber",
    )

    def __init__(self, session: Session, subscriber: Subscriber[Any]) -> None:
        self._session = session
        self.stream_id = 0  # 0 until the opening frame is written
        self.subscriber: Subscriber[Any] | None = subscriber
        # How the subscriber takes a batch, looked up once: a getattr that misses raises and
        # catches an AttributeError inside, which cost every batch up to two of them.
        self._takes = (
            _SIZED if hasattr(subscriber, "on_next_sized") else _MANY if hasattr(subscriber, "on_next_many") else _EACH
        )
        self.pending = 0
        self.cancelled = False
        self._delivering = False
        self._bad_request: BaseException | None = None

    @trio.lowlevel.enable_ki_protection  # Ctrl-C: see the note above _Inbound
    def request(self, n: int) -> None:
        if self.cancelled:
            return  # rule 3.6
        if n <= 0:
            # rule 3.9, signalled locally: the wire never carries a non-positive REQUEST
            self._bad_request = invalid_request(n)
            if not self._delivering:
                self._fail_bad_request()
            return
        first = self.pending == 0
        self.pending = add_demand(self.pending, n)
        if first and self.stream_id:
            self._session._demand_pending(self)

    @trio.lowlevel.enable_ki_protection  # Ctrl-C: see the note above _Inbound
    def cancel(self) -> None:
        if self.cancelled:
            return  # rule 3.7
        self.cancelled = True
        self.subscriber = None  # rule 3.13
        self._session._end_inbound(self, send_cancel=True)

    @property
    def session(self) -> Session:
        """The connection's session (where a consumer may read in the reader's place)."""
        return self._session

    def fail(self, error: StreamError) -> None:
        """End the stream from the subscriber side with a coded ERROR instead of a CANCEL
        (SPEC: from the subscriber side an ERROR cancels and says why): how a host's sink
        refuses what the peer's publisher sends. Nothing more is delivered, as after cancel."""
        if self.cancelled:
            return
        self.cancelled = True
        self.subscriber = None  # rule 3.13
        self._session._end_inbound(self, send_cancel=True, error=error)

    def _fail_bad_request(self) -> None:
        error, self._bad_request = self._bad_request, None
        subscriber = self.subscriber
        self.cancel()
        if subscriber is not None and error is not None:
            deliver_safely(subscriber.on_error, error)

    # called by the session's dispatch

    def deliver(self, items: list[Any], nbytes: int = 0) -> None:
        """Hand ``items`` (``nbytes`` on the wire) to the subscriber."""
        subscriber: Any = self.subscriber
        if subscriber is None:
            return
        takes = self._takes
        self._delivering = True
        try:
            if takes is _SIZED:
                # rsnet's client iterator (rsnet.net.iterator): the batch with its wire bytes,
                # which its demand policy sizes the window by.
                if subscriber.consumer_waiting:
                    self._session._woke_consumer = True
                if not deliver_safely(subscriber.on_next_sized, items, nbytes):
                    self.cancel()
                    return
            elif takes is _MANY:
                # A subscriber that takes a batch in one call (rsnet's iterator): the same
                # signals as on_next per item, in order, without a call per item.
                if not deliver_safely(subscriber.on_next_many, items):
                    self.cancel()
                    return
            else:
                # deliver_safely inlined: a call less per item (~25% of a 16-byte item's cost).
                on_next = subscriber.on_next
                for item in items:
                    try:
                        on_next(item)
                    except Exception as error:  # rule 2.13: reported, the stream cancelled
                        report_undeliverable(error)
                        self.cancel()
                        return
                    if self.subscriber is None:
                        return  # cancelled in on_next: drop the rest (rule 2.8)
                    if self._bad_request is not None:
                        break
        finally:
            self._delivering = False
        if self._bad_request is not None:
            self._fail_bad_request()

    def terminate(self, error: BaseException | None) -> None:
        subscriber = self.subscriber
        if self.cancelled or subscriber is None:
            return
        self.cancelled = True
        self.subscriber = None
        if self._takes is _SIZED and subscriber.consumer_waiting:  # type: ignore[attr-defined]
            self._session._woke_consumer = True
        if error is None:
            deliver_safely(subscriber.on_complete)
        else:
            deliver_safely(subscriber.on_error, error)


class StreamOpener(Protocol):
    """Where a :class:`RemotePublisher` opens its streams: a session, or a client that
    reconnects and so changes sessions."""

    @property
    def peer(self) -> str: ...

    def _open_inbound(self, subscriber: Subscriber[Any], name: str, params: Any) -> None: ...


class RemotePublisher(Publisher[Any]):
    """A publisher the peer hosts, as a true Reactive Streams Publisher.

    Each ``subscribe`` opens a stream (SUBSCRIBE); demand requested from the subscription
    crosses the network (coalesced, see :mod:`rsnet.net.session`). If the connection is closed,
    or the peer rejects the stream, the subscriber gets ``on_subscribe`` then ``on_error``
    (rule 1.9).
    """

    def __init__(self, opener: StreamOpener, name: str, params: Any = None) -> None:
        self._opener = opener
        self.name = name
        self.params = params

    def subscribe(self, subscriber: Subscriber[Any]) -> None:
        check_subscriber(subscriber)
        self._opener._open_inbound(subscriber, self.name, self.params)

    def __repr__(self) -> str:
        return f"RemotePublisher({self.name!r} at {self._opener.peer})"


# -- the session ------------------------------------------------------------------------------


class Session:
    """One connection's streams, driven by a reader and a writer task (which keeps the
    keepalive timer too).

    Construct it with an open-state or handshaking protocol connection, then run
    :meth:`run` in a nursery; it returns when the connection has ended, after ending every
    stream on it (local subscribers see :class:`ConnectionLost`, local publishers a cancel).
    """

    def __init__(
        self,
        transport: Transport,
        conn: Connection,
        *,
        host: Host | None = None,
        principal: Any = None,
        send_window: int = DEFAULT_SEND_WINDOW,
        send_window_bytes: int = DEFAULT_SEND_WINDOW_BYTES,
        connection_window_bytes: int = DEFAULT_CONNECTION_WINDOW_BYTES,
        output_budget: OutputBudget | None = None,
        keepalive_fallback: float = 0.0,
    ) -> None:
        self.transport = transport
        self.send_window = send_window
        self.send_window_bytes = send_window_bytes
        self.connection_window_bytes = connection_window_bytes
        self.output_budget = output_budget  # shared with the server's other connections, if any
        self.conn = conn
        self.host: Host = host if host is not None else NoHost()
        self.principal = principal
        self.peer = transport.peer
        self._outbound: dict[int, _Outbound] = {}
        self._inbound: dict[int, _Inbound] = {}
        self._offered: dict[int, Publisher[Any]] = {}  # OFFERed, waiting for the peer's ACCEPT
        self._demand_dirty: list[_Inbound] = []
        self._refill: list[_Outbound] = []
        self._unsent: list[_Outbound] = []
        self._failing: list[_Outbound] = []  # failed from a cancelled task (_Outbound.on_error)
        self._wakeup = trio.Event()
        self._write_scheduled = False  # there is work for the writer (or for a direct write)
        # A caller up the stack writes what is queued when it is done (the reader handling
        # received bytes, or _send_now preparing a write): _wake_writer leaves it to them.
        self._holding = False
        # The reader handed items or the end of a stream to a task waiting for them (an
        # iterator's consumer): it lets that task run before it reads again (_reader).
        self._woke_consumer = False
        # Reading in a consumer's task (lend_socket): the reader is between two reads, where
        # it looks whether the socket is lent before it reads; the task the socket is lent to;
        # the reader while it waits for it back; and events a consumer's read left to it.
        self._at_rest = False
        self._lent_to: trio.lowlevel.Task | None = None
        self._parked_reader: trio.lowlevel.Task | None = None
        self._leftover: tuple[list[Any], int] | None = None
        # Bytes of answers queued since a write last finished, and what the reader waits on
        # when they reach MAX_UNTAKEN_ANSWERS (set by the writer when its write is done).
        self._answers = 0
        self._written: trio.Event | None = None
        self._sending = False  # the writer task is in transport.send
        # What the connection holds for the peer (room): items taken and not yet encoded, and
        # bytes handed to the transport and not yet known written (the output buffer aside).
        self._pending_bytes = 0
        self._in_transport = 0
        self._room_waiters: collections.deque[Callable[[], None]] = collections.deque()
        self._unfinished = False  # send_nowait left bytes that the writer's next send writes
        self._closed = trio.Event()
        self._writer_done = trio.Event()
        self._eof = False  # the peer closed its side (or the transport broke)
        self._linger = False  # we ended the connection: read until the peer closes too
        # Once the writer ends the connection by a half-close (_end_writing): when the reader,
        # reading on to the peer's close, gives up (inf until then).
        self._linger_until = math.inf
        self._peer_going_away = False
        self._closing_error: ConnectionLost | None = None
        self._send_wait: trio.CancelScope | None = None  # bounds the writer's wait in _send
        self._timer: trio.CancelScope | None = None  # the writer's keepalive timer (_writer)
        self._nursery: trio.Nursery | None = None
        # The run's clock, as trio.current_time() reads it (that is three more Python calls
        # to it, and the reader reads it on every receive).
        self._now = trio.lowlevel.current_clock().current_time
        # SPEC 10.1 on the WELCOME's interval; a client whose server turned keepalive off
        # still bounds its silence by its own proposal (``keepalive_fallback``, seconds).
        self._keepalive = Keepalive.negotiated(conn, keepalive_fallback, self._now())

    # -- lifecycle ---------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    @property
    def nursery(self) -> trio.Nursery:
        assert self._nursery is not None, "the session is not running"
        return self._nursery

    async def run(self, *, events: list[Any] | None = None) -> None:
        """Serve the connection until it ends. ``events`` are already-received events
        (those that arrived together with the handshake) to dispatch first."""
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._writer)
                if events:
                    done = self._dispatch(events, 0)
                    if done < len(events):  # openings took a slice
                        await self._dispatch_slices(events, done)
                self._wake_writer()
                await self._reader()
                if not self._writer_done.is_set():
                    # The reader saw the end; let the writer flush what is left (a CONN_ERROR).
                    self._wake_writer()
                    with trio.move_on_after(FLUSH_TIMEOUT):
                        await self._writer_done.wait()
                # End the streams before cancelling, so hosted publishers see a cancel.
                self._end_all(self._closing_error or ConnectionLost("connection closed"))
                if nursery.child_tasks:  # producer tasks of hosted publishers, or the writer
                    nursery.cancel_scope.cancel()
        finally:
            self._end_all(self._closing_error or ConnectionLost("connection closed"))
            # Streams the writer never got to (the connection broke first) would keep the
            # session in a reference cycle (session -> list -> stream -> session).
            self._unsent, self._refill, self._demand_dirty, self._failing = [], [], [], []
            # Nor may what was never written outlive the connection: a session is garbage only
            # once the collector breaks its cycles, which can take minutes in a server (see
            # gc_tuning), and a peer that read nothing left up to a connection window here.
            self.conn.data_to_send()
            if self._lent_to is not None:
                # A consumer reads in the reader's place, for a stream that has just ended:
                # it hears of that now, not when the socket closes after the linger below.
                self.transport.interrupt_receive()
            with trio.CancelScope(shield=True):
                if self._linger and not self._eof and self.transport.half_closable:
                    await self._drain_until_eof()
                await self.transport.aclose()
            self._closed.set()

    async def _drain_until_eof(self) -> None:
        """Read and discard until the peer closes, briefly (``FLUSH_TIMEOUT`` from when the
        writer ended the connection, if it began the linger): closing a socket with unread
        data makes the kernel send a reset, which can destroy our last frame (a CONN_ERROR)
        in the peer's receive buffer before it was read."""
        with trio.move_on_at(min(self._linger_until, self._now() + FLUSH_TIMEOUT)):
            try:
                await self.transport.send_eof()  # so the peer closes its side promptly
                if self._lent_to is not None:  # a consumer reads, up to the end at most
                    await self._wait_for_socket()
                while await self.transport.receive():
                    pass
            except TransportClosed:
                pass

    async def wait_closed(self) -> None:
        await self._closed.wait()

    def close(self, code: int = ErrorCode.GOING_AWAY, message: str = "closing") -> None:
        """End the connection now: CONN_ERROR to the peer, every stream ends."""
        if self.conn.state is not _CLOSED:
            self._flush_items()  # items already taken go before the CONN_ERROR
            self.conn.send_conn_error(code, message)
            self._closing_error = ConnectionLost(f"closed locally: {message}", code)
        self._wake_writer()

    def go_away(self, message: str = "") -> None:
        """Graceful shutdown: no new streams either way; open ones run to their end, then
        the connection closes (the writer ends it once no stream is left)."""
        if self.conn.state is _OPEN and not self.conn.going_away:
            self._flush_items()
            self.conn.send_go_away(message)
            self._wake_writer()

    @trio.lowlevel.enable_ki_protection  # Ctrl-C: see the note above _Inbound
    def end_by(self, policy: Callable[[Connection], ConnectionLost]) -> None:
        """End the connection by a close policy (the client's is
        :func:`rsnet.client_rules.close_connection`): it queues the closing frame after the
        items already taken and returns the error this side's open streams end with."""
        if self.conn.state is _OPEN:
            self._flush_items()
            lost = policy(self.conn)
            if self.conn.state is _CLOSED:
                self._closing_error = lost
            self._wake_writer()

    @property
    def stream_count(self) -> int:
        return self.conn.stream_count

    # -- opening streams -------------------------------------------------------------------------

    def publisher(self, name: str, params: Any = None) -> RemotePublisher:
        """The peer's publisher ``name`` (subscribed to on each ``subscribe``)."""
        return RemotePublisher(self, name, params)

    @trio.lowlevel.enable_ki_protection  # Ctrl-C: see the note above _Inbound
    def _open_inbound(self, subscriber: Subscriber[Any], name: str, params: Any, *, offer_id: int = 0) -> None:
        """Subscribe ``subscriber`` to a publisher on the peer: by name (SUBSCRIBE), or the
        publisher of an OFFER stream the peer opened (``offer_id``)."""
        if offer_id == 0 and self.conn.state is not _OPEN:
            subscribe_failed(subscriber, self._closing_error or ConnectionLost("the connection is closed"))
            return
        if offer_id == 0 and self.conn.going_away:
            subscribe_failed(subscriber, refused_after_go_away(self._peer_going_away))
            return
        inbound = _Inbound(self, subscriber)
        subscriber.on_subscribe(inbound)
        if inbound.cancelled:
            if offer_id:
                self.conn.send_error(offer_id, ErrorCode.REJECTED, "the subscriber cancelled")
                self._wake_writer()
            return
        if offer_id:
            inbound.stream_id = offer_id
            self._inbound[offer_id] = inbound
            self.conn.send_accept(offer_id)
            if inbound.pending:
                self._demand_pending(inbound)
        else:
            try:
                stream_id = self.conn.send_subscribe(name, params, initial_demand=inbound.pending)
            except LocalProtocolError as refused:
                inbound.terminate(StreamError(refused.code, refused.message))
                return
            inbound.pending = 0
            inbound.stream_id = stream_id
            self._inbound[stream_id] = inbound
        self._write_urgently()  # the peer can do nothing before this frame arrives

    async def offer(self, name: str, publisher: Publisher[Any], params: Any = None) -> None:
        """Serve ``publisher`` to the peer under ``name`` until the stream ends.

        The peer requests as it can take items, so the publisher is never asked for more.
        Returns when the publisher completed and the peer was told (its COMPLETE written: not
        that the peer has processed every item; a broker says what it stored on ``$acks``); raises
        :class:`StreamError` if the peer rejected or failed the stream, or the publisher
        failed, and :class:`ConnectionLost` if the connection ended first.
        """
        if self.conn.state is not _OPEN:
            raise self._closing_error or ConnectionLost("the connection is not open")
        if self.conn.going_away:
            raise refused_after_go_away(self._peer_going_away)
        stream_id = self.conn.send_offer(name, params)
        ended = trio.Event()
        outcome: list[BaseException | None] = []

        def on_end(error: BaseException | None) -> None:
            outcome.append(error)
            ended.set()

        self._outbound[stream_id] = _Outbound(self, stream_id, 0, accept=False, on_end=on_end)
        self._offered[stream_id] = publisher
        self._write_urgently()  # the peer can do nothing before this frame arrives
        await ended.wait()
        if outcome[0] is not None:
            raise outcome[0]

    # -- bookkeeping called by the stream objects ---------------------------------------------------

    def room(self) -> int:
        """Bytes the connection may still be handed for the peer: ``connection_window_bytes``
        (or its share of the server's ``output_budget``, if that is less) less what it holds
        that the peer has not read yet (items taken and not yet encoded, encoded and not yet
        written, written to the transport and still there). Stream windows
        bound what publishers are asked for, but at least one item per stream: a publisher that
        can wait (the broker's subscriptions) also delivers only while this is positive, so a
        peer with many streams that reads nothing holds about this window, not an item per
        stream. Whoever waits for room (``_Outbound.wait_for_room``) is called, oldest first,
        as writes free it."""
        limit = self.connection_window_bytes
        if self.output_budget is not None:
            limit = min(limit, self.output_budget.share())
        return limit - (self._pending_bytes + self.conn.buffered + self._in_transport)

    def _room_freed(self) -> None:
        waiters = self._room_waiters
        while waiters and self.room() > 0:
            waiters.popleft()()

    def _window_bytes(self) -> int:
        """A stream's byte window: ``send_window_bytes``, or its equal share of
        ``connection_window_bytes`` when the open outbound streams would hold more together."""
        return min(self.send_window_bytes, self.connection_window_bytes // max(1, len(self._outbound)))

    def _flush_items(self) -> None:
        """Encode every stream's pending items into the connection's output."""
        while self._unsent:
            unsent, self._unsent = self._unsent, []
            for outbound in unsent:
                outbound.flush()

    def _demand_pending(self, inbound: _Inbound) -> None:
        self._demand_dirty.append(inbound)
        self._write_urgently()  # the peer's publisher waits for it

    def _end_inbound(self, inbound: _Inbound, *, send_cancel: bool, error: StreamError | None = None) -> None:
        if self._inbound.pop(inbound.stream_id, None) is not None and send_cancel:
            if error is None:
                self.conn.send_cancel(inbound.stream_id)
            else:
                self.conn.send_error(inbound.stream_id, error.code, error.message, error.data)
            self._wake_writer()

    def _fail_later(self, outbound: _Outbound) -> None:
        """An outbound stream failed from a cancelled task: the writer sends its ERROR."""
        self._failing.append(outbound)
        self._write_scheduled = True
        self._wakeup.set()  # even inside the reader's handling, whose direct write skips it

    async def _send_failures(self) -> None:
        """Send the ERRORs of streams failed from a cancelled task, unless this writer is
        cancelled too (the session is: nothing more goes out, the peer sees the connection
        end). A stream the peer cancelled meanwhile is done and sends nothing."""
        await trio.lowlevel.checkpoint_if_cancelled()
        failing, self._failing = self._failing, []
        for outbound in failing:
            error = outbound.failure
            if error is not None and not outbound.done:
                outbound.fail(error)

    def _end_outbound(self, outbound: _Outbound) -> None:
        self._outbound.pop(outbound.stream_id, None)
        self._offered.pop(outbound.stream_id, None)

    @trio.lowlevel.enable_ki_protection  # Ctrl-C: see the note above _Inbound
    def _wake_writer(self) -> None:
        if not self._write_scheduled:
            self._write_scheduled = True
            if not self._holding:
                self._wakeup.set()

    @trio.lowlevel.enable_ki_protection  # Ctrl-C: see the note above _Inbound
    def _write_urgently(self) -> None:
        """Queue a write the peer waits for (it opens a stream or grants demand): the calling
        task writes it at once if it can (:meth:`_send_now`), instead of waiting for the
        writer's turn. Inside the reader's handling it is written when that ends."""
        if self._holding:
            self._wake_writer()
        else:
            self._write_scheduled = True  # _send_now wakes the writer if it still has work
            self._send_now()

    @trio.lowlevel.enable_ki_protection  # Ctrl-C: see the note above _Inbound
    def _send_now(self) -> None:
        """Write what is queued from the calling task, without waiting: only while the writer
        is idle, and only what the transport takes at once. The rest of the work (bytes left
        over, refilling windows, a closing connection, or everything while the writer is
        sending) is the writer's: it is woken for it."""
        if not self._write_scheduled:
            return
        conn = self.conn
        if self._sending or conn.state is not _OPEN or self._peer_going_away:
            self._wakeup.set()
            return
        self._write_scheduled = False
        self._holding = True
        try:
            if self._demand_dirty:
                self._grant_demand()
            if self._unsent:
                self._flush_items()
            # (Nothing to write, as after a reader's chunk that only brought items: not even
            # an empty output buffer to swap.)
            chunks = self._output() if conn.buffered else ()
        finally:
            self._holding = False
        if chunks:
            if self.transport.send_nowait(chunks):
                self._keepalive.last_sent = self._now()
                self._answers = 0
                if self._room_waiters:
                    self._room_freed()
            else:
                self._unfinished = True
                self._in_transport += sum(map(len, chunks))
        if self._refill and not self._unfinished and not any(map(_Outbound.refill_wanted, self._refill)):
            # Written, and no window to top up (the peer's demand is all taken, as in
            # stop-and-wait): settle the refills here instead of waking the writer for them.
            refill, self._refill = self._refill, []
            for outbound in refill:
                outbound.refill()
        if self._unfinished or self._refill or self._write_scheduled:
            self._write_scheduled = True
            self._wakeup.set()

    def _output(self) -> Sequence[Bytes]:
        """What the connection has to send, as the transport takes it."""
        if self.transport.message_based:
            return self.conn.data_to_send_messages()
        data = self.conn.data_to_send()
        return [data] if data else []

    # -- tasks ----------------------------------------------------------------------------------------

    async def _writer(self) -> None:
        over = False
        try:
            while True:
                # The keepalive timer: one deadline for as long as nothing is due, not one per
                # wait (a cancel scope's deadline costs 3-6 us on this machine, so one per wait
                # was 8% of the server's CPU for short connections). When it passes, the wait
                # in _wait_for_work ends (its only place that can: _send pauses the timer) and
                # the timer is looked at again; looked at early, it says nothing is due yet.
                now = self._now()
                look = self._keepalive.due(now)[1] if self.conn.state is _OPEN else math.inf
                with trio.CancelScope(deadline=look) as self._timer:
                    over = await self._write_loop()
                    break
            if over:
                await self._end_writing()  # (a wait the timer must not cut short)
        finally:
            self._timer = None
            self._release_reader()
            self._writer_done.set()

    async def _write_loop(self) -> bool:
        """Write until the connection is over (True: everything up to its end is written) or
        broken (False: the session's tasks are cancelled)."""
        conn = self.conn
        while True:
            await self._wait_for_work()
            if self._failing:
                await self._send_failures()  # (their wake-ups are the one being handled)
            self._wakeup = trio.Event()
            self._write_scheduled = False
            self._grant_demand()
            if self._unsent:
                self._flush_items()
            chunks = self._output()
            if chunks or self._unfinished:
                self._unfinished = False  # send writes what send_nowait left first
                self._sending = True
                self._in_transport += sum(map(len, chunks))
                try:
                    await self._send(chunks)
                except ConnectionLost as error:  # broken, or the peer fell silent (see _send)
                    self._lost(ConnectionLost(str(error)) if isinstance(error, TransportClosed) else error)
                    self.nursery.cancel_scope.cancel()
                    return False
                finally:
                    self._sending = False
                self._in_transport = 0  # (what send_nowait left went first)
                self._keepalive.last_sent = self._now()
                self._answers = 0
                self._release_reader()
                if self._room_waiters:
                    self._room_freed()
            refill, self._refill = self._refill, []
            if conn.state is not _CLOSED:
                # Once this side has written CONN_ERROR nothing more goes out: a window topped
                # up now would have a publisher with unbounded demand emit into the void, and
                # wake this loop for ever instead of letting it close the connection below.
                for outbound in refill:
                    outbound.refill()
            if self._write_scheduled:
                continue
            if conn.state is _CLOSED or (self._peer_going_away and not conn.stream_count):
                # Everything up to the CONN_ERROR is out, or the peer said GO_AWAY and our
                # last stream ended: the connection is over (SPEC 10.2, 10.3). The side that
                # sent GO_AWAY waits for this close, so an opening frame that crossed its
                # GO_AWAY still gets its GOING_AWAY answer.
                self._linger = True
                return True

    async def _end_writing(self) -> None:
        """The connection is over on this side (everything is written): end it.

        Where the transport half-closes, the reader reads on to the peer's own close (dropping
        what comes), which the half-close prompts, for at most ``FLUSH_TIMEOUT``: so the last
        frame is not reset away by closing with unread input, and the reader ends without a
        cancel (raising and catching a Cancelled through its wait cost a short connection 5%
        of the server's CPU). Otherwise (TLS, or a consumer reading in the reader's place) the
        session's tasks are cancelled and :meth:`run` lingers as needed. Once the peer has
        closed, the reader has ended, and :meth:`run` ends the rest."""
        if self._eof:
            return
        if self.transport.half_closable and self._lent_to is None:
            # The bound first: the half-close itself may wait (a WebSocket close frame behind
            # answers a peer that reads nothing has not taken), and past it the session ends
            # as a cancelled one does, not when the peer reads or goes.
            self._linger_until = self.nursery.cancel_scope.deadline = self._now() + FLUSH_TIMEOUT
            await self.transport.send_eof()
        else:
            self.nursery.cancel_scope.cancel()

    def _release_reader(self) -> None:
        """A write is done (or the writer is): a reader waiting for it reads on."""
        if self._written is not None:
            self._written.set()
            self._written = None

    async def _send(self, chunks: Sequence[Bytes]) -> None:
        """The writer's write: what the socket takes at once, then a wait for the rest to go
        out. Raises TransportClosed if the connection broke, and ConnectionLost (TIMEOUT) if
        the peer sent nothing for three keepalive intervals while the wait lasted (SPEC 10.1).

        A peer that is gone (a partition, a host that died) stops taking our bytes, so a write
        to it waits; without a bound it would wait for TCP's own timeout, many minutes, holding
        the connection and, under backpressure, the topic it subscribed to. A peer that is
        alive sends bytes meanwhile (its PINGs at the least), and each one moves the bound
        (``_reader``)."""
        transport = self.transport
        if transport.send_nowait(chunks):
            return
        keepalive = self._keepalive
        if keepalive.interval is None:
            await transport.send([])
            return
        timer = self._timer
        assert timer is not None, "_send runs inside _writer's keepalive timer"
        if timer.cancel_called:
            # The timer went off while the writer was on its way here: its cancel, taken inside
            # the write below, would drop what the transport holds unwritten (the rest of a
            # frame, whose next frame would then follow its first part). Taken here, it leaves
            # that rest with the transport (send_nowait kept it), and the writer, looking at the
            # keepalive state again, writes it first on its next round.
            self._unfinished = True
            self._wakeup.set()
            await trio.lowlevel.checkpoint()  # (raises the timer's Cancelled)
        paused, timer.deadline = timer.deadline, math.inf  # the timer must not cut a write short
        self._send_wait = wait = trio.CancelScope(deadline=keepalive.dead_at())
        try:
            with wait:
                await transport.send([])
        finally:
            self._send_wait = None
            timer.deadline = paused
        if wait.cancelled_caught:
            message = f"nothing received for {3 * keepalive.interval:g} s while a write to it waited"
            raise ConnectionLost(f"connection to {self.peer} timed out: {message}", ErrorCode.TIMEOUT)

    def _grant_demand(self) -> None:
        dirty, self._demand_dirty = self._demand_dirty, []
        for inbound in dirty:
            if inbound.pending and not inbound.cancelled:
                amount, inbound.pending = inbound.pending, 0
                self.conn.send_request(inbound.stream_id, amount)

    async def _reader(self) -> None:
        conn = self.conn
        while conn.state is not _CLOSED:
            if self._lent_to is not None:
                await self._wait_for_socket()  # a consumer reads in this task's place
                continue
            self._at_rest = False  # (not lent until it rests again: its waits below come first)
            if self._leftover is not None:  # what a consumer's read left for this task's waits
                events, done = self._leftover
                self._leftover = None
                await self._dispatch_slices(events, done)
                del events
            if self._answers > MAX_UNTAKEN_ANSWERS and (self._sending or self._unfinished):
                # The peer sends, its answers pile up, it does not read them: stop reading
                # from it until the write it is not taking is done (MAX_UNTAKEN_ANSWERS).
                self._written = written = trio.Event()
                await written.wait()
            taken = await self._read_once()
            if taken is None:
                return
            events, done = taken
            if done < len(events):  # openings took a slice
                await self._dispatch_slices(events, done)
            # What these bytes brought dies now, not after the next read: objects that outlive
            # a wait are found by the GC's first collection and aged (fan-out: 10% slower).
            del events
            if self._woke_consumer:
                # A consumer waits for what these bytes brought: let it run before this task
                # reads again, since arming the next read (a recv that finds nothing, an epoll
                # registration) would otherwise come first and delay it. Twice, because trio
                # runs each batch of runnable tasks in a random order: after the first yield
                # the reader may still go before the consumer, after the second it cannot.
                # Subscribe-to-first-item p50, TCP: 179 -> 172 us (WebSocket 196 -> 193).
                # Meanwhile the consumer may take the socket for its next wait (lend_socket).
                self._woke_consumer = False
                self._at_rest = True
                await trio.lowlevel.cancel_shielded_checkpoint()
                await trio.lowlevel.cancel_shielded_checkpoint()

    async def _read_once(self) -> tuple[list[Any], int] | None:
        """Receive the peer's next bytes and handle them (:meth:`_take_in`); None once the
        transport is closed (the connection is over)."""
        try:
            data = await self.transport.receive()
        except TransportClosed as error:
            self._transport_closed(error)
            return None
        if self._linger_until != math.inf:  # the connection is over (_end_writing): what comes is dropped
            if data:
                return [], 0
            self._eof = True
            return None
        return self._take_in(data)

    def _take_in(self, data: Bytes) -> tuple[list[Any], int]:
        """Handle bytes received (b"": end of file), as far as that needs no wait: the events
        they brought and how many of them are done (:meth:`_dispatch`). What they answered is
        written (or left to the writer)."""
        conn = self.conn
        self._keepalive.last_received = self._now()
        if self._send_wait is not None:  # the peer is alive: a waiting write may wait on
            self._send_wait.deadline = self._keepalive.dead_at()
        self._holding = True
        try:
            if self._unsent:
                # Items taken before these bytes arrived go out before any frame the
                # protocol writes in answer to them (a stream error, say).
                self._flush_items()
            queued = conn.buffered
            if data:
                conn.receive_data(data)
            else:
                self._eof = True
                conn.receive_eof()
            # Answers the protocol wrote (PONGs, refusals); opening a stream counts its own.
            self._answers += conn.buffered - queued
            events = conn.events_received()
            done = self._dispatch(events, 0)
        finally:
            self._holding = False
        # The answers (and frames the protocol wrote itself: PONG, errors) go out now. Bytes
        # that asked for nothing (an answer's items, as in every request-response) leave
        # nothing to write, nor anything for the writer to hear: anything queued while
        # holding set _write_scheduled (_wake_writer), and an end or GO_AWAY is looked at here.
        if self._write_scheduled or conn.buffered or conn.state is not _OPEN or self._peer_going_away:
            self._write_scheduled = True
            self._send_now()
        return events, done

    def _transport_closed(self, error: TransportClosed) -> None:
        self._eof = True
        self._lost(ConnectionLost(str(error)))
        self.conn.receive_eof()  # the protocol is over too; its own report adds nothing
        self.conn.events_received()

    # -- reading in a consumer's task ---------------------------------------------------------------
    #
    # A consumer that waits for its stream's next signal would be woken by the reader: a trip
    # through the scheduler on the path of every answer (subscribe-to-first-item: 9 us of
    # 105). So when the reader is at rest, having just handed a consumer what it read, and
    # the transport loses nothing to a cancelled receive, the consumer may take the socket and
    # read in the reader's place until its signal comes; the reader waits meanwhile. A task
    # that asks for one answer after another (request-response) then reads its answers itself.

    def lend_socket(self) -> bool:
        """Whether the calling task may read in the reader's place (:meth:`read_in_place`),
        now: the reader is at rest, no other task reads, and a cancelled receive on this
        transport loses nothing. If True, the caller must call :meth:`read_in_place`."""
        if (
            self._at_rest
            and self._lent_to is None
            and self._leftover is None  # the reader hands those on first, and
            and self._answers <= MAX_UNTAKEN_ANSWERS  # waits for the writer first
            and self.transport.cancel_safe_receive
            and self.conn.state is _OPEN
        ):
            self._lent_to = trio.lowlevel.current_task()
            return True
        return False

    async def read_in_place(self, until: Callable[[], bool]) -> None:
        """Receive and handle the peer's bytes in the calling task, which :meth:`lend_socket`
        let read, until ``until()`` is true or the connection ends, then give the socket back
        to the reader. Left earlier (the socket back to the reader) where handling them needs
        a wait: openings beyond a slice, answers the peer does not take. Cancellable: no byte
        is lost."""
        conn = self.conn
        try:
            while not until() and conn.state is not _CLOSED:
                taken = await self._read_once()
                if taken is None:
                    return
                events, done = taken
                self._woke_consumer = False  # woken consumers run when this task waits
                if done < len(events):
                    self._leftover = (events, done)
                    return
                del events
                if self._answers > MAX_UNTAKEN_ANSWERS and (self._sending or self._unfinished):
                    return
        finally:
            self._lent_to = None
            reader, self._parked_reader = self._parked_reader, None
            if reader is not None:
                trio.lowlevel.reschedule(reader)

    def ask_for_bytes(self) -> None:
        """Make the peer send something (a PING's PONG), so that a task reading in the reader's
        place for a stream that ended from elsewhere (closed by another task) stops waiting
        one round trip from now rather than at the connection's next traffic."""
        if self._lent_to is not None and self.conn.state is _OPEN:
            self.conn.send_ping()
            self._write_urgently()

    async def _wait_for_socket(self) -> None:
        """Park the calling task (the reader, or the end of :meth:`run`) while a consumer
        reads in its place."""
        self._parked_reader = trio.lowlevel.current_task()

        def abort(raise_cancel: Any) -> trio.lowlevel.Abort:
            self._parked_reader = None
            return trio.lowlevel.Abort.SUCCEEDED

        await trio.lowlevel.wait_task_rescheduled(abort)

    async def _wait_for_work(self) -> None:
        """The writer's wait: until it is woken, keeping SPEC 10.1 by the shared timer
        (:class:`rsnet.client_rules.Keepalive`) on every turn: PING after an interval without
        sending; give up after three intervals without receiving a byte (CONN_ERROR TIMEOUT,
        which the writer then sends). Looked at on every turn, so a peer that only reads is
        given up on however busy the writer is; an idle writer's wait ends when the timer is
        due (``_writer``). Yields at least once unless it has a frame to write.

        The writer keeps the timer rather than a task of its own: a task per connection, its
        sleep and its cancellation at the end cost the server a sixth of its CPU for a short
        connection (1,000 connections x one 100-item stream: 3.8 against 3.2 us an item)."""
        keepalive = self._keepalive
        if keepalive.interval is not None and self.conn.state is _OPEN:
            now = self._now()
            due = keepalive.due(now)[0]
            if due is Due.DEAD:
                self._flush_items()
                self._closing_error = keepalive.timed_out(self.conn, self.peer)
                return  # the writer sends the CONN_ERROR and ends the connection
            if due is Due.PING:
                self.conn.send_ping()
                keepalive.last_sent = now  # the writer is about to send it
                return
        await self._wakeup.wait()

    # -- dispatch of received events ------------------------------------------------------------------

    async def _dispatch_slices(self, events: list[Any], done: int) -> None:
        """Hand on ``events[done:]``, after a first slice, a slice at a time (:meth:`_dispatch`),
        letting the other tasks run before each, and writing what each slice answered."""
        while done < len(events):  # to the end: a ConnectionClosed may come last
            await trio.lowlevel.checkpoint()
            self._holding = True
            try:
                done = self._dispatch(events, done)
            finally:
                self._holding = False
            self._write_scheduled = True
            self._send_now()

    def _dispatch(self, events: list[Any], start: int) -> int:
        """Hand ``events[start:]`` on, in order, until opening streams has taken
        ``OPENING_SLICE``; returns how many of ``events`` are done."""
        deadline = 0.0
        for event in events[start:] if start else events:
            kind = type(event)
            if kind is Items:
                inbound = self._inbound.get(event.stream_id)
                if inbound is not None:
                    inbound.deliver(event.items, event.nbytes)
            elif kind is Request:
                outbound = self._outbound.get(event.stream_id)
                if outbound is not None:
                    outbound.remote_request(event.n)
            elif kind is Complete:
                inbound = self._inbound.pop(event.stream_id, None)
                if inbound is not None:
                    inbound.terminate(None)
            elif kind is Error:
                self._on_error(event)
            elif kind is Cancel:
                outbound = self._outbound.pop(event.stream_id, None)
                if outbound is not None:
                    self._offered.pop(event.stream_id, None)
                    outbound.remote_cancel(None)
            elif kind is Subscribe or kind is Offer:  # only openings read the clock
                now = time.perf_counter()
                if not deadline:
                    deadline = now + OPENING_SLICE
                elif now > deadline:  # (rare: the index is looked for only then)
                    return next(index for index in range(start, len(events)) if events[index] is event)
                if kind is Subscribe:
                    self._on_subscribe(event)
                else:
                    self._on_offer(event)
            elif kind is Accept:
                self._on_accept(event)
            elif kind is ConnectionClosed:
                self._lost(connection_lost(event, self.peer))
            elif kind is GoAway:
                self._peer_going_away = True  # the writer closes once no stream is left
            # Pong: nothing to do (the protocol answers PINGs itself)
        return len(events)

    def _on_error(self, event: Error) -> None:
        error = StreamError(event.code, event.message, event.data)
        inbound = self._inbound.pop(event.stream_id, None)
        if inbound is not None:
            inbound.terminate(error)
            return
        outbound = self._outbound.pop(event.stream_id, None)
        if outbound is not None:
            self._offered.pop(event.stream_id, None)
            outbound.remote_cancel(error)

    def _context(self, metadata: dict[str, Any]) -> StreamContext:
        return StreamContext(self.nursery, self.peer, self.principal, metadata)

    def _host_opens(
        self, what: str, open_it: Callable[[str, Any, StreamContext], _T], event: Subscribe | Offer
    ) -> _T | None:
        """What the host's ``open_it`` (open_publisher or open_sink) gives for the stream the
        peer opened; None if it refused (StreamError: that code) or failed (INTERNAL, logged
        at a bounded rate): the stream has its ERROR then, and the connection lives on."""
        try:
            return open_it(event.name, event.params, self._context(event.metadata))
        except StreamError as rejection:
            self.conn.send_error(event.stream_id, rejection.code, rejection.message, rejection.data)
        except Exception as failure:
            failure_log.exception("opening %s %r for %s failed", what, event.name, self.peer)
            self.conn.send_error(event.stream_id, ErrorCode.INTERNAL, f"{type(failure).__name__}: {failure}")
        return None

    def _on_subscribe(self, event: Subscribe) -> None:
        queued = self.conn.buffered
        publisher = self._host_opens("publisher", self.host.open_publisher, event)
        if publisher is not None:
            outbound = _Outbound(self, event.stream_id, event.initial_demand, accept=True)
            self._outbound[event.stream_id] = outbound
            self._subscribe_outbound(publisher, outbound, event.name)
        # Answers: the ACCEPT or the refusal, and all of a stream that ended at once.
        self._answers += self.conn.buffered - queued

    def _subscribe_outbound(self, publisher: Publisher[Any], outbound: _Outbound, name: str) -> None:
        """``publisher.subscribe(outbound)``, for one stream only: a publisher that raises from
        ``subscribe`` (rule 1.9 says it must signal instead) ends its stream with the ERROR
        its StreamError names, or INTERNAL (logged at a bounded rate), never the connection."""
        try:
            publisher.subscribe(outbound)
        except Exception as failure:
            if outbound.subscription is not None:
                outbound.subscription.cancel()  # whatever it started, it will not be heard
            if not isinstance(failure, StreamError):
                failure_log.exception("subscribing to publisher %r for %s failed", name, self.peer)
                failure = StreamError(ErrorCode.INTERNAL, f"{type(failure).__name__}: {failure}")
            outbound.on_error(failure)  # nothing if it ended the stream before it raised

    def _on_offer(self, event: Offer) -> None:
        queued = self.conn.buffered
        sink = self._host_opens("sink", self.host.open_sink, event)
        if sink is not None:
            self._open_inbound(sink, event.name, event.params, offer_id=event.stream_id)
        self._answers += self.conn.buffered - queued  # the ACCEPT or the refusal

    def _on_accept(self, event: Accept) -> None:
        publisher = self._offered.pop(event.stream_id, None)
        outbound = self._outbound.get(event.stream_id)
        if publisher is not None and outbound is not None:
            self._subscribe_outbound(publisher, outbound, f"offered on stream {event.stream_id}")

    def _lost(self, error: ConnectionLost) -> None:
        if self._closing_error is None:
            self._closing_error = error
        self._end_all(self._closing_error)

    def _end_all(self, error: ConnectionLost) -> None:
        inbound, self._inbound = self._inbound, {}
        outbound, self._outbound = self._outbound, {}
        self._offered.clear()
        for subscribed in inbound.values():
            subscribed.terminate(error)
        for served in outbound.values():
            served.remote_cancel(error)


def conn_error_frame(code: int, message: str) -> bytes:
    """A CONN_ERROR frame, for the WebSocket transport to answer what it detects itself (SPEC 2.2)."""
    return encode_frame(ConnError(code, message, None))


async def complete_handshake(
    transport: Transport, conn: Connection, wanted: type, timeout: float, *, deadline: float | None = None
) -> tuple[Any, list[Any]]:
    """Pump the transport until the handshake event ``wanted`` (Hello or Welcome) arrives.

    Returns it and the events that arrived with it. Raises :class:`HandshakeError` if the
    peer closed or refused, or ``timeout`` seconds passed (or ``deadline``, trio time, when
    the handshake's ``timeout`` began before this call), after sending CONN_ERROR TIMEOUT,
    SPEC 6.2; each step is :func:`rsnet.client_rules.handshake_outcome`. Whatever the
    connection must send meanwhile (HELLO, CONN_ERROR) is flushed.
    """
    received: list[Any] = []
    with trio.move_on_at(trio.current_time() + timeout if deadline is None else deadline):
        while True:
            pending = conn.data_to_send()
            if pending:
                await transport.send([pending])
            data = await transport.receive()
            if data:
                conn.receive_data(data)
            else:
                conn.receive_eof()
            received += conn.events_received()
            try:
                rest = handshake_outcome(received, wanted, transport.peer)
            except BaseException:
                pending = conn.data_to_send()
                if pending:
                    await transport.send([pending])  # our CONN_ERROR, if we sent one
                raise
            if rest is not None:
                return received[len(received) - len(rest) - 1], rest
    failure = handshake_timed_out(conn, timeout, transport.peer)
    with trio.move_on_after(FLUSH_TIMEOUT):
        await transport.send([conn.data_to_send()])
    raise failure
