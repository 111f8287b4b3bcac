"""Scenario 5, broker fan-out: one producer, 1, 10 and 100 subscribers, deliveries/s (issue 6).

The server is rsnet's broker (:class:`rsnet.broker.broker.Broker`) behind ``rsnet.Server(host=broker)``,
as ``rsnet broker`` runs it: ``serve(transport, ready, storage, fsync, fsync_interval)`` with ``storage``
``"memory"`` (every topic in memory) or ``"durable"`` (segment logs in a fresh directory under
``$RSNET_BENCH_SCRATCH``, which the runner creates and removes) and ``fsync`` one of
:class:`~rsnet.broker.storage.FsyncPolicy`'s values (``always``: every append is fsynced before
it is acknowledged or shown to subscribers; ``interval``: every ``fsync_interval`` seconds,
default 0.1, the broker's default; ``never``: the OS decides). Topics use the broker's defaults (backpressure, max lag 10,000).

The client (kind ``fanout``, parameters ``subscribers``, ``connections``, ``count``, ``size``,
``prefetch``, ``items``: the shape asked for, default the maps, and ``api``: ``"iterator"``,
each subscriber an ``async for`` in its own task, or ``"subscriber"``, each a Reactive Streams
Subscriber requesting with the prefetch rule by hand, no task) opens ``connections``
connections (default: one per subscriber) and spreads the ``subscribers`` over them
round-robin, each subscribing to a fresh topic with ``from="earliest"``, ``items`` and
``prefetch``; it waits until the broker lists every subscription
(``$topics``), so set-up is not timed. Then the clock starts, and one producer on its own
connection ``publish``-es ``count`` records of ``size`` bytes (``conn.offer`` under the hood,
with acknowledgements on ``$acks``). The clock stops when the last subscriber has received its
last record; deliveries/s = ``count`` x ``subscribers`` / that time. Every subscriber checks
that it got every offset, in order, exactly once. Producer and subscribers share one client
process, as the server's work (one write per subscriber per record) is the thing measured.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import itertools
import os
import time
from typing import Any

import trio

from .common import Clock, latency_payload, latency_us, payload, raise_fd_limit, scheduled_time

READY = True
"""True once this module measures the broker (see the module docstring)."""

SUBSCRIBERS = (1, 10, 100)
STORAGE = (
    ("memory", None, "in-memory topic"),
    ("durable", "always", "durable topic, fsync always (every append)"),
    ("durable", "interval", "durable topic, fsync interval (100 ms)"),
    ("durable", "never", "durable topic, fsync never"),
)
"""(storage, fsync policy, title) of each group of rows."""

TOPIC = "bench.fanout"


def planned_rows() -> list[str]:
    """The titles of scenario 5's row groups (shown when it cannot run)."""
    return [f"1 producer to {'/'.join(map(str, SUBSCRIBERS))} subscribers, {title}" for _, _, title in STORAGE]


def unavailable() -> str | None:
    """Why scenario 5 cannot run now, or None when it can."""
    try:
        found = importlib.util.find_spec("rsnet.broker") is not None
    except ImportError:
        found = False
    if not found:
        return "rsnet.broker does not exist yet (issue 5)"
    if not READY:
        return "rsnet.broker exists, but benchmarks/systems/broker.py has no fan-out client for it yet"
    return None


# -- server ---------------------------------------------------------------------------------------


def make_broker(storage: str, fsync: str | None, fsync_interval: float = 0.1) -> Any:
    from rsnet.broker.broker import Broker
    from rsnet.broker.storage import FsyncPolicy

    if storage == "memory":
        return Broker()
    if storage != "durable":
        raise ValueError(f"unknown storage {storage!r}")
    scratch = os.environ.get("RSNET_BENCH_SCRATCH")
    if not scratch:
        raise RuntimeError("a durable broker needs $RSNET_BENCH_SCRATCH (the runner sets it)")
    return Broker(
        data_dir=os.path.join(scratch, "broker"), fsync=FsyncPolicy(fsync or "always"), fsync_interval=fsync_interval
    )


def serve(
    transport: str, ready: Any, storage: str = "memory", fsync: str | None = None, fsync_interval: float = 0.1
) -> None:
    import rsnet  # here, not at the top: the suite imports this module to ask unavailable()
    from rsnet.net.gc_tuning import tune_for_serving

    async def main() -> None:
        raise_fd_limit()
        tune_for_serving()  # as ``rsnet broker`` does
        broker = make_broker(storage, fsync, fsync_interval)
        server = rsnet.Server(host=broker)
        async with trio.open_nursery() as nursery:
            await nursery.start(broker.run)
            serve_on = server.serve_tcp if transport == "tcp" else server.serve_websocket
            ready(await nursery.start(serve_on, "127.0.0.1", 0))

    trio.run(main)


# -- client ---------------------------------------------------------------------------------------


def url(transport: str, port: int) -> str:
    return f"tcp://127.0.0.1:{port}" if transport == "tcp" else f"ws://127.0.0.1:{port}/"


async def subscriber_count(conn: Any, topic: str) -> int:
    """How many subscriptions the broker lists on ``topic`` (``$topics``)."""
    async for entry in conn.subscribe("$topics"):
        if entry["topic"] == topic:
            return len(entry["subscribers"])
    return 0


async def fanout(address: str, params: dict[str, Any]) -> dict[str, Any]:
    import rsnet
    from rsnet.broker.client import publish

    subscribers, count, size = params["subscribers"], params["count"], params["size"]
    connections = params.get("connections", subscribers)
    shape = params.get("items", "maps")
    key = 0 if shape == "arrays" else "offset"  # where a record holds its offset
    finished: list[float] = []
    received = 0

    def out_of_order(record: Any, expected: int) -> RuntimeError:
        return RuntimeError(f"subscriber got offset {record[key]}, expected {expected}")

    def check_all(expected: int) -> None:
        nonlocal received
        if expected != count:
            raise RuntimeError(f"subscription ended after {expected} of {count} records")
        finished.append(time.perf_counter())
        received += expected

    async def iterating(conn: Any, task_status: Any) -> None:
        expected = 0
        async with conn.subscribe(TOPIC, {"from": "earliest", "items": shape}, **_prefetch(params)) as records:
            task_status.started()
            async for record in records:
                if record[key] != expected:
                    raise out_of_order(record, expected)
                expected += 1
                if expected == count:
                    break
        check_all(expected)

    async def plain(conn: Any, task_status: Any) -> None:
        from .rsnet_system import Prefetching

        class Ordered(Prefetching):
            """Checks each record's offset; cancels after the last one."""

            def on_next(self, record: Any) -> None:
                if record[key] != self.count:
                    self.subscription.cancel()
                    self.on_error(out_of_order(record, self.count))
                    return
                super().on_next(record)
                if self.count == count:
                    self.subscription.cancel()
                    self.done.set()

        ordered = Ordered(params["prefetch"])
        conn.publisher(TOPIC, {"from": "earliest", "items": shape}).subscribe(ordered)
        task_status.started()
        await ordered.done.wait()
        if ordered.error is not None:
            raise ordered.error
        check_all(ordered.count)

    subscriber = plain if params.get("api") == "subscriber" else iterating

    async with contextlib.AsyncExitStack() as stack:
        conns = [await stack.enter_async_context(rsnet.connect(address)) for _ in range(connections)]
        producer = await stack.enter_async_context(rsnet.connect(address))
        await publish(producer, TOPIC, [])  # only publishing creates a topic; subscribing waits
        async with trio.open_nursery() as nursery:
            for index in range(subscribers):
                await nursery.start(subscriber, conns[index % connections])
            # Every SUBSCRIBE is sent; wait until the broker has them all, so none starts late.
            while await subscriber_count(producer, TOPIC) < subscribers:
                await trio.sleep(0.005)
            clock = Clock()
            published = await publish(producer, TOPIC, itertools.repeat(payload(size), count), producer="bench")
            publish_s = time.perf_counter() - clock.wall
        elapsed = clock.elapsed()
    elapsed["seconds"] = max(finished) - clock.wall
    return {
        "subscribers": subscribers,
        "published": published,
        "items": received,
        "publish_s": publish_s,
        **elapsed,
    }


async def publish_acked(address: str, params: dict[str, Any]) -> dict[str, Any]:
    """Kind ``publish``: one producer publishes ``count`` records and waits for every acknowledgement."""
    import rsnet
    from rsnet.broker.client import publish

    async with rsnet.connect(address) as producer:
        clock = Clock()
        sent = await publish(
            producer, TOPIC, itertools.repeat(payload(params["size"]), params["count"]), producer="bench"
        )
        return {"items": sent, "published": sent, **clock.elapsed()}


async def replay(address: str, params: dict[str, Any]) -> dict[str, Any]:
    """Kind ``replay``: ``count`` records are stored first (acknowledged publish, not timed), then
    one subscriber reads them all from the earliest offset."""
    import rsnet
    from rsnet.broker.client import publish

    count = params["count"]
    async with rsnet.connect(address) as conn:
        await publish(conn, TOPIC, itertools.repeat(payload(params["size"]), count), producer="fill")
        clock = Clock()
        expected = 0
        async with conn.subscribe(TOPIC, {"from": "earliest"}, **_prefetch(params)) as records:
            async for record in records:
                if record["offset"] != expected:
                    raise RuntimeError(f"replay got offset {record['offset']}, expected {expected}")
                expected += 1
                if expected == count:
                    break
        return {"items": expected, **clock.elapsed()}


async def latency(address: str, params: dict[str, Any]) -> dict[str, Any]:
    """Kind ``latency``: one producer publishes at ``rate`` records/s for ``seconds``, each record
    stamped with the time it was due (see :func:`.common.latency_payload`); one subscriber (own
    connection, from the earliest offset) records arrival minus that time."""
    import rsnet
    from rsnet.broker.client import publish

    rate, size = params["rate"], params["size"]
    count = max(1, int(rate * params["seconds"]))
    latencies: list[float] = []

    async def paced() -> Any:
        start = time.perf_counter_ns()
        sent = 0
        while sent < count:
            wait = (scheduled_time(start, sent, rate) - time.perf_counter_ns()) / 1e9
            if wait > 0:
                await trio.sleep(wait)
            now = time.perf_counter_ns()
            # Every record whose time has come, stamped with the time it was due (a producer
            # held back by backpressure counts its wait: no coordinated omission).
            while sent < count and (due := scheduled_time(start, sent, rate)) <= now:
                yield latency_payload(due, size)
                sent += 1

    async with rsnet.connect(address) as sub_conn, rsnet.connect(address) as producer:
        await publish(producer, TOPIC, [])  # only publishing creates a topic
        async with sub_conn.subscribe(TOPIC, {"from": "earliest"}, **_prefetch(params)) as records:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(functools.partial(publish, producer, TOPIC, paced(), producer="bench"))
                clock = Clock()
                async for record in records:
                    latencies.append(latency_us(record["value"]))
                    if record["offset"] != len(latencies) - 1:
                        raise RuntimeError(f"got offset {record['offset']}, expected {len(latencies) - 1}")
                    if len(latencies) == count:
                        break
                elapsed = clock.elapsed()
    return {"items": len(latencies), "rate": rate, "latencies_us": latencies, **elapsed}


def _prefetch(params: dict[str, Any]) -> dict[str, int]:
    """``prefetch`` if the row sets one; otherwise rsnet's default, as an application gets it."""
    return {"prefetch": params["prefetch"]} if params.get("prefetch") else {}


KINDS = {"fanout": fanout, "publish": publish_acked, "replay": replay, "latency": latency}


def run_client(kind: str, transport: str, port: int, params: dict[str, Any], deadline: float) -> dict[str, Any]:
    if kind not in KINDS:
        raise ValueError(f"unknown kind {kind!r}")

    async def main() -> dict[str, Any]:
        raise_fd_limit()
        with trio.fail_after(deadline):
            return await KINDS[kind](url(transport, port), params)

    return trio.run(main)
