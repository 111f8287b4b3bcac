"""The peer: rsocket-py (the ``rsocket`` package on PyPI), used the way its README and examples do.

- TCP: ``asyncio.start_server`` + ``TransportTCP``, ``RSocketClient`` over ``asyncio.open_connection``.
- WebSocket: its aiohttp transport (``websocket_handler_factory`` on an aiohttp server,
  ``websocket_client`` on the client); the package's other WebSocket transports need quart,
  websockets' asyncio API or Django channels.
- The stream is its idiomatic ``StreamFromGenerator``; the subscriber grants the same demand as
  rsnet's ``subscribe(prefetch=P)``: P up front, then ``P - P // 4`` each time that many were
  consumed. Stop-and-wait: request(1) per item. Round trip: ``request_response`` (rsocket's
  cheapest interaction; rsnet's equivalent is a stream of one item).

Payloads are the same ``size``-byte blobs; subscription parameters travel as JSON in the data
of the request payload.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from reactivestreams.subscriber import Subscriber
from reactivestreams.subscription import Subscription
from rsocket.helpers import create_future, single_transport_provider
from rsocket.payload import Payload
from rsocket.request_handler import BaseRequestHandler
from rsocket.rsocket_client import RSocketClient
from rsocket.rsocket_server import RSocketServer
from rsocket.streams.stream_from_generator import StreamFromGenerator
from rsocket.transports.tcp import TransportTCP

from .common import PACE_BATCH, Clock, Pacer, payload, raise_fd_limit


class Handler(BaseRequestHandler):
    async def request_stream(self, request: Payload) -> StreamFromGenerator:
        params = json.loads(request.data)
        count, data = params["count"], payload(params["size"])

        def generate():
            for i in range(count):
                yield Payload(data), i == count - 1

        return StreamFromGenerator(generate)

    async def request_response(self, request: Payload) -> asyncio.Future:
        return create_future(Payload(payload(json.loads(request.data)["size"])))


def serve(transport: str, ready: Any) -> None:
    async def main() -> None:
        raise_fd_limit()
        if transport == "tcp":

            def session(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
                RSocketServer(TransportTCP(reader, writer), handler_factory=Handler)

            server = await asyncio.start_server(session, "127.0.0.1", 0, backlog=4096)
            ready(server.sockets[0].getsockname()[1])
            async with server:
                await server.serve_forever()
        else:
            from aiohttp import web
            from rsocket.transports.aiohttp_websocket import websocket_handler_factory

            app = web.Application()
            app.add_routes([web.get("/", websocket_handler_factory(handler_factory=Handler))])
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0, backlog=4096)
            await site.start()
            ready(runner.addresses[0][1])
            await asyncio.Event().wait()

    asyncio.run(main())


class _Connection:
    """``async with _Connection(transport, port) as client``: an RSocketClient."""

    def __init__(self, transport: str, port: int) -> None:
        self.transport, self.port = transport, port

    async def __aenter__(self) -> RSocketClient:
        if self.transport == "tcp":
            reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
            self._context = RSocketClient(single_transport_provider(TransportTCP(reader, writer)))
        else:
            from rsocket.transports.aiohttp_websocket import websocket_client

            self._context = websocket_client(f"ws://127.0.0.1:{self.port}/")
        return await self._context.__aenter__()

    async def __aexit__(self, *exc: Any) -> None:
        await self._context.__aexit__(*exc)


class CountingSubscriber(Subscriber):
    """Counts items; grants demand like rsnet's ``iterate(prefetch=P)`` (``P`` 1: stop-and-wait).

    With ``pace`` it is a slow consumer: ``on_next`` only queues, and a consumer task takes
    items at most ``pace`` per second and requests more as it consumes, as an application
    bridging callbacks to asyncio would.
    """

    def __init__(self, prefetch: int, pace: float = 0) -> None:
        self.prefetch = prefetch
        self.refill = max(1, prefetch - prefetch // 4)
        self.count = 0
        self.unrequested = 0
        self.done = asyncio.get_running_loop().create_future()
        self.pace = pace
        self.queue: asyncio.Queue[int] = asyncio.Queue()
        self.subscription: Subscription | None = None

    def on_subscribe(self, subscription: Subscription) -> None:
        self.subscription = subscription
        if self.pace:
            self.consumer = asyncio.get_running_loop().create_task(self.consume())

    def on_next(self, value: Payload, is_complete: bool = False) -> None:
        if self.pace:
            self.queue.put_nowait(1)
            if is_complete:
                self.queue.put_nowait(0)
            return
        self.consumed()
        if is_complete:
            self.finish()

    def consumed(self) -> None:
        self.count += 1
        self.unrequested += 1
        if self.unrequested >= self.refill:
            self.unrequested = 0
            self.subscription.request(self.refill)

    async def consume(self) -> None:
        pacer = Pacer(self.pace)
        while await self.queue.get():
            self.consumed()
            if self.count % PACE_BATCH == 0:
                await asyncio.sleep(pacer.delay(self.count))
        self.finish()

    def on_error(self, exception: Exception) -> None:
        if not self.done.done():
            self.done.set_exception(exception)

    def on_complete(self) -> None:
        if self.pace:
            self.queue.put_nowait(0)  # the consumer finishes once it has taken every item
        else:
            self.finish()

    def finish(self) -> None:
        if not self.done.done():
            self.done.set_result(self.count)


def _request(count: int, size: int) -> Payload:
    return Payload(json.dumps({"count": count, "size": size}).encode())


async def _stream(client: RSocketClient, count: int, size: int, prefetch: int, pace: float = 0) -> int:
    subscriber = CountingSubscriber(prefetch, pace)
    client.request_stream(_request(count, size)).initial_request_n(prefetch).subscribe(subscriber)
    return await subscriber.done


async def client_main(kind: str, transport: str, port: int, params: dict[str, Any]) -> dict[str, Any]:
    size = params["size"]
    if kind == "many_connections":
        received = 0

        async def one() -> None:
            nonlocal received
            async with _Connection(transport, port) as client:
                count = await _stream(client, params["items"], size, params["prefetch"])
                received += count

        clock = Clock()
        await asyncio.gather(*(one() for _ in range(params["connections"])))
        return {"streams": params["connections"], "items": received, **clock.elapsed()}
    async with _Connection(transport, port) as client:
        if kind == "stream":
            clock = Clock()
            received = await _stream(client, params["count"], size, params["prefetch"], params.get("pace", 0))
            return {"items": received, **clock.elapsed()}
        if kind == "stop_and_wait":
            clock = Clock()
            received = await _stream(client, params["count"], size, 1)
            return {"items": received, **clock.elapsed()}
        if kind == "first_item":
            latencies = []
            request = _request(1, size)
            for _ in range(params["iterations"]):
                start = time.perf_counter()
                await client.request_response(request)
                latencies.append((time.perf_counter() - start) * 1e6)
            return {"latencies_us": latencies, "interaction": "request_response"}
        if kind == "many_streams":
            streams, items = params["streams"], params["items"]
            clock = Clock()
            counts = await asyncio.gather(*(_stream(client, items, size, params["prefetch"]) for _ in range(streams)))
            return {"streams": streams, "items": sum(counts), **clock.elapsed()}
    raise ValueError(f"unknown kind {kind!r}")


def run_client(kind: str, transport: str, port: int, params: dict[str, Any], deadline: float) -> dict[str, Any]:
    async def main() -> dict[str, Any]:
        raise_fd_limit()
        return await asyncio.wait_for(client_main(kind, transport, port, params), deadline)

    return asyncio.run(main())
