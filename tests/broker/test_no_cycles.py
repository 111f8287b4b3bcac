"""A closed connection's broker streams are freed by reference counting alone.

The server's sessions form no reference cycles (``tests/net/test_no_cycles.py``); a broker
subscription must not bring one back. Its reader and the session's stream hold each other
while the stream is open; once it ends, one of them must let go, or the session and
everything it holds wait for a full garbage collection, which a tuned server makes rare
(``rsnet.net.gc_tuning``). Attack round 6 found one: bursts of 30 connections x 1,024
subscriptions to missing topics grew the daemon's memory about 10 MB a burst.
"""

from __future__ import annotations

import gc
import pathlib
import weakref

import pytest
import trio

import rsnet
from rsnet.broker.broker import Broker
from rsnet.broker.client import publish
from rsnet.broker.topic import TopicReader

from .support import broker_serving


def readers_alive() -> int:
    return sum(isinstance(o, TopicReader) for o in gc.get_objects())


async def _subscriptions_of_every_kind(url: str, server: rsnet.Server, sessions: list[weakref.ref[object]]) -> None:
    """One connection that publishes, reads a few records, reads a range to its end, follows
    a pattern, waits for a missing topic, and is refused an offset retention removed; then
    closes with most of those subscriptions still open."""
    async with rsnet.connect(url) as conn:
        await publish(conn, "cycles.a", range(5), producer="p")
        sessions += [weakref.ref(session) for session in server.sessions]
        async with trio.open_nursery() as nursery:

            async def forever(name: str, params: dict) -> None:
                async for _ in conn.subscribe(name, params):
                    pass

            nursery.start_soon(forever, "cycles.missing", {})
            nursery.start_soon(forever, "cycles.>", {"from": "earliest"})
            nursery.start_soon(forever, "cycles.a", {"items": "stored"})
            async with conn.subscribe("cycles.a", {"from": "earliest"}) as items:
                assert (await anext(items))["value"] == 0  # then cancelled
            assert [r["value"] async for r in conn.subscribe("cycles.a", {"from": 1, "until": 3})] == [1, 2]
            await trio.sleep(0.05)
            nursery.cancel_scope.cancel()


@pytest.mark.parametrize("durable", [False, True], ids=["memory", "durable"])
async def test_closed_connections_broker_streams_are_freed_without_the_garbage_collector(
    collector_off, tmp_path: pathlib.Path, durable: bool
):
    broker = Broker(data_dir=tmp_path if durable else None)
    before = readers_alive()
    async with broker_serving(broker) as (url, server):
        sessions: list[weakref.ref[object]] = []
        for _ in range(5):
            await _subscriptions_of_every_kind(url, server, sessions)
            with trio.fail_after(10):
                while server.sessions:  # the server's handler finishes after the client closed
                    await trio.sleep(0.01)
        await trio.sleep(0.05)
        assert len(sessions) == 5
        assert [ref for ref in sessions if ref() is not None] == [], "kept alive by a reference cycle"
        assert readers_alive() == before
