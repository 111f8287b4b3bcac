"""The blocking client: the sans-I/O protocol driven over a blocking socket, in the caller's thread.

    with rsnet.sync.connect("tcp://127.0.0.1:7600", token=...) as client:
        for item in client.subscribe("range", {"start": 0, "count": 10}):
            ...
        client.offer("uploads", rows, {"table": "t"})   # sent as the server's demand allows

There is no event loop and no background thread: the connection is read only while a call
into the client waits (a ``next()`` on a subscription whose buffer is empty, ``offer``,
``close``). While it waits, it answers the server's PINGs, sends its own after a keepalive
interval of sending nothing, and gives up after three intervals without receiving a byte
(SPEC 10.1), so no wait outlives a dead server. Between calls nothing is read or answered: a
consumer that holds an item for longer than three of the server's keepalive intervals is
dropped by the server, and sees ConnectionLost(TIMEOUT) on its next call. One thread at a time.

The rules it shares with the trio client (URLs, handshake, keepalive, close policy, the demand
policy, the errors raised) are :mod:`rsnet.client_rules`'s, and its method names match the trio
client's (``close`` for ``aclose``). Demand policy: adaptive by default, within a byte budget
(:class:`rsnet.client_rules.AdaptiveDemand`: a consumer that finds its buffer empty and nothing
arrived on the socket either has waited for the round trip, and the window grows); with
``subscribe(prefetch=N)``, N with the SUBSCRIBE, then N - N//4 each time that many items have
been consumed. Requests are sent at once. Items of a stream are buffered until its iterator
takes them, and the protocol refuses items beyond the demand granted (FLOW_CONTROL), so a
stream nobody reads holds at most its window (the budget's worth of items, or ``prefetch``).

This module must never import trio or asyncio: it runs where no event loop can (a Spark
executor's worker pulls a plain iterator), and a test checks it.
"""

from __future__ import annotations

import contextlib
import ssl
import time
from collections import deque
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping
from typing import Any

from ..client_rules import (
    DEFAULT_KEEPALIVE,
    FLUSH_TIMEOUT,
    HANDSHAKE_TIMEOUT,
    Demand,
    Due,
    Keepalive,
    NoPublicConstructor,
    client_connection,
    close_connection,
    connection_lost,
    demand_policy,
    handshake_outcome,
    handshake_timed_out,
    refused_after_go_away,
    stream_params,
)
from ..errors import ConnectionLost, StreamError, TransportClosed, error_frame_fields
from ..protocol import (
    DEFAULT_MAX_FRAME_SIZE,
    MAX_INT,
    Cancel,
    Complete,
    Connection,
    ConnectionClosed,
    Error,
    GoAway,
    Items,
    LocalProtocolError,
    Welcome,
)
from .transport import BlockingTransport, open_transport

OFFER_CHUNK = 1024
"""Items ``offer`` encodes between two writes and two looks at what the server sent."""

SLOW_SOURCE = 0.001
"""Seconds: an item that took longer than this to come from ``offer``'s iterable is sent at
once instead of waiting for a full chunk, so a slow source's items are not held back."""


class _Stream:
    """A stream this client opened: the items received and not yet taken, how it ended, and
    (for a subscription) its demand policy, which hears of every batch received."""

    __slots__ = ("demand", "ended", "error", "items")

    def __init__(self, demand: Demand | None = None) -> None:
        self.items: deque[Any] = deque()
        self.ended = False  # COMPLETE, ERROR or CANCEL received, or the connection ended
        self.error: BaseException | None = None
        self.demand = demand


class BlockingClient(metaclass=NoPublicConstructor):
    """An open connection to an rsnet server, made by :func:`connect`; used from one thread at
    a time (see the module docstring).

    Errors: a stream's remote ERROR (a rejection such as UNKNOWN_PUBLISHER included) is raised
    as :class:`StreamError` with the code, message and data sent; the end of the connection
    (closed, reset, timed out, or closed with a CONN_ERROR) as :class:`ConnectionLost`, in
    every stream open on it and in every later call.
    """

    def __init__(
        self,
        transport: BlockingTransport,
        conn: Connection,
        events: list[Any],
        keepalive_interval: float,
        max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
    ) -> None:
        self._transport = transport
        self._max_frame_size = max_frame_size  # no received item is larger
        self._conn = conn
        self.peer = transport.peer
        self._keepalive = Keepalive.negotiated(conn, keepalive_interval, time.monotonic())
        interval = self._keepalive.interval
        transport.send_timeout = 3 * interval if interval else None
        self._streams: dict[int, _Stream] = {}
        self._lost: ConnectionLost | None = None
        self._peer_going_away = False
        self._busy = False
        self._deferred_cancels: list[int] = []
        with self._io():
            self._dispatch(events)
            self._flush()

    @property
    def closed(self) -> bool:
        """The connection has ended (closed by either side, or lost)."""
        return self._lost is not None

    # -- the public operations -------------------------------------------------------------------

    def subscribe(
        self,
        name: str,
        params: Mapping[str, Any] | None = None,
        *,
        prefetch: int | None = None,
        limit: int | None = None,
        budget: int | None = None,
    ) -> Generator[Any]:
        """The items of the server's publisher ``name``, as a generator.

        The stream opens on the first ``next()``. Demand is adaptive by default, within
        ``budget`` bytes of items requested and not yet consumed (default
        :data:`rsnet.client_rules.DEFAULT_BUDGET`, 4 MiB, counted as the items' wire size);
        ``prefetch=N`` fixes it at N items in flight or buffered instead, as the trio client.
        The generator ends when the publisher completes; a remote error is
        raised from it as :class:`StreamError` (after the items that came before it), the end
        of the connection as :class:`ConnectionLost`. Closing the generator before its end
        (``close()``, or dropping it) cancels the stream. Several may be open at once.

        ``limit``: at most that many items. The demand sent never adds up to more, so the
        server sends nothing beyond them (exact demand for a known count); the stream is
        cancelled once they were taken, unless it ended first.
        """
        demand = demand_policy(
            time.monotonic, prefetch=prefetch, limit=limit, budget=budget, max_item_bytes=self._max_frame_size
        )
        return self._items(name, stream_params(params), demand, limit)

    def offer(self, name: str, iterable: Iterable[Any], params: Mapping[str, Any] | None = None) -> None:
        """Push the items of ``iterable`` to the server's sink ``name``, then complete.

        Items are taken from the iterable only as the server requests them: this blocks
        while it has no demand. They are written in chunks (up to the demand, at most
        :data:`OFFER_CHUNK`), except that an item the iterable was slow to produce is sent at
        once; a source that yields a burst and then blocks holds that burst until its next item.

        Returns when the iterable is exhausted and COMPLETE was sent, or early if the server
        cancelled. Raises :class:`StreamError` if the server rejects or fails the stream, or an
        item cannot be sent (``None``, not encodable, too large: the stream ends with that
        code); :class:`ConnectionLost` if the connection ends; and whatever the iterable
        raises, after sending it to the server as the stream's error.
        """
        items = iter(iterable)
        conn = self._conn
        sent_params = stream_params(params)
        stream_id, stream = self._open(lambda: conn.send_offer(name, sent_params))
        try:
            while True:
                self._pump(lambda: stream.ended or conn.outstanding_demand(stream_id))
                if stream.ended:
                    break
                if self._send_items(stream_id, items, min(conn.outstanding_demand(stream_id), OFFER_CHUNK)):
                    return
        except BaseException as failure:
            # The iterable failed, or the wait was interrupted: the server's sink must not wait
            # for a stream nobody feeds. A no-op if the stream has already ended.
            if self._lost is None:
                self._fail_stream(stream_id, *error_frame_fields(failure))
            raise
        finally:
            del self._streams[stream_id]
        if stream.error is not None:
            raise stream.error

    def close(self) -> None:
        """Close the connection; idempotent. Streams still open end with ConnectionLost (and
        are cancelled at the server). Waits up to :data:`FLUSH_TIMEOUT` for the server to
        close its side, so our last frame is read before the connection goes."""
        if self._lost is not None:
            return
        with self._io():
            lost = close_connection(self._conn)
            self._flush()
            self._end(lost, linger=FLUSH_TIMEOUT)

    def __enter__(self) -> BlockingClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- streams -----------------------------------------------------------------------------------

    def _open(self, send_opening: Callable[[], int], demand: Demand | None = None) -> tuple[int, _Stream]:
        if self._lost is not None:
            raise self._lost
        if self._conn.going_away:
            raise refused_after_go_away(self._peer_going_away)
        with self._io():
            try:
                stream_id = send_opening()
            except LocalProtocolError as refused:  # e.g. TOO_MANY_STREAMS, an unencodable param
                raise StreamError(refused.code, refused.message) from None
            stream = self._streams[stream_id] = _Stream(demand)
            self._flush()
        return stream_id, stream

    def _items(self, name: str, params: Any, demand: Demand, limit: int | None) -> Generator[Any]:
        if limit == 0:
            return
        conn = self._conn
        stream_id, stream = self._open(lambda: conn.send_subscribe(name, params, initial_demand=demand.initial), demand)
        buffered = stream.items
        left = MAX_INT if limit is None else limit
        try:
            while True:
                if not buffered:
                    self._poll()  # what has arrived meanwhile: taking it is no wait
                    if not buffered and not stream.ended:
                        demand.starved()
                        self._pump(lambda: buffered or stream.ended)
                    if not buffered:
                        if stream.error is not None:
                            raise stream.error
                        return
                wanted = demand.consumed()
                if wanted and not stream.ended:
                    self._request(stream_id, wanted)
                left -= 1
                yield buffered.popleft()
                if not left:
                    return  # the stream is cancelled below, unless it has ended
        finally:
            self._abandon(stream_id, stream)

    def _request(self, stream_id: int, n: int) -> None:
        with self._io():
            self._conn.send_request(stream_id, n)
            self._flush()  # now, so the server refills while the buffer is being consumed

    def _abandon(self, stream_id: int, stream: _Stream) -> None:
        """The stream's iterator is done with it: cancel it at the server unless it ended."""
        del self._streams[stream_id]
        if stream.ended or self._lost is not None:
            return
        if self._busy:
            # Closed in the middle of another call (finalized by the garbage collector, or by
            # an iterable that offer is pulling): writing now could split a frame that call is
            # writing, so that call sends the CANCEL when it ends.
            self._deferred_cancels.append(stream_id)
            return
        with self._io():
            self._conn.send_cancel(stream_id)
            self._flush()

    def _send_items(self, stream_id: int, items: Iterator[Any], count: int) -> bool:
        """Send up to ``count`` items (within the demand); True once the iterable is done."""
        conn = self._conn
        with self._io():
            for _ in range(count):
                started = time.monotonic()
                try:
                    item = next(items)
                except StopIteration:
                    conn.send_complete(stream_id)
                    self._flush()
                    return True
                try:
                    conn.send_next(stream_id, item)
                except LocalProtocolError as refused:  # offer sends it as the stream's error
                    raise StreamError(refused.code, refused.message) from None
                if time.monotonic() - started > SLOW_SOURCE:
                    self._flush()
            self._flush()
            self._receive(0)  # a CANCEL or ERROR must stop us even while demand remains
        return False

    def _fail_stream(self, stream_id: int, code: int, message: str, data: Any = None) -> None:
        try:
            self._conn.send_error(stream_id, code, message, data)
        except LocalProtocolError:  # unencodable data: send the error without it
            self._conn.send_error(stream_id, code, message)
        self._flush()

    # -- the connection ----------------------------------------------------------------------------

    @contextlib.contextmanager
    def _io(self) -> Iterator[None]:
        """Marks a call in progress (see :meth:`_abandon`); when the outermost one ends, it
        sends deferred CANCELs, and closes the connection if the server asked to go away and
        no stream is left (SPEC 10.2: the server waits for that close)."""
        if self._busy:
            yield
            return
        self._busy = True
        try:
            yield
            if self._lost is None:
                if self._deferred_cancels:
                    for stream_id in self._deferred_cancels:
                        self._conn.send_cancel(stream_id)
                    self._deferred_cancels.clear()
                    self._flush()
                if self._peer_going_away and not self._conn.stream_count:
                    self._end(ConnectionLost(f"{self.peer} went away"), linger=FLUSH_TIMEOUT)
        finally:
            self._busy = False

    def _flush(self) -> None:
        """Write whatever the protocol has queued. A broken transport ends the connection."""
        conn = self._conn
        chunks = conn.data_to_send_messages() if self._transport.message_based else [conn.data_to_send()]
        if not chunks or not chunks[0] or self._lost is not None:
            return
        try:
            self._transport.send(chunks)
        except TransportClosed as error:
            self._end(error)
            return
        except BaseException:
            # Interrupted mid-write (KeyboardInterrupt): a frame may be cut in half.
            self._end(ConnectionLost("interrupted while sending: the connection is unusable"))
            raise
        self._keepalive.last_sent = time.monotonic()

    def _pump(self, done: Callable[[], object]) -> None:
        """Flush, then receive and dispatch until ``done()`` or the end of the connection.

        Each wait lasts until the next keepalive PING is due or the connection would be dead:
        three intervals with no byte received, counted from when this wait began at the
        earliest (time spent outside the client is not silence we observed).
        """
        with self._io():
            self._flush()
            watching_since = time.monotonic()
            keepalive = self._keepalive
            while not done() and self._lost is None:
                if keepalive.interval is None:
                    self._receive(None)
                    continue
                now = time.monotonic()
                due, next_look = keepalive.due(now, watching_since)
                if due is Due.DEAD:
                    self._time_out()
                elif due is Due.PING:
                    self._conn.send_ping()
                    self._flush()
                else:
                    self._receive(next_look - now)

    def _poll(self) -> None:
        """Receive and dispatch what has arrived, without waiting."""
        if self._lost is None:
            with self._io():
                self._receive(0)

    def _receive(self, timeout: float | None) -> None:
        """Receive once (waiting up to ``timeout``; 0: only what has arrived) and dispatch."""
        try:
            data = self._transport.receive(timeout)
        except TimeoutError:
            return
        except TransportClosed as error:
            self._end(error)
            return
        self._keepalive.last_received = time.monotonic()
        conn = self._conn
        if data is None:
            conn.receive_eof()
        elif data:
            conn.receive_data(data)
        self._dispatch(conn.events_received())
        self._flush()  # PONGs; ERROR frames the protocol answered a violation with

    def _dispatch(self, events: list[Any]) -> None:
        streams = self._streams
        for event in events:
            kind = type(event)
            if kind is Items:
                stream = streams.get(event.stream_id)
                if stream is not None:
                    stream.items.extend(event.items)
                    if stream.demand is not None:
                        stream.demand.received(len(event.items), event.nbytes)
            elif kind is Complete or kind is Cancel:
                stream = streams.get(event.stream_id)
                if stream is not None:
                    stream.ended = True
            elif kind is Error:
                stream = streams.get(event.stream_id)
                if stream is not None:
                    stream.ended = True
                    stream.error = StreamError(event.code, event.message, event.data)
            elif kind is ConnectionClosed:
                lost = connection_lost(event, self.peer)
                if event.by_peer:
                    self._end(lost)
                else:  # we caught the server breaking the protocol: our CONN_ERROR says why
                    self._flush()
                    self._end(lost, linger=FLUSH_TIMEOUT)
            elif kind is GoAway:
                self._peer_going_away = True
            # Accept, Request: the protocol tracks them (offer reads the demand from it);
            # Pong: any byte received counts as alive. The server cannot open streams here:
            # we announce max_streams 0, so the protocol refuses them itself.

    def _time_out(self) -> None:
        lost = self._keepalive.timed_out(self._conn, self.peer)
        self._transport.send_timeout = FLUSH_TIMEOUT  # best effort: the server is likely gone
        self._flush()
        self._end(lost)

    def _end(self, error: ConnectionLost, *, linger: float = 0.0) -> None:
        """The connection is over: every stream still open ends with ``error``."""
        if self._lost is not None:
            return
        self._lost = error
        for stream in self._streams.values():
            if not stream.ended:
                stream.ended = True
                stream.error = error
        self._deferred_cancels.clear()
        self._transport.close(linger)


def connect(
    url: str,
    *,
    token: str | bytes | None = None,
    ssl_context: ssl.SSLContext | None = None,
    timeout: float = HANDSHAKE_TIMEOUT,
    max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
    keepalive_interval: float = DEFAULT_KEEPALIVE,
) -> BlockingClient:
    """Connect to ``url`` (``tcp://host:port``, ``tls://host:port``, ``ws://host:port/path``,
    ``wss://host:port/path``) and complete the handshake within ``timeout`` seconds (TCP,
    TLS, WebSocket and rsnet handshakes together).

    ``token`` is the server's auth token; ``ssl_context`` the TLS context for ``tls``/``wss``
    (default: the system's trust store); ``max_frame_size`` the largest frame (and WebSocket
    message) this side accepts; ``keepalive_interval`` our proposal in seconds (the server
    decides, SPEC 10.1).

    Raises ValueError for an unusable URL, :class:`~rsnet.errors.TransportClosed` if the server
    cannot be reached, and :class:`~rsnet.errors.HandshakeError` if it refuses the connection
    (``code``: UNAUTHORIZED for a bad token, and so on) or does not complete the handshake in
    time (``code`` TIMEOUT) — both :class:`~rsnet.errors.ConnectionLost`, exactly as the trio
    client. Use the client as a context manager, or call :meth:`BlockingClient.close`.
    """
    deadline = time.monotonic() + timeout
    transport = open_transport(url, ssl_context=ssl_context, max_frame_size=max_frame_size, deadline=deadline)
    # This client hosts nothing: the server may not open streams to it (max_streams 0).
    conn = client_connection(
        token=token, max_frame_size=max_frame_size, max_streams=0, keepalive_interval=keepalive_interval
    )
    try:
        events = _handshake(transport, conn, deadline, timeout)
    except BaseException:
        transport.close()
        raise
    return BlockingClient._create(transport, conn, events, keepalive_interval, max_frame_size)


def _handshake(transport: BlockingTransport, conn: Connection, deadline: float, timeout: float) -> list[Any]:
    """Send HELLO and receive until WELCOME; returns the events that came after it. Each step
    is :func:`rsnet.client_rules.handshake_outcome`, as in the trio client."""
    transport.send(conn.data_to_send_messages())
    received: list[Any] = []
    while (remaining := deadline - time.monotonic()) > 0:
        try:
            data = transport.receive(remaining)
        except TimeoutError:
            continue
        if data is None:
            conn.receive_eof()
        elif data:
            conn.receive_data(data)
        received += conn.events_received()
        try:
            rest = handshake_outcome(received, Welcome, transport.peer)
        except BaseException:
            _send_last_words(transport, conn)  # our CONN_ERROR, if the server broke the protocol
            raise
        if rest is not None:
            return rest
    failure = handshake_timed_out(conn, timeout, transport.peer)
    _send_last_words(transport, conn)
    raise failure


def _send_last_words(transport: BlockingTransport, conn: Connection) -> None:
    chunks = conn.data_to_send_messages()
    if chunks:
        transport.send_timeout = FLUSH_TIMEOUT
        try:
            transport.send(chunks)
        except TransportClosed:
            pass
