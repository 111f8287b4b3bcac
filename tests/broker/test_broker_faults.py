"""Faults in one stream or one topic stay there: the broker process and every other stream and
topic carry on (issue 10, finding 1).

The producers here are raw clients over real sockets (tests/broker/support.py), so they can
send what a well-behaved client never would; readers are real rsnet clients.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
import trio

import rsnet
from rsnet.broker.broker import Broker, TopicSettings
from rsnet.broker.client import publish
from rsnet.broker.storage import Retention, TopicLog
from rsnet.broker.topic import MAX_SEQUENCE, now_ms
from rsnet.net.failures import TRACEBACKS_PER_MINUTE
from rsnet.protocol import MAX_INT, Accept, Complete, Error, ErrorCode, Next, Offer, Request

from .support import RawClient, broker_running, take


async def offer(client: RawClient, stream_id: int, topic: str, params: dict[str, Any]) -> Any:
    """Open an OFFER stream; returns the broker's first answer on it (REQUEST after ACCEPT, or ERROR)."""
    await client.send(Offer(stream_id, topic, params, {}))
    answer = await client.frame_of((Accept, Error), stream_id)
    if isinstance(answer, Accept):
        return await client.frame_of((Request, Error), stream_id)
    return answer


async def still_serving(url: str, topic: str) -> None:
    """A well-behaved client can publish to and read from ``topic``."""
    async with rsnet.connect(url) as conn:
        assert await publish(conn, topic, ["a", "b"]) == 2
        assert [r["value"] for r in await take(conn, topic, 2, **{"from": "earliest"})] == ["a", "b"]


@pytest.mark.parametrize("sequence", [MAX_INT, MAX_INT + 1, 2**64 - 1])
async def test_an_offer_whose_first_sequence_cannot_be_stored_is_rejected(sequence):
    async with broker_running(Broker()) as url:
        client = await RawClient.connect(url)
        answer = await offer(client, 1, "orders", {"producer": "p", "sequence": sequence})
        assert isinstance(answer, Error)
        assert answer.code == ErrorCode.REJECTED
        assert str(MAX_SEQUENCE) in answer.message
        await still_serving(url, "orders")
        await client.aclose()


async def test_a_producer_running_past_the_last_sequence_is_rejected_after_what_fits_is_stored():
    async with broker_running(Broker()) as url:
        client = await RawClient.connect(url)
        first = MAX_SEQUENCE - 1  # room for two records, not three
        request = await offer(client, 1, "orders", {"producer": "p", "sequence": first})
        assert isinstance(request, Request) and request.n >= 3
        await client.send(Next(1, "fits"), Next(1, "fits too"), Next(1, "one too many"))
        error = await client.frame_of(Error, 1)
        assert error.code == ErrorCode.REJECTED
        assert error.data == {"topic": "orders", "producer": "p", "sequence": MAX_SEQUENCE + 1}
        async with rsnet.connect(url) as conn:
            stored = await take(conn, "orders", 2, **{"from": "earliest"})
            assert [r["value"] for r in stored] == ["fits", "fits too"]
            acks = await take(conn, "$acks", 1, producer="p", topic="orders")
            assert acks == [{"topic": "orders", "producer": "p", "sequence": MAX_SEQUENCE}]
        # The same connection opens another stream; the broker serves the others as before.
        request = await offer(client, 3, "orders", {"producer": "q", "sequence": 0})
        assert isinstance(request, Request)
        await client.send(Next(3, "later"), Complete(3))
        await still_serving(url, "other")
        await client.aclose()


class ExplodingLog:
    """A topic log whose methods named in its broker's ``faults`` raise: injected faults
    (everything else is the real MemoryLog underneath)."""

    def __init__(self, inner: TopicLog, broker: FaultyBroker) -> None:
        self.inner = inner
        self.broker = broker

    def __getattr__(self, name: str) -> Any:
        if name in self.broker.faults:

            def explode(*args: Any, **kwargs: Any) -> Any:
                raise RuntimeError(f"injected fault in {name}")

            return explode
        return getattr(self.inner, name)


class FaultyBroker(Broker):
    """A real broker whose topic ``doomed`` has an :class:`ExplodingLog`."""

    def __init__(self, faults: set[str], **settings: Any) -> None:
        super().__init__(**settings)
        self.faults = faults

    def _open_log(self, name: str, settings: TopicSettings) -> TopicLog:
        if name == "doomed" and "open" in self.faults:
            raise OSError(5, "injected fault in open")
        topic_log = super()._open_log(name, settings)
        if name != "doomed":
            return topic_log
        return ExplodingLog(topic_log, self)  # type: ignore[return-value]  # a proxy with TopicLog's methods


async def read_until_failure(conn: Any, topic: str, failures: list[rsnet.StreamError], task_status: Any) -> None:
    async with conn.subscribe(topic) as items:
        task_status.started()
        with pytest.raises(rsnet.StreamError) as caught:
            async for _ in items:
                pass
        failures.append(caught.value)


async def test_a_failing_topic_writer_ends_only_that_topics_streams_with_internal(caplog):
    broker = FaultyBroker({"append"})
    async with broker_running(broker) as url, rsnet.connect(url) as conn:
        assert await publish(conn, "healthy", ["before"]) == 1
        reader_failed: list[rsnet.StreamError] = []
        async with trio.open_nursery() as nursery:
            await nursery.start(read_until_failure, conn, "doomed", reader_failed)
            producer = await RawClient.connect(url)
            with caplog.at_level(logging.ERROR, logger="rsnet.broker"):
                request = await offer(producer, 1, "doomed", {"producer": "p", "sequence": 0})
                assert isinstance(request, Request)
                await producer.send(Next(1, "boom"))
                error = await producer.frame_of(Error, 1)
        assert error.code == ErrorCode.INTERNAL
        assert "doomed" in error.message and "RuntimeError" in error.message
        assert "injected" not in error.message  # details stay in the broker's log
        assert [e.code for e in reader_failed] == [ErrorCode.INTERNAL]
        failures = [r for r in caplog.records if "topic doomed failed" in r.getMessage()]
        assert len(failures) == 1 and failures[0].exc_info is not None

        # Everything else carries on: the other topic, this connection, the process.
        assert await publish(conn, "healthy", ["after"]) == 1
        assert [r["value"] for r in await take(conn, "healthy", 2, **{"from": "earliest"})] == ["before", "after"]
        # The failed topic is opened again on the next request, with what it had stored.
        assert "doomed" not in broker.topics
        broker.faults.clear()
        assert await publish(conn, "doomed", ["again"]) == 1
        assert [r["value"] for r in await take(conn, "doomed", 1, **{"from": "earliest"})] == ["again"]
        await producer.aclose()


async def test_a_failing_read_ends_only_that_subscription_with_internal(caplog):
    broker = FaultyBroker(set())
    async with broker_running(broker) as url, rsnet.connect(url) as conn:
        assert await publish(conn, "doomed", [1, 2]) == 2
        broker.faults.add("read_fields")  # what subscriptions read with
        with caplog.at_level(logging.ERROR, logger="rsnet.broker"):
            for _ in range(TRACEBACKS_PER_MINUTE + 5):  # a client can repeat this at will: the log is bounded
                with pytest.raises(rsnet.StreamError) as caught:
                    await take(conn, "doomed", 2, **{"from": "earliest"})
                assert caught.value.code == ErrorCode.INTERNAL
        logged = [r for r in caplog.records if "subscription to doomed failed" in r.getMessage()]
        assert len(logged) == TRACEBACKS_PER_MINUTE and all(r.exc_info for r in logged)
        # The topic itself, and the connection, are fine.
        broker.faults.clear()
        assert await publish(conn, "doomed", [3]) == 1
        assert [r["value"] for r in await take(conn, "doomed", 3, **{"from": "earliest"})] == [1, 2, 3]


async def test_a_failing_retention_sweep_stops_only_its_topic():
    broker = FaultyBroker(set(), retention_sweep_s=0.01)
    async with broker_running(broker) as url, rsnet.connect(url) as conn:
        assert await publish(conn, "doomed", [1]) == 1
        reader_failed: list[rsnet.StreamError] = []
        async with trio.open_nursery() as nursery:
            await nursery.start(read_until_failure, conn, "doomed", reader_failed)
            broker.faults.add("enforce_retention")  # the next sweep fails on this topic
        assert [e.code for e in reader_failed] == [ErrorCode.INTERNAL]
        broker.faults.clear()
        await still_serving(url, "healthy")
        assert [r["value"] for r in await take(conn, "doomed", 1, **{"from": "earliest"})] == [1]


async def test_a_closed_topic_that_fails_to_open_stays_known_and_the_broker_carries_on(tmp_path):
    settings = TopicSettings(durable=True, retention=Retention(max_age_ms=1000))
    broker = FaultyBroker(
        set(), data_dir=tmp_path, settings_for=lambda name: settings, idle_close_s=0, retention_sweep_s=3600
    )
    async with broker_running(broker) as url, rsnet.connect(url) as conn:
        assert await publish(conn, "doomed", [1]) == 1
        assert broker.close_idle_topics() == 1
        broker.faults.add("open")
        later = now_ms() + 3_600_000
        assert broker.expire_closed_topics(later) == 1  # tried, failed, contained
        assert broker.expire_closed_topics(later) == 0  # retried a minute later, not at once
        with pytest.raises(rsnet.StreamError) as caught:
            await take(conn, "doomed", 1, **{"from": "earliest"})
        assert caught.value.code == ErrorCode.INTERNAL
        with pytest.raises(rsnet.StreamError) as caught:  # a pattern reaching it, too
            await take(conn, "*", 1, **{"from": "earliest"})
        assert caught.value.code == ErrorCode.INTERNAL
        assert "doomed" in [entry["topic"] async for entry in conn.subscribe("$topics")]
        await still_serving(url, "healthy")
        broker.faults.clear()
        assert broker.expire_closed_topics(later + 60_000) == 1
        assert broker.describe_topic("doomed")["first_offset"] == 1
