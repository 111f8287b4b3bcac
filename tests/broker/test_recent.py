"""Recent records encoded once (rsnet.broker.recent): subscribers at a topic's head share the
bytes of each record's item, and what they get is exactly what storage holds at that offset."""

from __future__ import annotations

import errno
import pathlib
from typing import Any

import msgpack
import pytest
import trio

import rsnet
from rsnet.broker.broker import Broker
from rsnet.broker.client import publish
from rsnet.broker.codes import BrokerCode
from rsnet.broker.recent import RECENT_TOPIC_BYTES, RecentBudget, RecentItems
from rsnet.broker.storage import FsyncPolicy, MemoryLog
from rsnet.broker.topic import Topic, TopicReader
from rsnet.protocol import Encoded
from rsnet.streams import Subscriber, Subscription

from .storage_faults import FaultyFiles
from .support import broker_running


async def follow(conn: rsnet.Client, topic: str, count: int, into: list[dict[str, Any]], *, task_status) -> None:
    async with conn.subscribe(topic, {"from": "latest"}, prefetch=64) as items:
        task_status.started()
        async for record in items:
            into.append(record)
            if len(into) == count:
                return


async def test_subscribers_at_the_head_get_what_a_reader_from_storage_gets(tmp_path: pathlib.Path) -> None:
    broker = Broker(data_dir=tmp_path)
    async with broker_running(broker) as url, rsnet.connect(url) as a, rsnet.connect(url) as b:
        await publish(a, "t", ["first"])
        live: list[list[dict[str, Any]]] = [[], [], []]
        async with trio.open_nursery() as nursery:
            for index, conn in enumerate((a, b, b)):
                await nursery.start(follow, conn, "t", 300, live[index])
            values = [{"n": i, "text": "é" * (i % 5), "blob": bytes([i % 256])} for i in range(300)]
            await publish(a, "t", values[:150], producer="p")
            assert broker.topics["t"].recent.items  # the head is held encoded while readers are live
            await publish(a, "t", values[150:], producer="p", first_sequence=150)
        stored = []
        async with a.subscribe("t", {"from": 1}) as items:
            async for record in items:
                stored.append(record)
                if len(stored) == 300:
                    break
    assert [r["value"] for r in stored] == values
    assert live == [stored, stored, stored]  # same offsets, timestamps, values, key for key


async def test_subscribers_of_the_arrays_shape_at_the_head_share_its_bytes(tmp_path: pathlib.Path) -> None:
    broker = Broker(data_dir=tmp_path)
    async with broker_running(broker) as url, rsnet.connect(url) as a, rsnet.connect(url) as b:
        await publish(a, "t", ["first"])
        live: list[list[Any]] = [[], []]

        async def arrays(conn: rsnet.Client, into: list[Any], *, task_status) -> None:
            async with conn.subscribe("t", {"from": "latest", "items": "arrays"}, prefetch=64) as items:
                task_status.started()
                async for record in items:
                    into.append(record)
                    if len(into) == 200:
                        return

        async with trio.open_nursery() as nursery:
            for index, conn in enumerate((a, b)):
                await nursery.start(arrays, conn, live[index])
            values = [{"n": i, "blob": bytes([i % 256])} for i in range(200)]
            await publish(a, "t", values[:100], producer="p")
            held = broker.topics["t"].recent
            assert held.arrays and held.get_arrays(held.end - 1, 1)  # encoded once for both
            await publish(a, "t", values[100:], producer="p", first_sequence=100)
        stored = []
        async with a.subscribe("t", {"from": 1, "items": "arrays"}) as items:  # from storage
            async for record in items:
                stored.append(record)
                if len(stored) == 200:
                    break
    assert [r[2] for r in stored] == values
    assert live == [stored, stored]


async def test_offsets_given_again_after_a_failed_sync_reach_live_subscribers_with_the_new_records(
    tmp_path: pathlib.Path,
) -> None:
    """Under ``interval``, records appended but not yet synced are held encoded; when the sync
    fails their offsets go to the next records, and a subscriber at the head must get those."""
    faults = FaultyFiles()
    broker = Broker(data_dir=tmp_path, fsync=FsyncPolicy.INTERVAL, fsync_interval=0.05)
    broker.storage_files = faults
    async with broker_running(broker) as url, rsnet.connect(url) as conn, rsnet.connect(url) as producer:
        await publish(producer, "t", list(range(10)), producer="p")
        live: list[dict[str, Any]] = []
        async with trio.open_nursery() as nursery:
            await nursery.start(follow, conn, "t", 5, live)
            faults.fail("datasync", errno.EIO, under=tmp_path / "t", times=1)
            with pytest.raises(rsnet.StreamError) as refused:
                await publish(producer, "t", ["lost"] * 5, producer="p", first_sequence=10)
            assert refused.value.code == BrokerCode.STORAGE_ERROR
            await publish(producer, "t", [f"kept {i}" for i in range(5)], producer="q")
    assert [(r["offset"], r["value"]) for r in live] == [(10 + i, f"kept {i}") for i in range(5)]


class Collect(Subscriber[Any]):
    def __init__(self) -> None:
        self.items: list[Any] = []

    def on_subscribe(self, subscription: Subscription) -> None:
        subscription.request(100)

    def on_next(self, item: Any) -> None:
        self.items.append(item)

    def on_error(self, error: BaseException) -> None:
        raise AssertionError(error)

    def on_complete(self) -> None:
        raise AssertionError("a topic never completes")


def test_a_subscriber_that_does_not_take_encoded_items_gets_maps() -> None:
    topic = Topic("t", MemoryLog())
    TopicReader(Collect()).add_topic(topic, 0)  # a reader that requested nothing yet
    topic.log.append(["x", "y"], timestamp_ms=5)
    topic.recent.add(5, [(0, "x"), (1, "y")])
    plain = Collect()
    reader = TopicReader(plain)
    plain.on_subscribe(reader)
    reader.add_topic(topic, 0)
    assert plain.items == [
        {"topic": "t", "offset": 0, "timestamp": 5, "value": "x"},
        {"topic": "t", "offset": 1, "timestamp": 5, "value": "y"},
    ]
    assert all(type(item) is dict for item in plain.items)


def test_held_items_are_the_item_maps_encoded_and_stay_contiguous() -> None:
    recent = RecentItems("t", RecentBudget())
    recent.add(7, [(3, "a"), (4, {"k": 1})])
    assert recent.first == 3 and recent.end == 5
    assert [msgpack.unpackb(item) for item in recent.get(3, 10)] == [
        {"topic": "t", "offset": 3, "timestamp": 7, "value": "a"},
        {"topic": "t", "offset": 4, "timestamp": 7, "value": {"k": 1}},
    ]
    assert all(type(item) is Encoded for item in recent.get(3, 10))
    assert recent.get(2, 1) == [] and recent.get(5, 1) == []
    recent.add(8, [(9, "b")])  # not following on: replaces what was held
    assert (recent.first, recent.end) == (9, 10)
    recent.trim(10)
    assert recent.items == [] and recent.size == 0


def test_the_arrays_shape_is_held_only_while_asked_for_and_counted_in_the_budget() -> None:
    budget = RecentBudget()
    recent = RecentItems("t", budget)
    recent.add(7, [(0, "a"), (1, "b")])  # nobody reads arrays yet
    assert recent.get_arrays(0, 10) == []
    recent.add(8, [(2, "c"), (3, {"k": 1})], arrays=True)  # from here on, both shapes
    assert [msgpack.unpackb(item) for item in recent.get_arrays(0, 10)] == []  # 0 and 1: maps only
    assert [msgpack.unpackb(item) for item in recent.get_arrays(2, 10)] == [[2, 8, "c"], [3, 8, {"k": 1}]]
    assert [msgpack.unpackb(item) for item in recent.get_arrays(3, 1)] == [[3, 8, {"k": 1}]]
    assert all(type(item) is Encoded for item in recent.get_arrays(2, 10))
    both = sum(map(len, recent.items)) + sum(map(len, recent.arrays))
    assert recent.size == both and budget.available == budget.limit - both
    recent.trim(3)  # the oldest go in both shapes, each shape's bytes given back
    assert (recent.first, len(recent.arrays)) == (3, 1)
    assert recent.size == len(recent.items[0]) + len(recent.arrays[0]) == budget.limit - budget.available
    recent.add(9, [(4, "d")])  # the last arrays reader left: that shape is let go
    assert recent.arrays == [] and recent.get_arrays(3, 10) == []
    assert recent.size == sum(map(len, recent.items)) == budget.limit - budget.available
    recent.clear()
    assert budget.available == budget.limit


def test_making_room_counts_both_shapes() -> None:
    budget = RecentBudget(limit=RECENT_TOPIC_BYTES // 2)
    recent = RecentItems("t", budget)
    value = "x" * 10_000
    for start in range(0, 400, 50):
        recent.add(0, [(offset, value) for offset in range(start, start + 50)], arrays=start >= 100)
        assert recent.size == sum(map(len, recent.items)) + sum(map(len, recent.arrays))
        assert recent.size <= budget.limit and budget.available == budget.limit - recent.size
        assert len(recent.arrays) <= len(recent.items)
    assert recent.end == 400 and recent.get_arrays(399, 1) and recent.first > 0  # the oldest made room


def test_memory_is_bounded_per_topic_and_by_the_shared_budget() -> None:
    budget = RecentBudget(limit=3 * RECENT_TOPIC_BYTES // 2)
    one, two = RecentItems("one", budget), RecentItems("two", budget)
    value = "x" * 10_000
    for start in range(0, 2000, 100):
        one.add(0, [(offset, value) for offset in range(start, start + 100)])
    assert one.size <= RECENT_TOPIC_BYTES and one.end == 2000  # the oldest made room
    for start in range(0, 2000, 100):
        two.add(0, [(offset, value) for offset in range(start, start + 100)])
    assert one.size + two.size <= budget.limit
    assert budget.available == budget.limit - one.size - two.size >= 0
    one.clear()
    two.clear()
    assert budget.available == budget.limit
    huge = RecentItems("huge", budget)
    huge.add(0, [(0, "x" * (RECENT_TOPIC_BYTES + 1))])  # larger than a topic may hold: not held
    assert huge.items == [] and huge.first == 1 and budget.available == budget.limit
