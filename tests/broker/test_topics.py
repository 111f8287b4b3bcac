"""Topics on an embedded broker: offsets, start positions, idempotent producers, cursors."""

from __future__ import annotations

from typing import Any

import pytest
import trio

import rsnet
from rsnet.broker.broker import LISTED_SUBSCRIBERS, Broker, TopicSettings
from rsnet.broker.client import commit, publish
from rsnet.broker.codes import BrokerCode
from rsnet.broker.storage import MemoryLog, Retention
from rsnet.broker.topic import Shape, SlowPolicy, Topic, TopicReader
from rsnet.protocol import Accept, ErrorCode, Subscribe
from rsnet.streams import Subscriber, Subscription, from_iterable

from .support import RawClient, broker_running, broker_serving, take


async def test_published_records_get_contiguous_offsets_and_timestamps():
    async with broker_running(Broker()) as url, rsnet.connect(url) as conn:
        assert await publish(conn, "orders", [{"id": i} for i in range(100)]) == 100
        records = await take(conn, "orders", 100, **{"from": "earliest"})
    assert [r["offset"] for r in records] == list(range(100))
    assert [r["value"] for r in records] == [{"id": i} for i in range(100)]
    assert all(r["topic"] == "orders" for r in records)
    stamps = [r["timestamp"] for r in records]
    assert stamps == sorted(stamps) and stamps[0] > 1_600_000_000_000


async def test_start_positions_latest_offset_and_timestamp():
    async with broker_running(Broker()) as url, rsnet.connect(url) as conn:
        await publish(conn, "t", list(range(10)))
        from_offset = await take(conn, "t", 3, **{"from": 7})
        assert [r["value"] for r in from_offset] == [7, 8, 9]
        stamp = from_offset[0]["timestamp"]
        by_time = await take(conn, "t", 1, **{"from": {"timestamp": stamp}})
        assert by_time[0]["offset"] <= 7

        async with conn.subscribe("t") as latest:  # default: only records published from now on
            async with trio.open_nursery() as nursery:
                nursery.start_soon(publish, conn, "t", ["new"])
                record = await latest.__anext__()
        assert (record["offset"], record["value"]) == (10, "new")


async def test_a_trimmed_offset_is_a_coded_error_never_silent():
    broker = Broker(
        settings_for=lambda name: TopicSettings(retention=Retention(max_records=5, max_bytes=None, max_age_ms=None))
    )
    async with broker_running(broker) as url, rsnet.connect(url) as conn:
        await publish(conn, "short", list(range(20)))
        broker.topics["short"].log.enforce_retention(0)
        with pytest.raises(rsnet.StreamError) as caught:
            await take(conn, "short", 1, **{"from": 3})
        assert caught.value.code == BrokerCode.OFFSET_TRIMMED
        assert caught.value.data["first_available"] == 15
        earliest = await take(conn, "short", 5, **{"from": "earliest"})
        assert [r["offset"] for r in earliest] == [15, 16, 17, 18, 19]
        with pytest.raises(rsnet.StreamError) as caught:
            await take(conn, "short", 1, **{"from": 99})
        assert caught.value.code == BrokerCode.OFFSET_OUT_OF_RANGE


async def test_a_reader_that_retention_overtakes_is_told_when_it_reads_on():
    # Under backpressure (the default) retention can still pass a reader (by age, or a count
    # below the lag bound): its next request ends it with OFFSET_TRIMMED, not a silent wait.
    broker = Broker(
        settings_for=lambda name: TopicSettings(retention=Retention(max_records=5, max_bytes=None, max_age_ms=None))
    )
    async with broker_running(broker) as url, rsnet.connect(url) as conn:
        await publish(conn, "short", list(range(3)))
        async with conn.subscribe("short", {"from": "earliest"}, prefetch=1) as reader:
            assert (await reader.__anext__())["offset"] == 0
            await publish(conn, "short", list(range(3, 20)))
            broker.topics["short"].log.enforce_retention(0)
            with trio.fail_after(10), pytest.raises(rsnet.StreamError) as caught:
                async for record in reader:
                    assert record["offset"] < 3  # what was in flight before retention ran
        assert caught.value.code == BrokerCode.OFFSET_TRIMMED
        assert caught.value.data["first_available"] == 15


async def test_bad_names_and_params_are_rejected():
    async with broker_running(Broker()) as url, rsnet.connect(url) as conn:
        for name, params in [("a..b", {}), ("a b", {}), ("t", {"from": "yesterday"}), ("t.*", {"cursor": "g"})]:
            with pytest.raises(rsnet.StreamError) as caught:
                await take(conn, name, 1, **params)
            assert caught.value.code == ErrorCode.REJECTED, (name, params)


async def test_a_param_a_stream_does_not_take_is_rejected_not_ignored():
    """BROKER.md "Names": a misspelt ``from`` must not quietly mean "latest", on any stream."""
    async with broker_running(Broker()) as url, rsnet.connect(url) as conn:
        await publish(conn, "t", [1])
        for name, params, takes in [
            ("t", {"frm": "earliest"}, "from, until, cursor, items"),
            ("t.*", {"from": "earliest", "cursr": "g"}, "from, until, cursor, items"),
            ("$topics", {"mach": "t"}, "match"),
            ("$commit", {"topic": "t", "cursor": "g", "offset": 0, "ofset": 1}, "topic, cursor, offset"),
            ("$acks", {"producer": "p", "topic": "t", "sequence": 0}, "producer, topic"),
            ("$admin", {"action": "create", "topic": "u", "setting": {}}, "action, topic, settings, reset"),
        ]:
            with pytest.raises(rsnet.StreamError) as caught:
                await take(conn, name, 1, **params)
            assert caught.value.code == ErrorCode.REJECTED, (name, params)
            assert caught.value.message.startswith("unknown param '") and caught.value.message.endswith(
                f"(it takes {takes})"
            ), caught.value.message
        with pytest.raises(rsnet.StreamError) as caught:
            await conn.offer("t", from_iterable([2]), {"producer": "p", "seqence": 5})
        assert caught.value.code == ErrorCode.REJECTED and "'seqence'" in caught.value.message
        many = {f"k{i}": i for i in range(1000)}
        with pytest.raises(rsnet.StreamError) as caught:
            await take(conn, "t", 1, **many)
        assert len(caught.value.message) < 200, "at most five names, each shortened"
        assert [r["value"] for r in await take(conn, "t", 1, **{"from": "earliest"})] == [1]
        assert "u" not in [t["topic"] async for t in conn.subscribe("$topics")]


async def test_an_invalid_start_position_is_rejected_on_every_path_and_the_connection_lives():
    """``from`` is "earliest", "latest", an offset >= 0 or {"timestamp": ms >= 0}: anything else
    (booleans are not ints, SPEC 3) is REJECTED before any topic is read, whether the name is
    a topic, a missing topic or a pattern with a matching topic; a stream running on the same
    connection carries on. (A pattern once resolved a bad timestamp per matching topic, and
    the TypeError ended the connection.)"""
    async with broker_running(Broker()) as url, rsnet.connect(url) as conn:
        await publish(conn, "rp.a", list(range(5)))
        async with conn.subscribe("rp.a", {"from": "earliest"}, prefetch=1) as running_stream:
            assert (await running_stream.__anext__())["value"] == 0
            bad = [True, -1, -(2**63), 1.5, "yesterday", {"timestamp": True}, {"timestamp": -1}]
            bad += [{"timestamp": 1.5}, {"timestamp": "x"}, {"timestamp": None}, {}, [0]]
            for name in ("rp.a", "rp.missing", "rp.*"):
                for start in bad:
                    with pytest.raises(rsnet.StreamError) as caught:
                        await take(conn, name, 1, **{"from": start})
                    assert caught.value.code == ErrorCode.REJECTED, (name, start)
                    assert "invalid start position" in caught.value.message, (name, start)
            for offset in (-1, True):
                with pytest.raises(rsnet.StreamError) as caught:
                    await commit(conn, "rp.a", "group", offset)
                assert caught.value.code == ErrorCode.REJECTED
                assert "offset (an int >= 0)" in caught.value.message
            assert [(await running_stream.__anext__())["value"] for _ in range(4)] == [1, 2, 3, 4]


async def test_republishing_with_the_same_producer_and_sequences_stores_once():
    async with broker_running(Broker()) as url, rsnet.connect(url) as conn:
        await publish(conn, "idem", ["a", "b", "c"], producer="p1")
        await publish(conn, "idem", ["b", "c", "d"], producer="p1", first_sequence=1)  # a retry overlapping
        records = await take(conn, "idem", 4, **{"from": "earliest"})
        assert [r["value"] for r in records] == ["a", "b", "c", "d"]
        assert rsnet_snapshot_next(await snapshot(conn), "idem") == 4


async def snapshot(conn):
    return [topic async for topic in conn.subscribe("$topics")]


async def test_topics_lists_only_those_matching_the_names_and_patterns_asked_for():
    """BROKER.md, ``$topics`` with ``match``: a name, a pattern, or a list; a bad one is REJECTED."""
    async with broker_running(Broker()) as url, rsnet.connect(url) as conn:
        for name in ("eu.orders", "eu.refunds", "us.orders", "logs"):
            await publish(conn, name, [1])

        async def names(match):
            return sorted([t["topic"] async for t in conn.subscribe("$topics", {"match": match})])

        assert await names("eu.*") == ["eu.orders", "eu.refunds"]
        assert await names("logs") == ["logs"]
        assert await names(["*.orders", "logs", "missing"]) == ["eu.orders", "logs", "us.orders"]
        assert len(await snapshot(conn)) == 4  # no match: every topic
        for bad in ("eu..x", [], ["ok", 7], {"eu": 1}, ["t"] * 1025):
            with pytest.raises(rsnet.StreamError) as refused:
                await names(bad)
            assert refused.value.code == ErrorCode.REJECTED, bad


def rsnet_snapshot_next(topics, name):
    return next(t["next_offset"] for t in topics if t["topic"] == name)


async def test_named_cursors_resume_where_the_group_stopped():
    async with broker_running(Broker()) as url:
        async with rsnet.connect(url) as conn:
            await publish(conn, "jobs", list(range(10)))
            first = await take(conn, "jobs", 4, cursor="workers", **{"from": "earliest"})
            await commit(conn, "jobs", "workers", first[-1]["offset"] + 1)
        async with rsnet.connect(url) as conn:
            rest = await take(conn, "jobs", 6, cursor="workers", **{"from": "earliest"})
            with pytest.raises(rsnet.StreamError) as caught:
                await commit(conn, "jobs", "workers", 11)  # beyond the end
            assert caught.value.code == ErrorCode.REJECTED
    assert [r["value"] for r in first] == [0, 1, 2, 3]
    assert [r["value"] for r in rest] == [4, 5, 6, 7, 8, 9]


async def test_wildcard_subscription_sees_existing_and_new_topics():
    async with broker_running(Broker()) as url, rsnet.connect(url) as conn:
        await publish(conn, "sensors.kitchen", ["k0"])
        await publish(conn, "other", ["x"])
        async with conn.subscribe("sensors.*", {"from": "earliest"}) as records:
            first = await records.__anext__()
            await publish(conn, "sensors.garage", ["g0"])
            second = await records.__anext__()
    assert (first["topic"], first["value"]) == ("sensors.kitchen", "k0")
    assert (second["topic"], second["value"]) == ("sensors.garage", "g0")


async def test_topics_lists_offsets_and_subscriber_lag():
    async with broker_running(Broker()) as url, rsnet.connect(url) as conn:
        await publish(conn, "a", list(range(5)))
        async with conn.subscribe("a", {"from": "earliest"}, prefetch=2) as records:
            await records.__anext__()
            topics = await snapshot(conn)
        (a,) = [t for t in topics if t["topic"] == "a"]
        assert (a["first_offset"], a["next_offset"]) == (0, 5)
        assert len(a["subscribers"]) == 1 and a["subscribers"][0]["lag"] >= 3
        assert a["subscriber_count"] == 1


async def test_topics_lists_the_subscribers_furthest_behind_and_counts_them_all():
    # Attack round 5: 80,000 idle subscriptions made one topic's item, a list of every
    # subscriber, larger than a frame: the listing failed with FRAME_TOO_LARGE for everyone.
    async with broker_running(Broker()) as url, rsnet.connect(url) as conn:
        await publish(conn, "a", list(range(200)))
        client = await RawClient.connect(url)
        await client.send(*(Subscribe(2 * i + 1, "a", {"from": i}, 0, {}) for i in range(LISTED_SUBSCRIBERS + 50)))
        for i in range(LISTED_SUBSCRIBERS + 50):
            await client.frame_of(Accept, 2 * i + 1)
        (a,) = await snapshot(conn)
        assert a["subscriber_count"] == LISTED_SUBSCRIBERS + 50
        assert [s["lag"] for s in a["subscribers"]] == list(range(200, 200 - LISTED_SUBSCRIBERS, -1))
        await client.aclose()


async def test_items_arrays_carry_the_same_records_without_keys():
    """BROKER.md, ``items: "arrays"``: ``[offset, timestamp, value]`` on a topic, the topic's
    name appended on a pattern; the same records as the maps, and a bad value is REJECTED."""
    async with broker_running(Broker()) as url, rsnet.connect(url) as conn:
        await publish(conn, "a.one", [{"n": i} for i in range(5)])
        await publish(conn, "a.two", ["x"])
        maps = await take(conn, "a.one", 5, **{"from": "earliest"})
        arrays = await take(conn, "a.one", 5, **{"from": "earliest", "items": "arrays"})
        assert arrays == [[r["offset"], r["timestamp"], r["value"]] for r in maps]
        on_pattern = await take(conn, "a.*", 6, **{"from": "earliest", "items": "arrays"})
        assert sorted((r[3], r[0], r[2] == "x") for r in on_pattern) == [("a.one", i, False) for i in range(5)] + [
            ("a.two", 0, True)
        ]
        with pytest.raises(rsnet.StreamError) as refused:
            await take(conn, "a.one", 1, **{"items": "tuples"})
        assert refused.value.code == ErrorCode.REJECTED and "items" in refused.value.message


@pytest.mark.parametrize("durable", [False, True], ids=["memory", "durable"])
async def test_items_stored_carry_each_record_as_stored_with_its_producer(tmp_path, durable):
    """BROKER.md, ``items: "stored"``: ``[offset, timestamp, value, producer, sequence]``, the
    record's stored bytes sent as they are (the topic's name appended on a pattern)."""
    broker = Broker(data_dir=tmp_path if durable else None)
    async with broker_running(broker) as url, rsnet.connect(url) as conn:
        await publish(conn, "s.one", [{"n": i, "pad": "x" * 300 * i} for i in range(5)], producer="p", first_sequence=7)
        await conn.offer(
            "s.two", from_iterable(["plain", b"\x00bin"])
        )  # no producer: nil, nil (and no $acks to wait for)
        maps = await take(conn, "s.one", 5, **{"from": "earliest"})
        stored = await take(conn, "s.one", 5, **{"from": "earliest", "items": "stored"})
        assert stored == [[r["offset"], r["timestamp"], r["value"], "p", 7 + i] for i, r in enumerate(maps)]
        from_two = await take(conn, "s.two", 1, **{"from": 1, "items": "stored"})
        assert [r[2:] for r in from_two] == [[b"\x00bin", None, None]]
        on_pattern = await take(conn, "s.*", 7, **{"from": "earliest", "items": "stored"})
        assert sorted((r[5], r[0], r[3]) for r in on_pattern) == [("s.one", i, "p") for i in range(5)] + [
            ("s.two", 0, None),
            ("s.two", 1, None),
        ]
        assert all(len(r) == 6 for r in on_pattern)


class Manual(Subscriber[Any]):
    """Requests only when the test says so."""

    def __init__(self) -> None:
        self.items: list[Any] = []
        self.subscription: Subscription | None = None

    def on_subscribe(self, subscription: Subscription) -> None:
        self.subscription = subscription

    def on_next(self, item: Any) -> None:
        self.items.append(item)

    def on_error(self, error: BaseException) -> None:
        self.items.append(error)

    def on_complete(self) -> None:
        self.items.append("complete")


def test_items_stored_reach_a_subscriber_in_this_process_decoded():
    topic = Topic("m.x", MemoryLog())
    topic.log.append(["a", "b"], timestamp_ms=3, producer="q", first_sequence=0)
    for shape, tail in ((Shape(stored=True), []), (Shape(stored=True, with_topic=True), ["m.x"])):
        subscriber = Manual()  # no on_next_encoded: not a network session
        reader = TopicReader(subscriber, shape=shape)
        subscriber.on_subscribe(reader)
        reader.add_topic(topic, 0)
        reader.request(2)
        assert subscriber.items == [[0, 3, "a", "q", 0, *tail], [1, 3, "b", "q", 1, *tail]]


def test_items_arrays_show_records_skipped_by_drop_as_a_gap_in_offsets():
    topic = Topic("d", MemoryLog(), policy=SlowPolicy.DROP, max_lag=10)
    subscriber = Manual()
    reader = TopicReader(subscriber, shape=Shape(arrays=True))
    subscriber.on_subscribe(reader)
    reader.add_topic(topic, 0)
    topic.log.append(list(range(100)), timestamp_ms=1)
    reader.appended(topic)  # no demand: 100 behind, more than max_lag: it skips ahead
    reader.request(100)
    offsets = [r[0] for r in subscriber.items]
    assert offsets[0] > 50 and offsets == list(range(offsets[0], 100))  # a gap from 0, and no key saying so
    assert all(r == [r[0], 1, r[0]] for r in subscriber.items)


def reading(topic: Topic, start: int, until: int) -> tuple[Manual, TopicReader]:
    """A subscriber (requesting nothing yet) of ``topic`` from ``start`` until ``until``."""
    subscriber = Manual()
    reader = TopicReader(subscriber, shape=Shape(arrays=True), until=until)
    subscriber.on_subscribe(reader)
    reader.add_topic(topic, start)
    return subscriber, reader


def test_until_completes_the_subscription_at_that_offset_whatever_its_demand():
    # A range read (Spark, rsnet sub --until-end): the records before until, then COMPLETE;
    # none at or past it, and it waits for those not yet written.
    topic = Topic("u", MemoryLog())
    topic.log.append(list(range(10)), timestamp_ms=1)
    subscriber, reader = reading(topic, 7, until=13)
    reader.request(100)
    assert [r[0] for r in subscriber.items] == [7, 8, 9]  # and it waits for 10 to 12
    topic.log.append(list(range(10, 20)), timestamp_ms=1)
    reader.appended(topic)
    assert [r if r == "complete" else r[0] for r in subscriber.items] == [7, 8, 9, 10, 11, 12, "complete"]
    assert reader not in topic.readers
    for start in (13, 20):  # at or past until: complete at once, with no demand (rule 1.4)
        assert reading(topic, start, until=13)[0].items == ["complete"]


def test_until_completes_a_read_that_drop_moved_past_it():
    # A lagging read on a drop topic skipped past until: it completes, and its reader sees
    # the gap (it used to wait for records past until, which may never come).
    topic = Topic("d", MemoryLog(), policy=SlowPolicy.DROP, max_lag=10)
    topic.log.append(list(range(30)), timestamp_ms=1)
    subscriber, reader = reading(topic, 0, until=30)
    reader.request(5)
    topic.log.append(list(range(100)), timestamp_ms=1)
    reader.appended(topic)  # no demand left, 125 behind: it skips ahead, past 30
    assert [r if r == "complete" else r[0] for r in subscriber.items] == [0, 1, 2, 3, 4, "complete"]


async def test_until_is_an_offset_of_one_topic():
    async with broker_running(Broker()) as url, rsnet.connect(url) as conn:
        await publish(conn, "t", list(range(5)))
        async with conn.subscribe("t", {"from": 1, "until": 3}) as items:
            assert [r["offset"] async for r in items] == [1, 2]  # then it completed
        for params, message in (
            ({"until": -1}, "until must be an offset"),
            ({"until": "end"}, "until must be an offset"),
            ({"until": True}, "until must be an offset"),
        ):
            with pytest.raises(rsnet.StreamError, match=message) as refused:
                await take(conn, "t", 1, **params)
            assert refused.value.code == ErrorCode.REJECTED
        with pytest.raises(rsnet.StreamError, match="until is an offset of one topic") as refused:
            await take(conn, "t.*", 1, until=3)
        assert refused.value.code == ErrorCode.REJECTED
        # An empty range completes at once, whatever the topic holds or whether it exists yet.
        await admin_purge(conn, "t")
        for name, params in (("t", {"from": 2, "until": 2}), ("t", {"from": 9, "until": 3}), ("absent", {"until": 0})):
            async with conn.subscribe(name, params) as items:
                assert [r async for r in items] == [], (name, params)
        with pytest.raises(rsnet.StreamError) as gone:  # records of the range were removed
            await take(conn, "t", 1, **{"from": 0, "until": 3})
        assert gone.value.code == BrokerCode.OFFSET_TRIMMED


async def admin_purge(conn: rsnet.Client, topic: str) -> None:
    async for _ in conn.subscribe("$admin", {"action": "purge", "topic": topic}):
        pass


async def test_a_timestamp_start_takes_no_other_key():
    async with broker_running(Broker()) as url, rsnet.connect(url) as conn:
        await publish(conn, "t", [1])
        with pytest.raises(rsnet.StreamError, match="invalid start position") as refused:
            await take(conn, "t", 1, **{"from": {"timestamp": 1, "typo": 1}})
        assert refused.value.code == ErrorCode.REJECTED


async def test_follow_starts_at_a_cursor_then_resumes_from_its_own_position():

    from rsnet.broker.client import follow

    async with broker_running(Broker()) as url, rsnet.connect(url) as conn:
        await publish(conn, "followed", list(range(5)))
        await commit(conn, "followed", "group", 2)
        values = []
        async with follow(url, "followed", start="earliest", cursor="group", budget=1 << 16) as records:
            async for record in records:
                values.append(record["value"])
                if len(values) == 3:
                    break
        assert values == [2, 3, 4]


async def test_leaving_a_follow_loop_early_closes_its_connection_there_and_then():
    """An outside check: ``break`` out of a ``follow`` loop, then a connection of the task's
    own, crashed the program (Nursery misnesting) when ``follow`` was an async generator that
    yielded from inside its connection. Its connection now lives in a task of the ``async
    with`` block, and ends with it."""

    from rsnet.broker.client import follow

    async with broker_serving(Broker()) as (url, server):
        async with rsnet.connect(url) as conn:
            await publish(conn, "t", [1, 2, 3])
        with trio.fail_after(5):
            while server.sessions:  # the publisher's connection is gone
                await trio.sleep(0.01)
        values = []
        async with follow(url, "t", start="earliest") as records:
            async for record in records:
                values.append(record["value"])
                break
            assert len(server.sessions) == 1  # follow's own, open while the block lasts
        assert values == [1]
        with trio.fail_after(5):
            while server.sessions:
                await trio.sleep(0.01)
        async with rsnet.connect(url) as conn:  # the task goes on, with connections of its own
            assert [r["value"] for r in await take(conn, "t", 3, **{"from": "earliest"})] == [1, 2, 3]


async def test_follow_waits_out_a_server_going_away_and_raises_other_stream_errors(caplog):
    """A restarting server refuses new streams with GOING_AWAY (SPEC 10.2): retryable, as a lost
    connection is, and each retry is logged. Any other stream error ends the loop."""

    from rsnet.broker.client import follow

    server, refusals = rsnet.Server(), [ErrorCode.GOING_AWAY, ErrorCode.GOING_AWAY, ErrorCode.REJECTED]

    @server.publisher("feed")
    def feed(params, ctx):
        if refusals[0] != ErrorCode.REJECTED or params.get("from") == "earliest":
            code = refusals.pop(0)
            raise rsnet.StreamError(code, "going away" if code == ErrorCode.GOING_AWAY else "no")
        return from_iterable([{"offset": 7, "value": "after the restart"}])

    async with trio.open_nursery() as nursery:
        port = await nursery.start(server.serve_tcp, "127.0.0.1", 0)
        url = f"tcp://127.0.0.1:{port}"
        async with follow(url, "feed", start=7, retry_delay=0.01) as records:
            assert [record["value"] async for record in records] == ["after the restart"]
        assert refusals == [ErrorCode.REJECTED]
        retries = [r.getMessage() for r in caplog.records if r.name == "rsnet.broker.client"]
        assert len(retries) == 2 and all("going away" in line and "retrying in" in line for line in retries)
        with pytest.raises(rsnet.StreamError) as refused:
            async with follow(url, "feed", start="earliest", retry_delay=0.01) as records:
                async for _ in records:
                    pass
        assert refused.value.code == ErrorCode.REJECTED
        nursery.cancel_scope.cancel()
