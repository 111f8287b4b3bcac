"""What opening and serving a broker stream costs follows what it delivers, not how many topics
the broker has (server/README.md, "Resource budget"): a pattern subscription over thousands of
topics does work for the topics that have records for it, and a ``$topics`` listing describes a
topic only when demand reaches it, and metrics keep one lag series per subscription. Costs
are counted (reads of a log's durable offset, topic descriptions, series), never timed."""

from __future__ import annotations

import random
from typing import Any

import pytest
import trio
import trio.testing

import rsnet
from rsnet.broker.broker import Broker
from rsnet.broker.client import publish
from rsnet.broker.daemon import metrics_refresher
from rsnet.broker.metrics import BrokerMetrics
from rsnet.broker.names import TopicFilter, topic_matches
from rsnet.broker.storage.log import TopicLog
from rsnet.broker.topic import Topic
from rsnet.protocol import Accept, Batch, ErrorCode, Next, Offer, Request, Subscribe
from rsnet.streams import Subscriber, Subscription

from .support import RawClient, broker_running, broker_serving, take

TOPICS = 2_000


class Counted:
    """Counts reads of every log's ``durable_offset``: what a reader looks at to find records."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.reads = 0
        durable_offset = TopicLog.durable_offset

        def counted(log: TopicLog) -> int:
            self.reads += 1
            return durable_offset.fget(log)  # type: ignore[attr-defined,no-any-return]

        monkeypatch.setattr(TopicLog, "durable_offset", property(counted))


class Collect(Subscriber[Any]):
    def __init__(self) -> None:
        self.items: list[Any] = []
        self.arrived = trio.Event()

    def on_subscribe(self, subscription: Subscription) -> None:
        subscription.request(2**63 - 1)

    def on_next(self, item: Any) -> None:
        self.items.append(item)
        self.arrived.set()

    def on_error(self, error: BaseException) -> None:
        raise AssertionError(error)

    def on_complete(self) -> None:
        raise AssertionError("a pattern subscription never completes")


class Principal:
    principal = None


async def test_a_pattern_subscription_over_many_topics_costs_what_its_busy_topics_do(monkeypatch):
    broker = Broker(max_topics=TOPICS + 1)
    async with broker_running(broker) as url, rsnet.connect(url) as conn:
        for n in range(TOPICS):
            broker.topic(f"t{n}", create=True)
        counted = Counted(monkeypatch)
        collect = Collect()
        broker.open_publisher(">", {"from": "earliest"}, Principal()).subscribe(collect)
        assert counted.reads <= 2 * TOPICS  # each topic looked at once or so (it was every topic per topic)
        counted.reads = 0
        await publish(conn, "t1234", ["one"])
        await collect.arrived.wait()
        assert [(item["topic"], item["value"]) for item in collect.items] == [("t1234", "one")]
        assert counted.reads <= 20  # the topic that has a record, not all 2,000 (it was every topic)


async def test_a_topics_listing_describes_a_topic_only_when_demand_reaches_it(monkeypatch):
    broker = Broker(max_topics=TOPICS + 1)
    described: list[str] = []
    describe = broker.describe_topic

    def counted(name: str) -> dict[str, Any] | None:
        described.append(name)
        return describe(name)

    monkeypatch.setattr(broker, "describe_topic", counted)
    async with broker_running(broker) as url:
        for n in range(TOPICS):
            broker.topic(f"t{n:04d}", create=True)
        client = await RawClient.connect(url)
        await client.send(*(Subscribe(stream_id, "$topics", None, 0, {}) for stream_id in range(1, 200, 2)))
        for stream_id in range(1, 200, 2):
            assert isinstance(await client.frame_of(Accept, stream_id), Accept)
        # 100 listings of 2,000 topics asked for: each has read its first topic at most (to
        # know whether it is empty), where each used to describe all 2,000 at once.
        assert described == ["t0000"] * 100
        await client.send(Request(1, 3))
        entries: list[str] = []
        while len(entries) < 3:
            frame = await client.frame_of((Next, Batch), 1)
            entries += [item["topic"] for item in ([frame.item] if isinstance(frame, Next) else frame.items)]
        assert entries == ["t0000", "t0001", "t0002"]
        assert len(described) <= 100 + 3  # what was asked for, and at most the one after
        await client.aclose()


async def test_a_pattern_subscription_is_one_lag_series_whatever_it_matches():
    broker = Broker(max_topics=TOPICS + 1)
    async with broker_serving(broker) as (url, server), rsnet.connect(url) as conn:
        for n in range(TOPICS):
            broker.topic(f"t{n}", create=True)
        await publish(conn, "t7", ["a", "b", "c"])
        client = await RawClient.connect(url)
        await client.send(
            Subscribe(1, ">", {"from": "earliest"}, 0, {}), Subscribe(3, "t7", {"from": "earliest"}, 0, {})
        )
        for stream_id in (1, 3):
            assert isinstance(await client.frame_of(Accept, stream_id), Accept)
        metrics = BrokerMetrics()
        metrics_refresher(broker, server)(metrics)
        lags = [
            (sample.labels["topic"], sample.value)
            for family in metrics.registry.collect()
            if family.name == "rsnet_broker_subscriber_lag"
            for sample in family.samples
        ]
        assert sorted(lags) == [(">", 3), ("t7", 3)]  # the pattern's over its 2,000 topics, then the topic's
        assert metrics.registry.get_sample_value("rsnet_broker_streams", {"kind": "subscribe"}) == 2
        await client.aclose()


def test_a_listings_filter_matches_as_patterns_do():
    """$topics' match filter (names in a set, patterns in one expression) agrees with
    topic_matches on every pair: 400 random lists of patterns over 2,000 random names."""
    rng = random.Random(7)
    names = [".".join(rng.choice("abc") for _ in range(rng.randint(1, 5))) for _ in range(2_000)]

    def pattern() -> str:
        segments = [rng.choice(["a", "b", "c", "*", ">"]) for _ in range(rng.randint(1, 4))]
        return ".".join(s if s != ">" or n == len(segments) - 1 else "*" for n, s in enumerate(segments))

    for _ in range(400):
        patterns = [pattern() for _ in range(rng.randint(1, 5))]
        wanted = TopicFilter(patterns)
        assert [wanted(name) for name in names] == [any(topic_matches(p, name) for p in patterns) for name in names]


async def test_a_listing_takes_1024_names_but_at_most_16_patterns_with_a_wildcard():
    async with broker_running(Broker()) as url, rsnet.connect(url) as conn:
        await publish(conn, "n5", [1])
        listed = [t async for t in conn.subscribe("$topics", {"match": [f"n{n}" for n in range(1024)]})]
        assert [t["topic"] for t in listed] == ["n5"]
        listed = [t async for t in conn.subscribe("$topics", {"match": [f"n{n}.>" for n in range(15)] + ["*"]})]
        assert [t["topic"] for t in listed] == ["n5"]
        with pytest.raises(rsnet.StreamError) as refused:
            [t async for t in conn.subscribe("$topics", {"match": [f"n{n}.*" for n in range(17)]})]
        assert refused.value.code == ErrorCode.REJECTED and "at most 16 patterns" in refused.value.message


async def test_pattern_subscriptions_follow_at_most_max_pattern_topics_in_all():
    async with broker_running(Broker(max_pattern_topics=10)) as url, rsnet.connect(url) as conn:
        for n in range(8):
            await publish(conn, f"p{n}", [n])
        got: list[str] = []
        failed: list[rsnet.StreamError] = []

        async def follow_all(task_status: trio.TaskStatus[None]) -> None:
            try:
                async with conn.subscribe(">", {"from": "earliest"}) as items:
                    async for item in items:
                        got.append(item["topic"])
                        if len(got) == 8:
                            task_status.started()
            except rsnet.StreamError as error:
                failed.append(error)

        async with trio.open_nursery() as nursery:
            await nursery.start(follow_all)  # follows 8 of 10
            refused = await refusal(conn, "*")  # would be 16
            assert refused.data == {"max_pattern_topics": 10}
            assert "follow at most 10 topics in all (max_pattern_topics) and follow 8;" in refused.message
            for n in range(8, 11):  # 9, 10, then one too many: the running one ends so
                await publish(conn, f"p{n}", [n])
        assert [error.code for error in failed] == [ErrorCode.REJECTED]
        assert sorted(got) == sorted(f"p{n}" for n in range(10))
        refused = await refusal(conn, "*")  # what the ended one followed is free again
        assert "and follow 0; this one would follow 11 more" in refused.message


async def refusal(conn: rsnet.Client, pattern: str) -> rsnet.StreamError:
    with pytest.raises(rsnet.StreamError) as refused:
        await take(conn, pattern, 1, **{"from": "earliest"})
    assert refused.value.code == ErrorCode.REJECTED
    return refused.value


async def test_readers_that_move_or_leave_cost_a_producer_one_look_at_the_readers_per_turn(monkeypatch):
    # Re-check of attack round 5: each reader that moved (or left) refilled every producer of
    # its topic, and each refill looked at every reader: 16,000 subscriptions beside one open
    # offer held the event loop 11 s as they closed, and starved every client as they read.
    looks = []
    capacity = Topic.capacity

    def counted(topic: Topic) -> int:
        looks.append(len(topic.readers))
        return capacity(topic)

    monkeypatch.setattr(Topic, "capacity", counted)
    broker = Broker()
    async with broker_running(broker) as url, rsnet.connect(url) as conn:
        await publish(conn, "t", list(range(10)))
        producer = await RawClient.connect(url)
        await producer.send(Offer(1, "t", {"producer": "p"}, {}))
        await producer.frame_of(Request, 1)  # an offer stays open beside the readers
        readers = await RawClient.connect(url)
        await readers.send(*(Subscribe(2 * i + 1, "t", {"from": "earliest"}, 100, {}) for i in range(500)))
        for i in range(500):
            await readers.frame_of(Accept, 2 * i + 1)
        await trio.testing.wait_all_tasks_blocked()
        looks.clear()
        await readers.aclose()  # 500 readers leave
        with trio.fail_after(5):
            while broker.topics["t"].readers:
                await trio.sleep(0.01)
        assert sum(looks) < 5_000  # (it was 500 looks at up to 500 readers: 125,000)
        await producer.aclose()
