"""The rsnet client on trio: connect to a server, subscribe to its publishers, offer it your own.

    async with rsnet.connect("tcp://127.0.0.1:7600", token=...) as conn:
        async for item in conn.subscribe("range", {"start": 0, "count": 10}):
            ...
        publisher = conn.publisher("ticks", {"interval": 0.1})  # a true Reactive Streams Publisher
        await conn.offer("uploads", rsnet.range_(0, 100))         # the server pulls with its demand

URLs: ``tcp://host:port``, ``tls://host:port``, ``ws://host:port/path``, ``wss://host:port/path``.
Publisher parameters are one mapping (``params``), never keyword arguments, so no parameter
name can collide with an option. Durations are seconds.

Demand policy: what a subscriber requests is accumulated per stream and sent as one REQUEST
per stream each time the connection writes, so many small ``request`` calls made between two
writes cost one frame (and a Reactive Streams subscriber of ``conn.publisher(...)`` gets
exactly the demand it requests). ``subscribe`` demands adaptively by default: a window that
grows while the consumer keeps up and the round trip dominates, shrinks for a slow consumer,
and stays within a byte budget by the item sizes measured as they arrive
(:class:`rsnet.client_rules.AdaptiveDemand`); ``subscribe(prefetch=N)`` instead requests N up
front and N - N//4 each time that many have been consumed (:class:`rsnet.client_rules.Refill`).
The blocking client drives the same policies. Frames that arrive after a cancel are dropped
before the subscriber sees them. When the connection fails, every open subscription receives
``on_error(ConnectionLost)``; nothing waits forever. The rules this client shares with the
blocking client (URLs, handshake, keepalive, close policy, demand) live in
:mod:`rsnet.client_rules`.
"""

from __future__ import annotations

import functools
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any

import trio

from ..client_rules import (
    DEFAULT_KEEPALIVE,
    HANDSHAKE_TIMEOUT,
    NoPublicConstructor,
    client_connection,
    close_connection,
    demand_policy,
    parse_endpoint,
    stream_params,
)
from ..errors import ConnectionLost, HandshakeError, single_errors
from ..protocol import DEFAULT_MAX_FRAME_SIZE, DEFAULT_MAX_STREAMS, ErrorCode, State, Welcome
from ..streams import Publisher, Subscriber
from ..streams.subscriptions import subscribe_failed
from ..transport import Transport, connect_tcp, connect_websocket
from .iterator import StreamIterator
from .session import Host, RemotePublisher, Session, complete_handshake, conn_error_frame

MAX_PARKED = 1024
"""Subscriptions that may wait for a reconnect; more are refused with ConnectionLost."""


class Client(metaclass=NoPublicConstructor):
    """An open connection to an rsnet server, made by :func:`connect` (see the module docstring).

    With ``reconnect``, a lost connection is re-established in the background (backing off
    up to ``max_reconnect_delay`` seconds between attempts): streams open on the lost
    connection end with ConnectionLost as always, but new subscriptions made meanwhile wait
    for the next connection and then proceed. Refused credentials end the reconnecting.
    """

    def __init__(
        self,
        session: Session,
        nursery: trio.Nursery,
        dial: Callable[[], Awaitable[tuple[Session, list[Any]]]] | None,
        max_reconnect_delay: float,
        max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
    ) -> None:
        self._session = session
        self._max_frame_size = max_frame_size  # no received item is larger
        self._nursery = nursery
        self._dial = dial
        self._max_delay = max_reconnect_delay
        self._parked: list[tuple[Subscriber[Any], str, Any]] = []
        self._closing = False
        self._gave_up: ConnectionLost | None = None

    @property
    def peer(self) -> str:
        """The server's address, for messages."""
        return self._session.peer

    @property
    def closed(self) -> bool:
        """The connection has ended and will not be re-established: true by the time its
        streams see ConnectionLost (the session's own teardown may still be under way)."""
        session = self._session
        return (session.closed or session.conn.state is State.CLOSED) and self._dial is None

    def publisher(self, name: str, params: Mapping[str, Any] | None = None) -> RemotePublisher:
        """The server's publisher ``name``; each ``subscribe`` opens a stream with ``params``."""
        return RemotePublisher(self, name, stream_params(params))

    def subscribe(
        self,
        name: str,
        params: Mapping[str, Any] | None = None,
        *,
        prefetch: int | None = None,
        limit: int | None = None,
        budget: int | None = None,
    ) -> StreamIterator:
        """``async for item in conn.subscribe(name, params)``: items of the server's publisher.
        A remote error is raised from the loop; leaving the loop early (or ``async with``
        around it) cancels the stream.

        Demand: adaptive by default, within ``budget`` bytes of items requested and not yet
        consumed (default :data:`rsnet.client_rules.DEFAULT_BUDGET`, 4 MiB, counted as the
        items' wire size); ``prefetch=N`` fixes the window at N items instead (the rule of
        :class:`rsnet.client_rules.Refill`). ``limit``: at most that many items, and never more
        demand than that on the wire (as the blocking client)."""
        demand = demand_policy(
            trio.current_time, prefetch=prefetch, limit=limit, budget=budget, max_item_bytes=self._max_frame_size
        )
        return StreamIterator(self.publisher(name, params), demand, limit)

    async def offer(self, name: str, publisher: Publisher[Any], params: Mapping[str, Any] | None = None) -> None:
        """Serve ``publisher`` to the server's sink ``name``; returns when it completed (its
        COMPLETE sent: not that the server has processed every item; a broker says what it
        stored on ``$acks``, which :func:`rsnet.broker.client.publish` waits for).

        Raises :class:`~rsnet.errors.StreamError` if the server rejects or fails the stream or
        the publisher fails, and :class:`~rsnet.errors.ConnectionLost` if the connection ends."""
        await self._session.offer(name, publisher, stream_params(params))

    async def aclose(self) -> None:
        """Close the connection (the policy of :func:`rsnet.client_rules.close_connection`):
        open streams end, their subscribers see ConnectionLost. Idempotent."""
        self._closing = True
        self._release_parked(ConnectionLost("the client was closed"))
        session = self._session
        if not session.closed and session.conn.state is State.OPEN:
            session.end_by(close_connection)
        await session.wait_closed()

    # -- for RemotePublisher (a StreamOpener) and connect() --------------------------------------

    def _open_inbound(self, subscriber: Subscriber[Any], name: str, params: Any) -> None:
        session = self._session
        waiting = self._dial is not None and not self._closing and self._gave_up is None
        # Reconnecting, a stream opened while the server drains (GO_AWAY) waits for the next
        # connection too, as one opened while there is none: a rolling restart surfaces nothing.
        if waiting and (session.closed or session.conn.state is not State.OPEN or session.conn.going_away):
            if len(self._parked) < MAX_PARKED:
                self._parked.append((subscriber, name, params))
                return
        session._open_inbound(subscriber, name, params)

    async def _supervise(self) -> None:
        """Reconnect whenever the session ends, until the client closes."""
        assert self._dial is not None
        while True:
            await self._session.wait_closed()
            delay = 0.05
            while not self._closing:
                try:
                    session, events = await self._dial()
                except HandshakeError as refused:
                    if refused.code in (ErrorCode.UNAUTHORIZED, ErrorCode.UNSUPPORTED_VERSION):
                        self._gave_up = refused
                        self._release_parked(refused)
                        return
                except ConnectionLost:
                    pass
                else:
                    self._session = session
                    self._nursery.start_soon(functools.partial(session.run, events=events))
                    parked, self._parked = self._parked, []
                    for subscriber, name, params in parked:
                        session._open_inbound(subscriber, name, params)
                    break
                await trio.sleep(delay)
                delay = min(delay * 2, self._max_delay)
            if self._closing:
                return

    def _release_parked(self, error: ConnectionLost) -> None:
        parked, self._parked = self._parked, []
        for subscriber, _, _ in parked:
            subscribe_failed(subscriber, error)


async def open_transport(url: str, *, ssl_context: ssl.SSLContext | None, max_frame_size: int) -> Transport:
    """A transport to ``url`` (see :func:`rsnet.client_rules.parse_endpoint`)."""
    endpoint = parse_endpoint(url)
    if endpoint.websocket:
        return await connect_websocket(
            url, max_message_size=max_frame_size, ssl_context=ssl_context, conn_error=conn_error_frame
        )
    if endpoint.secure and ssl_context is None:
        ssl_context = ssl.create_default_context()
    return await connect_tcp(endpoint.host, endpoint.port, ssl_context if endpoint.secure else None)


@asynccontextmanager
async def connect(
    url: str,
    *,
    token: str | bytes | None = None,
    ssl_context: ssl.SSLContext | None = None,
    host: Host | None = None,
    max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
    max_streams: int = DEFAULT_MAX_STREAMS,
    keepalive_interval: float = DEFAULT_KEEPALIVE,
    timeout: float = HANDSHAKE_TIMEOUT,
    metadata: dict[str, Any] | None = None,
    reconnect: bool = False,
    max_reconnect_delay: float = 5.0,
) -> AsyncIterator[Client]:
    """Connect and handshake; the connection lives for the ``async with`` block.

    ``timeout`` (seconds) bounds the transport and rsnet handshakes together;
    ``keepalive_interval`` (seconds) is our proposal (the server decides, SPEC 10.1);
    ``host`` serves publishers the server may subscribe to. ``reconnect``: see :class:`Client`.

    Raises ValueError for an unusable URL, :class:`~rsnet.errors.HandshakeError` if the
    server refuses (bad token, no common version, shutting down) or does not answer in time,
    and :class:`~rsnet.errors.TransportClosed` if it cannot be reached; both are
    :class:`~rsnet.errors.ConnectionLost`, as in the blocking client.
    """
    endpoint = parse_endpoint(url)

    async def dial() -> tuple[Session, list[Any]]:
        transport = None
        with trio.move_on_after(timeout):
            transport = await open_transport(url, ssl_context=ssl_context, max_frame_size=max_frame_size)
        if transport is None:
            raise HandshakeError(f"connecting to {endpoint.peer} timed out after {timeout:g} s", ErrorCode.TIMEOUT)
        conn = client_connection(
            token=token,
            max_frame_size=max_frame_size,
            max_streams=max_streams,
            keepalive_interval=keepalive_interval,
            metadata=metadata,
        )
        try:
            _, events = await complete_handshake(transport, conn, Welcome, timeout)
        except BaseException:
            await trio.aclose_forcefully(transport)  # type: ignore[arg-type]  # a Transport is an AsyncResource in all but name
            raise
        return Session(transport, conn, host=host, keepalive_fallback=keepalive_interval), events

    session, events = await dial()
    with single_errors():  # ``except ConnectionLost`` around ``async with connect()`` works
        async with trio.open_nursery() as nursery:
            nursery.start_soon(functools.partial(session.run, events=events))
            client = Client._create(session, nursery, dial if reconnect else None, max_reconnect_delay, max_frame_size)
            if reconnect:
                nursery.start_soon(client._supervise)
            try:
                yield client
            finally:
                with trio.CancelScope(shield=True):
                    await client.aclose()
                nursery.cancel_scope.cancel()  # the supervisor, if any


__all__ = ["Client", "connect"]
