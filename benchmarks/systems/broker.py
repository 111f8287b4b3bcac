"""Scenario 5, broker fan-out: one producer, 1, 10 and 100 subscribers, deliveries/s (issue 6).

The server is rsnet's broker (:class:`rsnet.broker.broker.Broker`) behind ``rsnet.Server(host=broker)``,
as ``rsnet broker`` runs it: ``serve(transport, ready, storage, fsync)`` with ``storage``
``"memory"`` (every topic in memory) or ``"durable"`` (segment logs in a fresh directory under
``$RSNET_BENCH_SCRATCH``, which the runner creates and removes) and ``fsync`` one of
:class:`~rsnet.broker.storage.FsyncPolicy`'s values (``always``: every append is fsynced before
it is acknowledged or shown to subscribers; ``interval``: every 100 ms, the broker's default;
``never``: the OS decides). Topics use the broker's defaults (backpressure, max lag 10,000).

The client (kind ``fanout``, parameters ``subscribers``, ``count``, ``size``, ``prefetch``)
opens ``subscribers`` connections, one subscriber each, subscribing to a fresh topic with
``from="earliest"`` and ``prefetch``; it waits until the broker lists every subscription
(``$topics``), so set-up is not timed. Then the clock starts, and one producer on its own
connection ``publish``-es ``count`` records of ``size`` bytes (``conn.offer`` under the hood,
with acknowledgements on ``$acks``). The clock stops when the last subscriber has received its
last record; deliveries/s = ``count`` x ``subscribers`` / that time. Every subscriber checks
that it got every offset, in order, exactly once. Producer and subscribers share one client
process, as the server's work (one write per subscriber per record) is the thing measured.
"""

from __future__ import annotations

import contextlib
import importlib.util
import itertools
import os
import time
from typing import Any

import trio

from .common import Clock, payload, raise_fd_limit

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


def make_broker(storage: str, fsync: str | None) -> Any:
    from rsnet.broker.broker import Broker
    from rsnet.broker.storage import FsyncPolicy

    if storage == "memory":
        return Broker()
    if storage != "durable":
        raise ValueError(f"unknown storage {storage!r}")
    scratch = os.environ.get("RSNET_BENCH_SCRATCH")
    if not scratch:
        raise RuntimeError("a durable broker needs $RSNET_BENCH_SCRATCH (the runner sets it)")
    return Broker(data_dir=os.path.join(scratch, "broker"), fsync=FsyncPolicy(fsync or "always"))


def serve(transport: str, ready: Any, storage: str = "memory", fsync: str | None = None) -> None:
    import rsnet  # here, not at the top: the suite imports this module to ask unavailable()

    async def main() -> None:
        raise_fd_limit()
        broker = make_broker(storage, fsync)
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

    subscribers, count, size, prefetch = params["subscribers"], params["count"], params["size"], params["prefetch"]
    finished: list[float] = []
    received = 0

    async def subscriber(conn: Any, task_status: Any) -> None:
        nonlocal received
        expected = 0
        async with conn.subscribe(TOPIC, {"from": "earliest"}, prefetch=prefetch) as records:
            task_status.started()
            async for record in records:
                if record["offset"] != expected:
                    raise RuntimeError(f"subscriber got offset {record['offset']}, expected {expected}")
                expected += 1
                if expected == count:
                    break
        if expected != count:
            raise RuntimeError(f"subscription ended after {expected} of {count} records")
        finished.append(time.perf_counter())
        received += expected

    async with contextlib.AsyncExitStack() as stack:
        conns = [await stack.enter_async_context(rsnet.connect(address)) for _ in range(subscribers)]
        producer = await stack.enter_async_context(rsnet.connect(address))
        await publish(producer, TOPIC, [])  # only publishing creates a topic; subscribing waits
        async with trio.open_nursery() as nursery:
            for conn in conns:
                await nursery.start(subscriber, conn)
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


def run_client(kind: str, transport: str, port: int, params: dict[str, Any], deadline: float) -> dict[str, Any]:
    if kind != "fanout":
        raise ValueError(f"unknown kind {kind!r}")

    async def main() -> dict[str, Any]:
        raise_fd_limit()
        with trio.fail_after(deadline):
            return await fanout(url(transport, port), params)

    return trio.run(main)
