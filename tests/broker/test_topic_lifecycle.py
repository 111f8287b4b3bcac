"""Which requests create topics, and what topics cost while nobody uses them (issue 10, finding 5).

Only publishing creates a topic; a subscription to a missing topic waits for it (or fails, as
configured) and leaves nothing behind when cancelled; the number of topics is bounded
(``max_topics``); a durable topic nobody uses gives its open files back.
"""

from __future__ import annotations

import os
import pathlib
import resource

import pytest
import trio

import rsnet
from rsnet.broker.auth import Authorizer
from rsnet.broker.broker import DATA_DIR_LOCK, Broker, TopicSettings
from rsnet.broker.client import publish
from rsnet.broker.codes import BrokerCode
from rsnet.broker.config import load_config
from rsnet.broker.daemon import build_broker
from rsnet.broker.storage import Retention, StorageError
from rsnet.broker.topic import now_ms
from rsnet.protocol import Accept, Batch, Cancel, Error, ErrorCode, Next, Request, Subscribe

from .support import RawClient, broker_running, served_url, start_daemon, take


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def stored(data_dir: pathlib.Path) -> list[str]:
    """What ``data_dir`` holds, the broker's lock aside."""
    return sorted(p.name for p in data_dir.iterdir() if p.name != DATA_DIR_LOCK)


async def topic_names(url: str) -> list[str]:
    async with rsnet.connect(url) as conn:
        return [entry["topic"] async for entry in conn.subscribe("$topics")]


@pytest.mark.parametrize("missing", ["wait", "fail"])
async def test_subscribing_to_missing_topics_creates_nothing_and_holds_no_files(tmp_path, missing):
    broker = Broker(
        data_dir=tmp_path, settings_for=lambda name: TopicSettings(durable=True, wait_if_missing=missing == "wait")
    )
    async with broker_running(broker) as url:
        client = await RawClient.connect(url)
        baseline = open_fds()
        stream_id = 1
        for _ in range(4):  # 2,000 subscriptions, 500 at a time (each cancelled at once)
            frames = []
            for _ in range(500):
                frames += [Subscribe(stream_id, f"typo.t{stream_id}", {}, 1, {}), Cancel(stream_id)]
                stream_id += 2
            await client.send(*frames)
        assert await topic_names(url) == []  # also: the broker has handled every frame above
        assert stored(tmp_path) == []
        assert broker.topic_count == 0 and broker.waiting_subscriptions == 0
        assert open_fds() <= baseline + 2  # the $topics connection may still be closing
        await client.aclose()


async def test_a_subscription_to_a_missing_topic_fails_when_configured_so():
    broker = Broker(settings_for=lambda name: TopicSettings(wait_if_missing=False))
    async with broker_running(broker) as url, rsnet.connect(url) as conn:
        with pytest.raises(rsnet.StreamError) as caught:
            await take(conn, "nothing.here", 1)
        assert caught.value.code == ErrorCode.UNKNOWN_PUBLISHER
        assert caught.value.message == (
            "no topic named 'nothing.here' (subscribe_missing is fail for it: a subscription does not"
            " wait for its first record)"
        )


@pytest.mark.parametrize("start", ["earliest", "latest", 0, {"timestamp": 0}])
async def test_a_waiting_subscription_reads_the_topic_from_its_first_record(start):
    async with broker_running(Broker()) as url, rsnet.connect(url) as reader, rsnet.connect(url) as writer:
        received: list[int] = []

        async def read(task_status=trio.TASK_STATUS_IGNORED) -> None:
            async with reader.subscribe("later", {"from": start}) as items:
                task_status.started()
                async for record in items:
                    received.append(record["value"])
                    if len(received) == 3:
                        return

        async with trio.open_nursery() as nursery:
            await nursery.start(read)
            assert await topic_names(url) == []
            assert await publish(writer, "later", [1, 2, 3]) == 3
        assert received == [1, 2, 3]


async def test_a_waiting_subscription_cannot_start_past_the_end():
    async with broker_running(Broker()) as url, rsnet.connect(url) as conn:
        with pytest.raises(rsnet.StreamError) as caught:
            await take(conn, "later", 1, **{"from": 5})
        assert caught.value.code == BrokerCode.OFFSET_OUT_OF_RANGE
        with pytest.raises(rsnet.StreamError) as caught:
            await take(conn, "later", 1, **{"from": "tomorrow"})
        assert caught.value.code == ErrorCode.REJECTED


async def test_publishing_to_a_missing_topic_is_refused_without_auto_create(tmp_path):
    broker = Broker(data_dir=tmp_path, settings_for=lambda name: TopicSettings(durable=True, auto_create=False))
    async with broker_running(broker) as url, rsnet.connect(url) as conn:
        with pytest.raises(rsnet.StreamError) as caught:
            await publish(conn, "orders.new", [1])
        assert caught.value.code == ErrorCode.UNKNOWN_PUBLISHER
        # Says why, and who can create it: an operator, not a producer's retry.
        assert caught.value.message == (
            "no topic named 'orders.new', and publishing does not create it here (auto_create is never"
            " for it): an admin creates it ($admin create; rsnet topics create)"
        )
        assert stored(tmp_path) == []


async def test_max_topics_refuses_one_more_topic_with_a_clear_error(tmp_path):
    broker = Broker(data_dir=tmp_path, max_topics=3)
    async with broker_running(broker) as url, rsnet.connect(url) as conn:
        for name in ("a", "b", "c"):
            assert await publish(conn, name, [name]) == 1
        with pytest.raises(rsnet.StreamError) as caught:
            await publish(conn, "d", ["d"])
        assert caught.value.code == BrokerCode.TOO_MANY_TOPICS
        assert "3 topics" in caught.value.message
        assert caught.value.data == {"topic": "d", "max_topics": 3}
        assert stored(tmp_path) == ["a", "b", "c"]
        # Existing topics are not affected, closed or open.
        broker.idle_close_s = 0
        broker.close_idle_topics()
        assert await publish(conn, "a", ["again"]) == 1
        assert [r["value"] for r in await take(conn, "a", 2, **{"from": "earliest"})] == ["a", "again"]


TOPICS = 20


async def test_idle_durable_topics_give_their_files_back_and_reopen_on_demand(tmp_path: pathlib.Path):
    broker = Broker(data_dir=tmp_path, idle_close_s=0, retention_sweep_s=3600)  # closing: by the test
    async with broker_running(broker) as url, rsnet.connect(url) as conn:
        baseline = open_fds()
        for index in range(TOPICS):
            assert await publish(conn, f"t{index}", [index, index + 1]) == 2
        assert open_fds() >= baseline + TOPICS  # every open durable log holds files
        assert broker.close_idle_topics() == TOPICS
        assert open_fds() <= baseline
        assert len(broker.topics) == 0 and broker.topic_count == TOPICS
        topics = {entry["topic"]: entry async for entry in conn.subscribe("$topics")}
        assert len(topics) == TOPICS and topics["t7"]["next_offset"] == 2
        # A subscription reopens the topic; a pattern subscription the topics it matches.
        assert [r["value"] for r in await take(conn, "t7", 2, **{"from": "earliest"})] == [7, 8]
        records = await take(conn, "*", 2 * TOPICS, **{"from": "earliest"})
        assert sorted(r["value"] for r in records) == sorted([*range(TOPICS), *range(1, TOPICS + 1)])
    # A broker starting on these topics recovers each and keeps none open.
    restarted = Broker(data_dir=tmp_path)
    async with broker_running(restarted) as url, rsnet.connect(url) as conn:
        assert restarted.topic_count == TOPICS and len(restarted.topics) == 0
        assert [r["value"] for r in await take(conn, "t19", 2, **{"from": "earliest"})] == [19, 20]


async def test_the_sweep_closes_idle_durable_topics(tmp_path):
    broker = Broker(data_dir=tmp_path, idle_close_s=0, retention_sweep_s=0.01)
    async with broker_running(broker) as url, rsnet.connect(url) as conn:
        assert await publish(conn, "quiet", [1]) == 1
        with trio.fail_after(5):
            while broker.topics:  # waits for the sweep, a few of its 10 ms rounds
                await trio.sleep(0.01)
        assert broker.topic_count == 1
        assert [r["value"] for r in await take(conn, "quiet", 1, **{"from": "earliest"})] == [1]


async def test_age_retention_reaches_closed_topics(tmp_path):
    settings = TopicSettings(durable=True, retention=Retention(max_age_ms=1000))
    broker = Broker(data_dir=tmp_path, settings_for=lambda name: settings, idle_close_s=0, retention_sweep_s=3600)
    async with broker_running(broker) as url, rsnet.connect(url) as conn:
        assert await publish(conn, "old", [1, 2]) == 2
        assert await publish(conn, "old2", [3]) == 1
        assert broker.close_idle_topics() == 2
        assert broker.expire_closed_topics(now_ms()) == 0  # nothing is due yet (checks are >= 1 min apart)
        later = now_ms() + 3_600_000
        assert broker.expire_closed_topics(later, limit=1) == 1  # one per call at most
        assert broker.expire_closed_topics(later) == 1
        assert broker.topics == {}  # closed again
        entries = {entry["topic"]: entry async for entry in conn.subscribe("$topics")}
        assert (entries["old"]["first_offset"], entries["old"]["next_offset"]) == (2, 2)
        assert (entries["old2"]["first_offset"], entries["old2"]["next_offset"]) == (1, 1)
        assert broker.expire_closed_topics(later) == 0  # an empty topic has nothing to expire


def test_the_daemon_builds_the_broker_the_configuration_describes():
    config = load_config(
        None,
        {},
        {
            "max_topics": 7,
            "max_open_topics": 3,
            "idle_topic_close_s": 5,
            "topic_defaults.auto_create": "never",
            "topics": [{"pattern": "live.>", "auto_create": "publish", "subscribe_missing": "fail"}],
        },
    )
    broker = build_broker(config, Authorizer(config.auth))
    assert (broker.max_topics, broker.max_open_topics, broker.idle_close_s) == (7, 3, 5.0)
    other, live = broker.settings_for("orders"), broker.settings_for("live.x")
    assert (other.auto_create, other.wait_if_missing) == (False, True)
    assert (live.auto_create, live.wait_if_missing) == (True, False)


async def test_open_durable_topics_hold_the_descriptors_of_max_open_topics_logs_at_most(tmp_path):
    """More topics in use than max_open_topics: each stays open, and the least recently used
    logs give their descriptors up, to take them again when they are read or written."""
    broker = Broker(data_dir=tmp_path, max_open_topics=4, retention_sweep_s=3600)  # no idle timeout here
    async with broker_running(broker) as url, rsnet.connect(url) as conn:
        baseline = open_fds()
        for index in range(TOPICS):
            assert await publish(conn, f"t{index}", [index]) == 1
            assert len(broker.descriptors) <= 4
        assert len(broker.topics) == TOPICS
        assert open_fds() <= baseline + 4 * 3  # a lock, the active segment, one being read, per log
        for index in range(TOPICS):
            assert [r["value"] for r in await take(conn, f"t{index}", 1, **{"from": "earliest"})] == [index]
            assert await publish(conn, f"t{index}", [index + 100], producer="again") == 1
        for index in range(TOPICS):
            records = await take(conn, f"t{index}", 2, **{"from": "earliest"})
            assert [(r["offset"], r["value"]) for r in records] == [(0, index), (1, index + 100)]
        assert open_fds() <= baseline + 4 * 3
        assert broker.descriptors.suspensions > TOPICS


async def test_subscriptions_to_more_topics_than_max_open_topics_keep_no_one_out(tmp_path):
    """Attack round 6: a subscription held its topic's log open, so one client subscribed to
    max_open_topics topics (128 at a descriptor limit of 1,024), even with no demand, made every
    other durable topic refuse every client with TOO_MANY_TOPICS, and a pattern subscription
    over more topics than that could not start. Now subscriptions hold no descriptor."""
    broker = Broker(data_dir=tmp_path, max_open_topics=2, retention_sweep_s=3600)
    async with broker_running(broker) as url, rsnet.connect(url) as conn:
        for name in ("a", "b", "c", "d"):
            assert await publish(conn, name, [name]) == 1
        holder = await RawClient.connect(url)  # a subscription to each of a, b and c, no demand
        await holder.send(*(Subscribe(2 * i + 1, name, {"from": "earliest"}, 0, {}) for i, name in enumerate("abc")))
        for stream_id in (1, 3, 5):
            assert isinstance(await holder.frame_of((Accept, Error), stream_id), Accept)
        assert await publish(conn, "d", ["again"]) == 1
        assert await publish(conn, "e", ["new"]) == 1
        records = await take(conn, "*", 6, **{"from": "earliest"})
        assert sorted(r["value"] for r in records) == ["a", "again", "b", "c", "d", "new"]
        await holder.send(Request(1, 10), Request(3, 10), Request(5, 10))  # and they read, in turn
        read: dict[int, list[str]] = {}
        while len(read) < 3:
            frame = await holder.next_frame()
            if isinstance(frame, (Next, Batch)):
                items = [frame.item] if isinstance(frame, Next) else frame.items
                read.setdefault(frame.stream_id, []).extend(item["value"] for item in items)
        assert read == {1: ["a"], 3: ["b"], 5: ["c"]}
        assert len(broker.descriptors) <= 2
        await holder.aclose()


async def test_a_second_broker_on_the_same_data_dir_stops_at_its_start(tmp_path):
    """Two brokers writing the same logs would destroy records: the second stops at once,
    saying why (a topic's own lock is given up with its log's other descriptors, so it can no
    longer be what keeps them apart)."""
    async with broker_running(Broker(data_dir=tmp_path)) as url, rsnet.connect(url) as conn:
        await publish(conn, "a", ["kept"])
        with pytest.raises(ExceptionGroup) as caught:  # (from the test's nursery)
            async with broker_running(Broker(data_dir=tmp_path)):
                raise AssertionError("a second broker started on the same data_dir")
        assert caught.group_contains(StorageError, match="is in use by another broker", depth=None)
    async with broker_running(Broker(data_dir=tmp_path)) as url, rsnet.connect(url) as conn:  # free again
        assert [r["value"] for r in await take(conn, "a", 1, **{"from": "earliest"})] == ["kept"]


FD_LIMIT = 128


def low_fd_limit() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (FD_LIMIT, FD_LIMIT))


async def test_silent_sockets_cannot_take_the_descriptors_a_durable_topic_needs(tmp_path):
    """Half the descriptors are the connections' (connection_limit), the rest the topics': 150
    sockets that never send HELLO, at a limit of 128 descriptors, leave a connected producer
    storing into 20 new durable topics (before: every such socket was accepted, and publishing
    failed with STORAGE_ERROR "Too many open files" until their handshakes timed out)."""
    process, printed = await start_daemon(
        "--data-dir", str(tmp_path), "--tcp", "127.0.0.1:0", announces=b"auth off", preexec_fn=low_fd_limit
    )
    silent = []
    try:
        url = served_url(printed)
        port = int(url.rsplit(":", 1)[1])
        async with rsnet.connect(url) as conn:
            silent = [await trio.open_tcp_stream("127.0.0.1", port) for _ in range(150)]
            for index in range(20):
                assert await publish(conn, f"t{index}", [index]) == 1
            assert [r["value"] for r in await take(conn, "t19", 1, **{"from": "earliest"})] == [19]
        assert process.returncode is None
    finally:
        for stream in silent:
            await stream.aclose()
        process.terminate()
        with trio.fail_after(10):
            await process.wait()


async def test_the_daemon_at_a_128_descriptor_limit_serves_2000_missing_names_and_60_topics(tmp_path):
    """The issue's scenario against the real process: before, every subscription to a missing
    name held two descriptors for good, and "Too many open files" came after about a quarter
    of the limit; now subscriptions hold none, and topics beyond max_open_topics (16 here)
    close idle ones."""
    process, printed = await start_daemon(
        "--data-dir", str(tmp_path), "--tcp", "127.0.0.1:0", announces=b"auth off", preexec_fn=low_fd_limit
    )
    try:
        url = served_url(printed)
        client = await RawClient.connect(url)
        frames = []
        for index in range(2000):
            frames += [Subscribe(2 * index + 1, f"typo.t{index}", {}, 1, {}), Cancel(2 * index + 1)]
        for start in range(0, len(frames), 1000):  # 500 at a time, within max_streams
            await client.send(*frames[start : start + 1000])
        async with rsnet.connect(url) as conn:
            for index in range(60):
                assert await publish(conn, f"t{index}", [index]) == 1
            assert [r["value"] for r in await take(conn, "t0", 1, **{"from": "earliest"})] == [0]
            assert len(await topic_names(url)) == 60
        assert stored(tmp_path) == sorted(f"t{index}" for index in range(60))
        assert process.returncode is None
        await client.aclose()
    finally:
        process.terminate()
        with trio.fail_after(10):
            await process.wait()


def test_max_open_topics_is_at_most_an_eighth_of_the_descriptor_limit():
    # A configured 100,000,000 was taken as it was, leaving connections no descriptors.
    from rsnet.broker.broker import default_max_open_topics

    assert Broker(max_open_topics=100_000_000).max_open_topics == default_max_open_topics()
    assert Broker(max_open_topics=3).max_open_topics == 3
