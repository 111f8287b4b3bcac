"""Fan-out: 1 producer to 100 subscribers of mixed speeds, under each slow-subscriber policy.

Every subscriber's records are checked one by one: offsets in order, and every gap exactly
accounted for by the ``skipped`` count the broker reports (``drop``), or no gap at all.
"""

from __future__ import annotations

import trio

import rsnet
from rsnet.broker.broker import Broker, TopicSettings
from rsnet.broker.client import publish
from rsnet.broker.codes import BrokerCode
from rsnet.broker.topic import SlowPolicy

from .support import broker_running

SUBSCRIBERS = 100
CONNECTIONS = 10


async def paced(count: int, per_second: float):
    for i in range(count):
        yield i
        if i % 10 == 9:
            await trio.sleep(10 / per_second)


async def fan_out(policy: SlowPolicy, *, records: int, max_lag: int, slow_delay: float, per_second: float):
    broker = Broker(settings_for=lambda name: TopicSettings(policy=policy, max_lag=max_lag))
    results: dict[int, dict] = {}
    lags: list[int] = []
    async with broker_running(broker) as url:
        conns = []
        async with trio.open_nursery() as background:
            for _ in range(CONNECTIONS):
                conns.append(await background.start(_connection, url))

            async def watch_lag():
                while True:
                    topic = broker.topics.get("fan")
                    if topic is not None:
                        lags.extend(reader.lag(topic) for reader in topic.readers)
                    await trio.sleep(0.005)

            background.start_soon(watch_lag)
            async with rsnet.connect(url) as creator:
                await publish(creator, "fan", [])  # only publishing creates a topic
            with trio.fail_after(60):
                async with trio.open_nursery() as subscribers:
                    for index in range(SUBSCRIBERS):
                        slow = index % 2 == 1
                        results[index] = {"slow": slow, "records": [], "error": None}
                        subscribers.start_soon(
                            _subscriber,
                            conns[index % CONNECTIONS],
                            records,
                            slow_delay if slow else 0.0,
                            results[index],
                        )
                    while len(getattr(broker.topics.get("fan"), "readers", ())) < SUBSCRIBERS:
                        await trio.sleep(0.005)  # every subscription is open before the first record
                    async with rsnet.connect(url) as producer:
                        await publish(producer, "fan", paced(records, per_second))
                    # the subscribers return at the last record, or with their error
            background.cancel_scope.cancel()
    return results, lags


async def _connection(url, task_status):
    async with rsnet.connect(url) as conn:
        task_status.started(conn)
        await trio.sleep_forever()


async def _subscriber(conn, records, delay, result):
    try:
        async with conn.subscribe("fan", {"from": "earliest"}, prefetch=1 if delay else 64) as items:
            async for record in items:
                result["records"].append(record)
                if record["offset"] == records - 1:
                    return
                if delay:
                    await trio.sleep(delay)
    except rsnet.StreamError as error:
        result["error"] = error


def check_gapless(records, total):
    assert [r["offset"] for r in records] == list(range(total))
    assert [r["value"] for r in records] == list(range(total))


async def test_backpressure_delivers_everything_to_everyone_and_holds_the_producer():
    results, lags = await fan_out(SlowPolicy.BACKPRESSURE, records=600, max_lag=50, slow_delay=0.002, per_second=1e9)
    for result in results.values():
        assert result["error"] is None
        check_gapless(result["records"], 600)
    assert lags and max(lags) <= 50  # the slowest subscriber held the producer back


async def test_drop_skips_lagging_subscribers_ahead_and_tells_them_exactly_how_much():
    results, _ = await fan_out(SlowPolicy.DROP, records=800, max_lag=200, slow_delay=0.02, per_second=400)
    skipped_somewhere = 0
    for result in results.values():
        assert result["error"] is None
        records = result["records"]
        assert records[-1]["offset"] == 799  # everyone reaches the end
        previous = -1
        for record in records:
            gap = record["offset"] - previous - 1
            assert gap == record.get("skipped", 0)  # every missing record is accounted for
            assert record["value"] == record["offset"]
            previous = record["offset"]
        skipped_somewhere += sum(r.get("skipped", 0) for r in records)
        if not result["slow"]:
            check_gapless(records, 800)
    assert skipped_somewhere > 0


async def test_disconnect_ends_lagging_subscribers_with_a_coded_error():
    results, _ = await fan_out(SlowPolicy.DISCONNECT, records=800, max_lag=200, slow_delay=0.02, per_second=400)
    for result in results.values():
        records = result["records"]
        assert [r["offset"] for r in records] == list(range(len(records)))  # never a gap
        if result["slow"]:
            assert result["error"] is not None and result["error"].code == BrokerCode.SLOW_SUBSCRIBER
            assert result["error"].data["lag"] > 200
        else:
            assert result["error"] is None
            check_gapless(records, 800)
