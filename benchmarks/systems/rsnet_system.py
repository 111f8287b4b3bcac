"""rsnet, used as its README shows: ``rsnet.Server`` hosting ``items`` (``from_iterable`` over
repeated payloads), ``rsnet.connect`` and ``conn.subscribe(..., prefetch=P)`` on the client. The
server process tunes Python's garbage collector after start-up as ``rsnet serve`` does
(:func:`rsnet.net.gc_tuning.tune_for_serving`); the clients keep CPython's defaults.

Stop-and-wait uses a true Reactive Streams subscriber on ``conn.publisher(...)`` that requests 1
in ``on_subscribe`` and 1 per ``on_next``; the round trip is ``subscribe(count=1)`` up to its
first item (rsnet has no separate request-response interaction). Slow consumers sleep inside
``async for``, so demand is replenished only as fast as they consume.
"""

from __future__ import annotations

import itertools
import time
from typing import Any

import trio

import rsnet
from rsnet.client_rules import Refill
from rsnet.net.gc_tuning import tune_for_serving

from .common import LIVE_CONCURRENCY, PACE_BATCH, Clock, LiveCount, Pacer, payload, raise_fd_limit


def make_server() -> rsnet.Server:
    server = rsnet.Server()

    @server.publisher("items")
    def items(params: dict[str, Any], ctx: Any) -> Any:
        return rsnet.from_iterable(itertools.repeat(payload(params["size"]), params["count"]))

    return server


def serve(transport: str, ready: Any) -> None:
    server = make_server()
    tune_for_serving()  # as ``rsnet serve`` does, and the Server's documentation advises

    async def main() -> None:
        raise_fd_limit()
        async with trio.open_nursery() as nursery:
            serve_on = server.serve_tcp if transport == "tcp" else server.serve_websocket
            ready(await nursery.start(serve_on, "127.0.0.1", 0))

    trio.run(main)


def url(transport: str, port: int) -> str:
    return f"tcp://127.0.0.1:{port}" if transport == "tcp" else f"ws://127.0.0.1:{port}/"


class Counting(rsnet.Subscriber):
    """Counts items; ``done`` is set when the stream ends, ``error`` says how."""

    def __init__(self) -> None:
        self.count = 0
        self.done = trio.Event()
        self.error: BaseException | None = None

    def on_error(self, error: BaseException) -> None:
        self.error = error
        self.done.set()

    def on_complete(self) -> None:
        self.done.set()


class StopAndWait(Counting):
    """request(1) in ``on_subscribe`` and after every item."""

    def on_subscribe(self, subscription: Any) -> None:
        self.subscription = subscription
        subscription.request(1)

    def on_next(self, item: Any) -> None:
        self.count += 1
        self.subscription.request(1)


class Prefetching(Counting):
    """The iterator's fixed rule (:class:`rsnet.client_rules.Refill`) done by hand, as a user
    of the Subscriber API writes it: ``prefetch`` in ``on_subscribe``, then a batch each time
    a batch of items arrived (a counter in ``on_next``, not a call per item)."""

    def __init__(self, prefetch: int) -> None:
        super().__init__()
        self.prefetch = prefetch
        self.batch = Refill(prefetch).batch
        self.since = 0

    def on_subscribe(self, subscription: Any) -> None:
        self.subscription = subscription
        subscription.request(self.prefetch)

    def on_next(self, item: Any) -> None:
        self.count += 1
        self.since += 1
        if self.since == self.batch:
            self.since = 0
            self.subscription.request(self.batch)


async def receive(conn: Any, subscriber: Counting, count: int, size: int) -> int:
    """``subscriber`` on ``items``; its item count once the stream completed (or its error)."""
    conn.publisher("items", {"count": count, "size": size}).subscribe(subscriber)
    await subscriber.done.wait()
    if subscriber.error is not None:
        raise subscriber.error
    return subscriber.count


async def consume(conn: Any, count: int, size: int, prefetch: int | None, pace: float = 0) -> int:
    """Take a stream of ``count`` items; ``prefetch`` None: rsnet's default (the argument not given)."""
    received = 0
    demand = {} if prefetch is None else {"prefetch": prefetch}
    if pace:
        pacer = Pacer(pace)
        async for _ in conn.subscribe("items", {"count": count, "size": size}, **demand):
            received += 1
            if received % PACE_BATCH == 0:
                await trio.sleep(pacer.delay(received))
    else:
        async for _ in conn.subscribe("items", {"count": count, "size": size}, **demand):
            received += 1
    return received


async def live_connections(address: str, params: dict[str, Any]) -> dict[str, Any]:
    """``connections`` connections, each subscribed with demand 1: once every one has its first
    item (its stream open on the server, waiting for demand), the server's memory is read; then
    each takes the rest of its ``items`` and closes."""
    live = LiveCount(params)
    handshakes = trio.Semaphore(LIVE_CONCURRENCY)
    received = 0

    async def one() -> None:
        nonlocal received
        waiting = True
        await handshakes.acquire()
        try:
            async with rsnet.connect(address) as conn:
                stream = conn.subscribe("items", {"count": params["items"], "size": params["size"]}, prefetch=1)
                async with stream:
                    async for _ in stream:
                        received += 1
                        if waiting:
                            waiting = False
                            handshakes.release()
                            live.first_item()
                            await live.everyone.wait()
        except (rsnet.RsnetError, OSError) as error:  # counted and reported, not fatal to the others
            live.failed_connection(f"{type(error).__name__}: {error}", served=not waiting)
        finally:
            if waiting:
                handshakes.release()

    with trio.move_on_after(live.give_up_s) as giving_up:
        async with trio.open_nursery() as nursery:
            for _ in range(params["connections"]):
                nursery.start_soon(one)
    if giving_up.cancelled_caught:
        live.gave_up()
    return live.report(received)


async def client(kind: str, transport: str, port: int, params: dict[str, Any]) -> dict[str, Any]:
    size, address = params["size"], url(transport, port)
    if kind == "live_connections":
        return await live_connections(address, params)
    if kind == "many_connections":
        received = 0

        async def one() -> None:
            nonlocal received
            async with rsnet.connect(address) as conn:
                count = await consume(conn, params["items"], size, params["prefetch"])
                received += count

        clock = Clock()
        async with trio.open_nursery() as nursery:
            for _ in range(params["connections"]):
                nursery.start_soon(one)
        return {"streams": params["connections"], "items": received, **clock.elapsed()}
    async with rsnet.connect(address) as conn:
        if kind == "stream":

            async def read(count: int) -> int:
                if params.get("api") == "subscriber":
                    return await receive(conn, Prefetching(params["prefetch"]), count, size)
                return await consume(conn, count, size, params["prefetch"], params.get("pace", 0))

            # A stream read the same way first, not timed; the server's CPU covers it too.
            warmed = await read(params["warmup"]) if params.get("warmup") else 0
            clock = Clock()
            received = await read(params["count"])
            return {"items": received, "warmup_items": warmed, **clock.elapsed()}
        if kind == "stop_and_wait":
            clock = Clock()
            received = await receive(conn, StopAndWait(), params["count"], size)
            return {"items": received, **clock.elapsed()}
        if kind == "first_item":
            latencies = []
            for _ in range(params["iterations"]):
                start = time.perf_counter()
                first = None
                async for _ in conn.subscribe("items", {"count": 1, "size": size}, prefetch=1):
                    if first is None:
                        first = time.perf_counter()
                latencies.append((first - start) * 1e6)
            return {"latencies_us": latencies}
        if kind == "many_streams":
            streams, received = params["streams"], 0

            async def one() -> None:
                nonlocal received
                count = await consume(conn, params["items"], size, params["prefetch"])
                received += count

            clock = Clock()
            async with trio.open_nursery() as nursery:
                for _ in range(streams):
                    nursery.start_soon(one)
            return {"streams": streams, "items": received, **clock.elapsed()}
    raise ValueError(f"unknown kind {kind!r}")


def run_client(kind: str, transport: str, port: int, params: dict[str, Any], deadline: float) -> dict[str, Any]:
    async def main() -> dict[str, Any]:
        raise_fd_limit()
        with trio.fail_after(deadline):
            return await client(kind, transport, port, {**params, "deadline": deadline})

    return trio.run(main)
