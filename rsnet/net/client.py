"""The rsnet client: connect to a server, subscribe to its publishers, offer it your own.

    async with rsnet.connect("tcp://127.0.0.1:7600", token=...) as conn:
        async for item in conn.subscribe("range", prefetch=256, start=0, count=10):
            ...
        publisher = conn.publisher("ticks", interval=0.1)  # a true Reactive Streams Publisher
        await conn.offer("uploads", rsnet.range_(0, 100))   # the server pulls with its demand

URLs: ``tcp://host:port``, ``tls://host:port``, ``ws://host:port/path``, ``wss://host:port/path``.

Demand policy: what a subscriber requests is accumulated per stream and sent as one REQUEST
per stream each time the connection writes, so many small ``request`` calls made between two
writes cost one frame; ``subscribe(prefetch=N)`` requests N up front and N - N//4 each time
that many have been consumed. Frames that arrive after a cancel are dropped before the
subscriber sees them. When the connection fails, every open subscription receives
``on_error(ConnectionLost)``; nothing waits forever.
"""

from __future__ import annotations

import functools
import ssl
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import trio

from ..errors import ConnectionLost, HandshakeError, TransportClosed, single_errors
from ..protocol import (
    DEFAULT_HANDSHAKE_TIMEOUT,
    DEFAULT_KEEPALIVE_INTERVAL,
    DEFAULT_MAX_FRAME_SIZE,
    DEFAULT_MAX_STREAMS,
    Connection,
    ErrorCode,
    Role,
    State,
    Welcome,
)
from ..streams import Publisher, Subscriber, iterate
from ..streams.iterate import DEFAULT_PREFETCH, PublisherIterator
from ..streams.subscriptions import subscribe_failed
from ..transport import Transport, connect_tcp, connect_websocket
from .session import Host, RemotePublisher, Session, complete_handshake

SCHEMES = ("tcp", "tls", "ws", "wss")


MAX_PARKED = 1024
"""Subscriptions that may wait for a reconnect; more are refused with ConnectionLost."""


class Client:
    """An open connection to an rsnet server (see the module docstring).

    With ``reconnect``, a lost connection is re-established in the background (backing off
    up to ``max_reconnect_delay`` seconds between attempts): streams open on the lost
    connection end with ConnectionLost as always, but new subscriptions made meanwhile wait
    for the next connection and then proceed. Refused credentials end the reconnecting.
    """

    def __init__(
        self,
        session: Session,
        nursery: trio.Nursery,
        dial: Callable[[], Awaitable[tuple[Session, list[Any]]]] | None = None,
        max_reconnect_delay: float = 5.0,
    ) -> None:
        self.session = session
        self._nursery = nursery
        self._dial = dial
        self._max_delay = max_reconnect_delay
        self._parked: list[tuple[Subscriber[Any], str, Any]] = []
        self._closing = False
        self._gave_up: ConnectionLost | None = None

    @property
    def peer(self) -> str:
        return self.session.peer

    @property
    def closed(self) -> bool:
        return self.session.closed and self._dial is None

    def publisher(self, name: str, **params: Any) -> RemotePublisher:
        """The server's publisher ``name``; each ``subscribe`` opens a stream with ``params``."""
        return RemotePublisher(self, name, params or None)

    def subscribe(self, name: str, *, prefetch: int = DEFAULT_PREFETCH, **params: Any) -> PublisherIterator:
        """``async for item in conn.subscribe(name, **params)``: items of the server's
        publisher, ``prefetch`` at most in flight. A remote error is raised from the loop."""
        return iterate(self.publisher(name, **params), prefetch=prefetch)

    def open_inbound(self, subscriber: Subscriber[Any], name: str, params: Any) -> None:
        session = self.session
        waiting = self._dial is not None and not self._closing and self._gave_up is None
        if waiting and (session.closed or session.conn.state is not State.OPEN):
            if len(self._parked) < MAX_PARKED:
                self._parked.append((subscriber, name, params))
                return
        session.open_inbound(subscriber, name, params)

    async def offer(self, name: str, publisher: Publisher[Any], **params: Any) -> None:
        """Serve ``publisher`` to the server under ``name``; returns when it completed."""
        await self.session.offer(name, publisher, params or None)

    async def aclose(self) -> None:
        """Close the connection: open streams end (subscribers see ConnectionLost)."""
        self._closing = True
        self._release_parked(ConnectionLost("the client was closed"))
        session = self.session
        if session.stream_count:
            session.close(ErrorCode.GOING_AWAY, "the client closed the connection")
        else:
            session.go_away("the client is done")
        await session.wait_closed()

    async def supervise(self) -> None:
        """Reconnect whenever the session ends, until the client closes."""
        assert self._dial is not None
        while True:
            await self.session.wait_closed()
            delay = 0.05
            while not self._closing:
                try:
                    session, events = await self._dial()
                except HandshakeError as refused:
                    if refused.code in (ErrorCode.UNAUTHORIZED, ErrorCode.UNSUPPORTED_VERSION):
                        self._gave_up = refused
                        self._release_parked(refused)
                        return
                except (ConnectionLost, TransportClosed):
                    pass
                else:
                    self.session = session
                    self._nursery.start_soon(functools.partial(session.run, events=events))
                    parked, self._parked = self._parked, []
                    for subscriber, name, params in parked:
                        session.open_inbound(subscriber, name, params)
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
    """A transport to ``url`` (see :data:`SCHEMES`)."""
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme not in SCHEMES or not parsed.hostname or not parsed.port:
        raise ValueError(f"expected tcp://, tls://, ws:// or wss:// with host and port, got {url!r}")
    if parsed.scheme in ("ws", "wss"):
        return await connect_websocket(url, max_message_size=max_frame_size, ssl_context=ssl_context)
    if parsed.scheme == "tls" and ssl_context is None:
        ssl_context = ssl.create_default_context()
    return await connect_tcp(parsed.hostname, parsed.port, ssl_context if parsed.scheme == "tls" else None)


@asynccontextmanager
async def connect(
    url: str,
    *,
    token: str | bytes | None = None,
    ssl_context: ssl.SSLContext | None = None,
    host: Host | None = None,
    max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
    max_streams: int = DEFAULT_MAX_STREAMS,
    keepalive_interval_ms: int = DEFAULT_KEEPALIVE_INTERVAL,
    handshake_timeout: float = DEFAULT_HANDSHAKE_TIMEOUT / 1000,  # the protocol's default is in ms
    metadata: dict[str, Any] | None = None,
    reconnect: bool = False,
    max_reconnect_delay: float = 5.0,
) -> AsyncIterator[Client]:
    """Connect and handshake; the connection lives for the ``async with`` block.

    Raises :class:`~rsnet.errors.HandshakeError` (a :class:`ConnectionLost`) if the server
    refuses (bad token, no common version, shutting down) or does not answer in time, and
    :class:`~rsnet.transport.TransportClosed` if it cannot be reached. ``host`` serves
    publishers the server may subscribe to. ``reconnect``: see :class:`Client`.
    """

    async def dial() -> tuple[Session, list[Any]]:
        transport = None
        with trio.move_on_after(handshake_timeout):
            transport = await open_transport(url, ssl_context=ssl_context, max_frame_size=max_frame_size)
        if transport is None:
            raise HandshakeError(f"connecting to {url} timed out after {handshake_timeout:g} s", ErrorCode.TIMEOUT)
        conn = Connection(
            Role.CLIENT,
            max_frame_size=max_frame_size,
            max_streams=max_streams,
            keepalive_interval=keepalive_interval_ms,
            auth_token=token,
            metadata=metadata,
        )
        try:
            _, events = await complete_handshake(transport, conn, Welcome, handshake_timeout)
        except BaseException:
            await trio.aclose_forcefully(transport)  # type: ignore[arg-type]
            raise
        return Session(transport, conn, host=host), events

    session, events = await dial()
    with single_errors():  # ``except ConnectionLost`` around ``async with connect()`` works
        async with trio.open_nursery() as nursery:
            nursery.start_soon(lambda: session.run(events=events))
            client = Client(session, nursery, dial if reconnect else None, max_reconnect_delay)
            if reconnect:
                nursery.start_soon(client.supervise)
            try:
                yield client
            finally:
                with trio.CancelScope(shield=True):
                    await client.aclose()
                nursery.cancel_scope.cancel()  # the supervisor, if any


__all__ = ["Client", "ConnectionLost", "connect"]
