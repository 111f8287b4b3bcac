"""The Python TCK against rsnet across a real network connection.

RemotePublisher (the client's view of a server-hosted publisher) must pass the Publisher
rules over TCP and over WebSocket; the server-side subscriber that forwards a hosted
publisher's signals to the network must pass the blackbox and whitebox Subscriber rules. Real sockets mean
real time: the clock is not virtual here, and the timeouts allow for the loopback round trip.
"""

from __future__ import annotations

from contextlib import asynccontextmanager
from typing import Any

import trio

import rsnet
from rsnet.streams import Publisher, Subscriber
from rsnet.tck import PublisherVerification, SubscriberBlackboxVerification, SubscriberWhiteboxVerification

from .support import demo_server, running


class RemotePublisherVerification(PublisherVerification):
    virtual_time = False
    timeout_ms = 1000
    no_signals_timeout_ms = 50
    transport = "tcp"

    @asynccontextmanager
    async def environment(self):
        async with running(demo_server()) as urls, rsnet.connect(urls[self.transport]) as conn:
            self.conn = conn
            yield

    def create_publisher(self, elements):
        return self.conn.publisher("range", {"count": elements})

    def create_failed_publisher(self):
        return self.conn.publisher("no-such-publisher")  # rejected by the server: UNKNOWN_PUBLISHER


class TestRemotePublisherOverTcp(RemotePublisherVerification):
    transport = "tcp"


class TestRemotePublisherOverWebSocket(RemotePublisherVerification):
    transport = "ws"


class _Capture(Publisher[Any]):
    """A hosted publisher that hands the server-side subscriber to the test instead."""

    def __init__(self, subscribers: trio.MemorySendChannel) -> None:
        self._subscribers = subscribers

    def subscribe(self, subscriber: Subscriber[Any]) -> None:
        self._subscribers.send_nowait(subscriber)


@asynccontextmanager
async def server_side_forwarder(open_client_end):
    """Serve ``capture`` on a real server, let ``open_client_end(conn, nursery)`` subscribe
    to it from a client, and yield the server's forwarder for that stream."""
    send, receive = trio.open_memory_channel(1)
    server = rsnet.Server()
    server.add_publisher("capture", lambda params, ctx: _Capture(send))
    async with running(server) as urls, rsnet.connect(urls["tcp"]) as conn:
        async with trio.open_nursery() as nursery:
            open_client_end(conn, nursery)
            with trio.fail_after(5):
                forwarder = await receive.receive()
            yield forwarder
            nursery.cancel_scope.cancel()


class TestServerSideForwardingSubscriber(SubscriberBlackboxVerification):
    """The subscriber under test is the server's forwarder; behind it, the network and a
    client consuming with ``iterate`` (prefetch 16), which is where its demand comes from."""

    virtual_time = False
    timeout_ms = 1000
    no_signals_timeout_ms = 50

    @asynccontextmanager
    async def environment(self):
        def consume_from(conn, nursery):
            async def consume():
                try:
                    async for _ in conn.subscribe("capture", prefetch=16):
                        pass
                except rsnet.StreamError:
                    pass  # the TCK's on_error tests end the stream so

            nursery.start_soon(consume)

        async with server_side_forwarder(consume_from) as self.forwarder:
            yield

    def create_subscriber(self):
        return self.forwarder

    def create_element(self, element):
        return element


class _ClientEnd(Subscriber[Any]):
    """The far end of the forwarder: a client-side subscriber that requests only when told."""

    def __init__(self) -> None:
        self.subscription = None

    def on_subscribe(self, subscription) -> None:
        self.subscription = subscription

    def on_next(self, item: Any) -> None: ...

    def on_error(self, error: BaseException) -> None: ...

    def on_complete(self) -> None: ...


class _Probed(Subscriber[Any]):
    """The forwarder under test, reporting what it received to the TCK's probe. Demand and
    cancel come from the client's end, across the network: that is what is under test."""

    def __init__(self, forwarder: Subscriber[Any], client_end: _ClientEnd, probe) -> None:
        self._forwarder, self._client_end, self._probe = forwarder, client_end, probe

    def on_subscribe(self, subscription) -> None:
        self._forwarder.on_subscribe(subscription)
        client_end = self._client_end

        class Puppet:
            def trigger_request(self, elements: int) -> None:
                client_end.subscription.request(elements)

            def signal_cancel(self) -> None:
                client_end.subscription.cancel()

        self._probe.register_on_subscribe(Puppet())

    def on_next(self, item: Any) -> None:
        self._forwarder.on_next(item)
        self._probe.register_on_next(item)

    def on_error(self, error: BaseException) -> None:
        self._forwarder.on_error(error)
        self._probe.register_on_error(error)

    def on_complete(self) -> None:
        self._forwarder.on_complete()
        self._probe.register_on_complete()


class TestServerSideForwardingSubscriberWhitebox(SubscriberWhiteboxVerification):
    virtual_time = False
    timeout_ms = 1000
    no_signals_timeout_ms = 50

    @asynccontextmanager
    async def environment(self):
        self.client_end = _ClientEnd()
        async with server_side_forwarder(
            lambda conn, nursery: conn.publisher("capture").subscribe(self.client_end)
        ) as self.forwarder:
            yield

    def create_subscriber(self, probe):
        return _Probed(self.forwarder, self.client_end, probe)

    def create_element(self, element):
        return element


class RemoteFailedPublisherVerification(RemotePublisherVerification):
    """The failed publisher is a hosted one that fails, not a rejected SUBSCRIBE: the demo's
    ``fail`` with ``n=0`` (``concat(range_(0, 0), error(...))``) is accepted and must then send
    its ERROR without waiting for a REQUEST (rules 1.4, 1.9), as the Java TCK's
    ``createFailedPublisher`` tests require of a remote publisher (issue 10, finding 8)."""

    def create_failed_publisher(self):
        return self.conn.publisher("fail", {"n": 0})


class TestRemoteFailedPublisherOverTcp(RemoteFailedPublisherVerification):
    transport = "tcp"


class TestRemoteFailedPublisherOverWebSocket(RemoteFailedPublisherVerification):
    transport = "ws"
