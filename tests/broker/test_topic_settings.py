"""Settings an administrator sets on a topic ($admin create/alter, rsnet.broker.overrides):
they win over the configuration, are stored with the topic and still apply after a restart,
and a damaged settings file does not stop the broker (the topic's retention is held).

Real brokers behind real servers on 127.0.0.1; a restart is a new Broker on the same data_dir.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import pathlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
import trio

import rsnet
from rsnet.broker.auth import Authorizer
from rsnet.broker.broker import Broker
from rsnet.broker.client import publish
from rsnet.broker.codes import BrokerCode
from rsnet.broker.config import load_config
from rsnet.broker.daemon import build_broker
from rsnet.broker.overrides import InvalidSettings, parse
from rsnet.broker.retired import FORGOTTEN_LINES_PER_MINUTE, RetiredOffsets
from rsnet.broker.storage import UncleanRecoveryNeeded
from rsnet.broker.storage.files import FileOps
from rsnet.broker.topic import now_ms
from rsnet.net import failures
from rsnet.protocol import ErrorCode

from .storage_faults import FaultyFiles
from .support import broker_running, take

HOUR = 3600.0


@contextlib.asynccontextmanager
async def configured(data_dir: pathlib.Path | None, **overrides: Any) -> AsyncIterator[tuple[Broker, rsnet.Client]]:
    """A broker as the daemon builds it (``jobs.>`` topics keep an hour, under backpressure),
    served on 127.0.0.1, and a client connected to it."""
    rules = [{"pattern": "jobs.>", "retention": {"max_age_s": HOUR}, "slow_subscriber": {"max_lag": 1000}}]
    values = {"data_dir": str(data_dir) if data_dir else None, "topics": rules, **overrides}
    config = load_config(None, {}, values)
    authorizer = Authorizer(config.auth)
    broker = build_broker(config, authorizer)
    async with broker_running(broker, authenticate=authorizer.authenticate) as url, rsnet.connect(url) as conn:
        yield broker, conn


async def admin(conn: rsnet.Client, action: str, topic: str, **params: Any) -> dict[str, Any]:
    answers = [answer async for answer in conn.subscribe("$admin", {"action": action, "topic": topic, **params})]
    assert len(answers) == 1
    return answers[0]


async def listing(conn: rsnet.Client) -> dict[str, dict[str, Any]]:
    return {entry["topic"]: entry async for entry in conn.subscribe("$topics")}


async def refused(conn: rsnet.Client, action: str, topic: str, **params: Any) -> rsnet.StreamError:
    with pytest.raises(rsnet.StreamError) as caught:
        await admin(conn, action, topic, **params)
    return caught.value


MEMORY_KEEPS_3 = {"storage": "memory", "retention": {"max_records": 3}}
DROP_PAST_5 = {"slow_subscriber": {"policy": "drop", "max_lag": 5}}


@pytest.mark.parametrize("changed_by", ["configuration", "settings file"])
async def test_a_durable_topic_stays_on_disk_when_its_storage_is_changed_to_memory_later(tmp_path, changed_by, caplog):
    # Attack round 4: opened in memory, the topic hid its 50 stored records and gave their
    # offsets to new ones. Storage is fixed at creation, whoever says otherwise since.
    async with configured(tmp_path) as (_, conn):
        assert await publish(conn, "jobs.kept", list(range(50))) == 50
    if changed_by == "configuration":
        rule = {"pattern": "jobs.kept", "storage": "memory"}
        later = configured(tmp_path, topics=[rule])
    else:
        (tmp_path / "jobs.kept" / "settings.json").write_text(
            json.dumps({"format": "rsnet-topic-settings", "version": 1, "settings": {"storage": "memory"}})
        )
        later = configured(tmp_path)
    async with later as (_, conn):
        topic = (await listing(conn))["jobs.kept"]
        assert topic["next_offset"] == 50
        assert topic["settings"]["storage"] == "durable" and topic["settings_from"]["storage"] == "creation"
        assert await publish(conn, "jobs.kept", ["new"], producer="p") == 1
        records = await take(conn, "jobs.kept", 51, **{"from": "earliest"})
        assert [(r["offset"], r["value"]) for r in records] == [*enumerate(range(50)), (50, "new")]
    assert "topic jobs.kept: kept on disk, as it was created" in caplog.text


async def test_settings_given_at_creation_win_over_the_configuration_after_a_restart(tmp_path):
    async with configured(tmp_path) as (broker, conn):
        answer = await admin(conn, "create", "jobs.recent", settings=MEMORY_KEEPS_3)
        assert answer["created"] is True
        assert answer["settings"] == {
            "storage": "memory",
            # A key given wins alone: the rule's age limit stays, its (absent) byte limit too.
            "retention": {"max_records": 3, "max_bytes": None, "max_age_s": HOUR},
            "slow_subscriber": {"policy": "backpressure", "max_lag": 1000},
        }
        assert answer["settings_from"] == {
            "storage": "topic",
            "retention.max_records": "topic",
            "retention.max_bytes": "[[topics]] jobs.>",
            "retention.max_age_s": "[[topics]] jobs.>",
            "slow_subscriber.policy": "[[topics]] jobs.>",
            "slow_subscriber.max_lag": "[[topics]] jobs.>",
        }
        slow = await admin(conn, "create", "jobs.slow", settings=DROP_PAST_5)
        assert slow["settings"]["storage"] == "durable"
        assert await publish(conn, "jobs.slow", ["kept"]) == 1
        stored = json.loads((tmp_path / "jobs.slow" / "settings.json").read_text())
        assert stored == {"format": "rsnet-topic-settings", "version": 1, "settings": DROP_PAST_5}

    # Restarted: the same configuration, and the topics' own settings read back first.
    async with configured(tmp_path) as (broker, conn):
        topics = await listing(conn)
        assert topics["jobs.recent"]["settings"] == answer["settings"]
        assert topics["jobs.recent"]["settings_from"] == answer["settings_from"]
        assert topics["jobs.recent"]["next_offset"] == 0  # a memory topic comes back empty, with its settings
        assert topics["jobs.slow"]["policy"] == "drop"
        assert topics["jobs.slow"]["next_offset"] == 1  # and a durable one with its records

        # Retention: at most 3 records kept (the configuration would keep an hour's worth).
        await publish(conn, "jobs.recent", list(range(10)))
        recent = broker.topics["jobs.recent"]
        recent.log.enforce_retention(now_ms())
        assert (recent.log.first_offset, recent.log.next_offset) == (7, 10)

        # Slow subscribers: dropped past a lag of 5 (the configuration would hold the producer).
        async with conn.subscribe("jobs.slow", {"from": "earliest"}, prefetch=2) as items:
            reader = items.__aiter__()
            assert (await reader.__anext__())["value"] == "kept"  # subscribed, and then it stalls
            await publish(conn, "jobs.slow", list(range(20)))  # takes its last demand
            await publish(conn, "jobs.slow", ["more"])  # finds it 20 behind, with no demand
            assert (await listing(conn))["jobs.slow"]["dropped"] > 0
            await expect_skips(reader, after=0)


async def expect_skips(reader: Any, after: int) -> None:
    """The reader's next records follow ``after`` with no gap but the ``skipped`` they announce,
    and at least one announces some (the drop policy)."""
    skipped = 0
    for _ in range(10):
        record = await reader.__anext__()
        assert record["offset"] == after + 1 + record.get("skipped", 0)
        after = record["offset"]
        skipped += record.get("skipped", 0)
        if skipped:
            return
    raise AssertionError("no record was skipped")


async def test_create_is_idempotent_for_the_same_settings_and_refuses_others(tmp_path):
    async with configured(tmp_path) as (_broker, conn):
        await admin(conn, "create", "jobs.a", settings=DROP_PAST_5)
        again = await admin(conn, "create", "jobs.a", settings=DROP_PAST_5)
        assert again["created"] is False
        plain = await admin(conn, "create", "jobs.a")  # nothing asked: nothing to disagree with
        assert plain["created"] is False and plain["settings"]["slow_subscriber"]["policy"] == "drop"
        # What the configuration gives already counts as the same.
        assert (await admin(conn, "create", "jobs.a", settings={"retention": {"max_age_s": HOUR}}))["created"] is False

        error = await refused(conn, "create", "jobs.a", settings={"slow_subscriber": {"policy": "disconnect"}})
        assert error.code == ErrorCode.REJECTED
        assert error.message == (
            "topic 'jobs.a' exists with other settings (slow_subscriber.policy is 'drop', not 'disconnect'): "
            "create does not change a topic, alter does"
        )
        assert (await listing(conn))["jobs.a"]["policy"] == "drop"


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (
            {"retention": {"max_records": 0}},
            "invalid settings: settings.retention.max_records: must be a whole number from 1 to "
            "4611686018427387904, or null for no limit; got 0",
        ),
        (
            {"slow_subscriber": {"policy": "block"}},
            "invalid settings: settings.slow_subscriber.policy: must be one of backpressure, drop, disconnect; "
            "got 'block'",
        ),
        (
            {"retention": {"max_age_s": -1, "max_recs": 5}},
            "invalid settings: settings.retention.max_age_s: must be a number of seconds above 0 and at most "
            "3153600000, or null for no limit; got -1; settings: unknown key 'retention.max_recs' (known: storage, "
            "retention.max_records, retention.max_bytes, retention.max_age_s, slow_subscriber.policy, "
            "slow_subscriber.max_lag)",
        ),
        ({"slow_subscriber": {"max_lag": True}}, "settings.slow_subscriber.max_lag: must be a whole number"),
        ([1], "invalid settings: settings: must be a map"),
    ],
)
async def test_invalid_settings_are_refused_naming_each_key(tmp_path, settings, message):
    async with configured(tmp_path) as (_broker, conn):
        error = await refused(conn, "create", "jobs.bad", settings=settings)
        assert error.code == ErrorCode.REJECTED and error.code_name == "REJECTED"
        assert message in error.message
        assert "jobs.bad" not in await listing(conn)
        assert not (tmp_path / "jobs.bad").exists()


async def test_durable_needs_a_data_dir():
    async with configured(None) as (_broker, conn):
        error = await refused(conn, "create", "jobs.x", settings={"storage": "durable"})
        assert error.code == ErrorCode.REJECTED
        assert error.message == (
            "settings.storage: 'durable' needs a broker with a data_dir (this one keeps every topic in memory)"
        )
        # Without a data_dir settings live in memory, as everything else.
        answer = await admin(conn, "create", "jobs.x", settings=DROP_PAST_5)
        assert answer["settings"]["storage"] == "memory"
        assert answer["settings_from"]["slow_subscriber.policy"] == "topic"


async def test_alter_applies_at_once_is_stored_and_reset_follows_the_configuration_again(tmp_path):
    async with configured(tmp_path) as (broker, conn):
        await admin(conn, "create", "jobs.live")
        await publish(conn, "jobs.live", ["first"])
        async with conn.subscribe("jobs.live", {"from": "earliest"}, prefetch=2) as items:
            reader = items.__aiter__()
            assert (await reader.__anext__())["offset"] == 0  # subscribed, and then it stalls
            await publish(conn, "jobs.live", list(range(10)))
            assert broker.topics["jobs.live"].dropped == 0  # backpressure: it is 10 behind, within 1000
            answer = await admin(conn, "alter", "jobs.live", settings=DROP_PAST_5)
            assert answer["changed"] == ["slow_subscriber.policy", "slow_subscriber.max_lag"]
            # Applied to the live reader at once: more than 5 behind, so records were skipped.
            assert broker.topics["jobs.live"].dropped > 0
            await expect_skips(reader, after=0)

        error = await refused(conn, "alter", "jobs.live", settings={"storage": "memory"})
        assert error.code == ErrorCode.REJECTED
        assert "the storage of 'jobs.live' is durable: it is fixed when a topic is created" in error.message
        assert (await refused(conn, "alter", "jobs.none", settings=DROP_PAST_5)).code == ErrorCode.UNKNOWN_PUBLISHER

        answer = await admin(conn, "alter", "jobs.live", settings={"retention": {"max_age_s": None}})
        assert answer["settings"]["retention"]["max_age_s"] is None
        assert broker.topics["jobs.live"].log.retention.max_age_ms is None

    async with configured(tmp_path) as (broker, conn):
        entry = (await listing(conn))["jobs.live"]
        assert entry["settings"]["slow_subscriber"] == {"policy": "drop", "max_lag": 5}
        assert entry["settings"]["retention"]["max_age_s"] is None
        answer = await admin(conn, "alter", "jobs.live", reset=["slow_subscriber.policy", "retention.max_age_s"])
        assert answer["changed"] == ["retention.max_age_s", "slow_subscriber.policy"]
        assert answer["settings_from"]["slow_subscriber.policy"] == "[[topics]] jobs.>"
        assert answer["settings_from"]["slow_subscriber.max_lag"] == "topic"
        assert answer["settings"]["retention"]["max_age_s"] == HOUR
        stored = json.loads((tmp_path / "jobs.live" / "settings.json").read_text())
        assert stored["settings"] == {"slow_subscriber": {"max_lag": 5}}
        await admin(conn, "alter", "jobs.live", reset=["slow_subscriber.max_lag"])
        assert not (tmp_path / "jobs.live" / "settings.json").exists()  # nothing of its own left


async def test_purge_keeps_the_settings_and_delete_removes_them(tmp_path):
    async with configured(tmp_path) as (_broker, conn):
        await admin(conn, "create", "jobs.p", settings=MEMORY_KEEPS_3)
        await publish(conn, "jobs.p", [1, 2])
        purged = await admin(conn, "purge", "jobs.p")
        assert purged["removed"] == 2
        entry = (await listing(conn))["jobs.p"]
        assert entry["settings"]["storage"] == "memory" and entry["settings_from"]["retention.max_records"] == "topic"
        assert (tmp_path / "jobs.p" / "settings.json").exists()
        await admin(conn, "delete", "jobs.p")
        assert not (tmp_path / "jobs.p").exists()
        created = await admin(conn, "create", "jobs.p")  # a new topic: the configuration's settings
        assert created["settings_from"]["storage"] == "built-in"
        assert created["settings"]["storage"] == "durable"


@pytest.mark.parametrize("storage", ["memory", "durable"])
async def test_a_purge_keeps_the_offsets_so_no_reader_gets_other_data_under_an_old_one(tmp_path, storage):
    # As JetStream's stream purge and Kafka's delete-records: the records go, the offsets stay.
    async with configured(tmp_path) as (_broker, conn):
        await admin(conn, "create", "jobs.q", settings={"storage": storage})
        await publish(conn, "jobs.q", [0, 1, 2, 3])
        async with (
            conn.subscribe("jobs.q", {"from": "earliest"}, prefetch=1) as lagging,
            conn.subscribe("jobs.q", {"from": 3}) as live,
        ):
            assert (await lagging.__anext__())["offset"] == 0
            assert (await live.__anext__())["offset"] == 3  # at the end now, waiting
            purged = await admin(conn, "purge", "jobs.q")
            assert (purged["removed"], purged["next_offset"]) == (4, 4)
            await publish(conn, "jobs.q", ["after"], producer="p")
            record = await live.__anext__()  # the live reader carries on
            assert (record["offset"], record["value"]) == (4, "after")
            with pytest.raises(rsnet.StreamError) as behind:  # at most one more in flight, then told
                async for record in lagging:
                    assert record["offset"] == 1
            assert behind.value.code == BrokerCode.OFFSET_TRIMMED
        with pytest.raises(rsnet.StreamError) as resumed:  # a stored position behind the start
            await take(conn, "jobs.q", 1, **{"from": 2})
        assert resumed.value.code == BrokerCode.OFFSET_TRIMMED
        entry = (await listing(conn))["jobs.q"]
        assert (entry["first_offset"], entry["next_offset"]) == (4, 5)
    if storage == "durable":
        async with configured(tmp_path) as (_broker, conn):  # and across a restart
            await publish(conn, "jobs.q", ["later"], producer="p", first_sequence=1)
            assert [(r["offset"], r["value"]) for r in await take(conn, "jobs.q", 2, **{"from": "earliest"})] == [
                (4, "after"),
                (5, "later"),
            ]


@pytest.mark.parametrize("storage", ["in memory", "durable"])
async def test_a_pattern_subscription_goes_on_through_the_delete_of_a_topic_it_follows(tmp_path, storage):
    # Attack round 6: deleting one topic ended every pattern subscription that matched it.
    data_dir = tmp_path if storage == "durable" else None
    async with configured(data_dir) as (broker, conn):
        await publish(conn, "jobs.a", ["a0"])
        await publish(conn, "jobs.b", ["b0"])
        async with (
            conn.subscribe("jobs.>", {"from": "earliest"}) as pattern,
            conn.subscribe("jobs.a", {"from": "earliest"}) as plain,
        ):
            assert sorted([(await anext(pattern))["value"], (await anext(pattern))["value"]]) == ["a0", "b0"]
            assert (await anext(plain))["value"] == "a0"
            await admin(conn, "delete", "jobs.a")
            with pytest.raises(rsnet.StreamError) as ended:  # a subscription to the topic itself ends
                await anext(plain)
            assert ended.value.code == ErrorCode.UNKNOWN_PUBLISHER
            await publish(conn, "jobs.b", ["b1"], producer="again")
            record = await anext(pattern)
            assert (record["topic"], record["value"]) == ("jobs.b", "b1")
            await publish(conn, "jobs.a", ["a-new"], producer="again")  # created again: followed again
            record = await anext(pattern)
            assert (record["topic"], record["offset"], record["value"]) == ("jobs.a", 1, "a-new")
            assert broker.pattern_subscriptions()  # (still running)


@pytest.mark.parametrize("storage", ["in memory", "durable"])
async def test_a_topic_created_again_after_a_delete_goes_on_from_the_deleted_ones_offsets(tmp_path, storage):
    # A reader holding a position in the deleted topic (a Spark checkpoint, say) is told its
    # records are gone, never handed the new topic's records under offsets it had read.
    data_dir = tmp_path if storage == "durable" else None
    async with configured(data_dir) as (_broker, conn):
        await publish(conn, "jobs.d", [0, 1, 2])
        deleted = await admin(conn, "delete", "jobs.d")
        assert (deleted["removed"], deleted["next_offset"]) == (3, 3)
        await publish(conn, "jobs.d", ["new"])  # created again by publishing
        assert [(r["offset"], r["value"]) for r in await take(conn, "jobs.d", 1, **{"from": "earliest"})] == [
            (3, "new")
        ]
        with pytest.raises(rsnet.StreamError) as resumed:
            await take(conn, "jobs.d", 1, **{"from": 1})
        assert resumed.value.code == BrokerCode.OFFSET_TRIMMED
        assert (await admin(conn, "delete", "jobs.d"))["next_offset"] == 4
        assert (await admin(conn, "create", "jobs.d"))["next_offset"] == 4  # by $admin too
        await admin(conn, "delete", "jobs.d")
    if storage == "durable":
        async with configured(tmp_path) as (_broker, conn):  # kept across a restart
            created = await admin(conn, "create", "jobs.d")
            assert (created["created"], created["next_offset"]) == (True, 4)
            await publish(conn, "jobs.d", ["later"])
            entry = (await listing(conn))["jobs.d"]
            assert (entry["first_offset"], entry["next_offset"]) == (4, 5)
        async with configured(tmp_path) as (_broker, conn):  # and the created topic keeps it
            assert [r["offset"] for r in await take(conn, "jobs.d", 1, **{"from": "earliest"})] == [4]


async def test_a_deleted_topic_not_yet_created_again_answers_stored_positions_by_its_offsets(tmp_path):
    # Before the topic exists again, its first offset is the deleted one's next (3): a reader
    # resuming there waits for it, one behind it is told its records are gone, one past it
    # that it does not exist yet. They got OFFSET_OUT_OF_RANGE with "next": 0 (and from 0 a
    # silent wait that then read offset 3). The $acks of its producers end with it too.
    async with configured(tmp_path) as (_broker, conn):
        await publish(conn, "jobs.gone", [0, 1, 2], producer="p")
        async with conn.subscribe("$acks", {"producer": "p", "topic": "jobs.gone"}) as acks:
            assert (await acks.__anext__())["sequence"] == 2
            await admin(conn, "delete", "jobs.gone")
            with pytest.raises(rsnet.StreamError) as ended:
                await acks.__anext__()
            assert ended.value.code == ErrorCode.UNKNOWN_PUBLISHER
        for start in (0, 1):
            with pytest.raises(rsnet.StreamError) as behind:
                await take(conn, "jobs.gone", 1, **{"from": start})
            assert behind.value.code == BrokerCode.OFFSET_TRIMMED and behind.value.data["first_available"] == 3
        with pytest.raises(rsnet.StreamError) as past:
            await take(conn, "jobs.gone", 1, **{"from": 4})
        assert past.value.code == BrokerCode.OFFSET_OUT_OF_RANGE and past.value.data["next"] == 3
        async with conn.subscribe("jobs.gone", {"from": 3}) as waiting:
            await publish(conn, "jobs.gone", ["again"], producer="q")
            assert [(r["offset"], r["value"]) for r in [await waiting.__anext__()]] == [(3, "again")]


async def test_a_topic_with_the_longest_name_is_deleted(tmp_path):
    # Its directory was renamed to ".deleted-<name>.<ms>", too long for a file name: the
    # delete failed with INTERNAL halfway (its streams ended, the topic gone from memory but
    # not from disk), and the next publish brought its records back.
    name = "jobs." + "n" * 250
    async with configured(tmp_path) as (_broker, conn):
        await publish(conn, name, [0, 1])
        assert (await admin(conn, "delete", name))["removed"] == 2
        assert not (tmp_path / name).exists() and not list(tmp_path.glob(".deleted-*"))
        await publish(conn, name, ["new"])
        assert [(r["offset"], r["value"]) for r in await take(conn, name, 1, **{"from": "earliest"})] == [(2, "new")]


async def test_a_delete_whose_directory_cannot_be_moved_deletes_nothing(tmp_path):
    async with configured(tmp_path) as (broker, conn):
        await publish(conn, "jobs.stuck", [0, 1], producer="p")
        faults = FaultyFiles()
        broker.storage_files = faults
        faults.fail("replace", errno.EIO, suffix="", under=tmp_path / ".deleted-jobs.stuck")
        async with conn.subscribe("jobs.stuck", {"from": "earliest"}) as reader:
            assert (await reader.__anext__())["value"] == 0
            error = await refused(conn, "delete", "jobs.stuck")
            assert error.code == BrokerCode.STORAGE_ERROR
            assert "'jobs.stuck' was not deleted: its directory cannot be moved" in error.message
            with pytest.raises(rsnet.StreamError) as ended:  # its streams end, told why
                async for _ in reader:
                    pass
            assert ended.value.code == BrokerCode.STORAGE_ERROR
        faults.heal()
        assert [r["value"] for r in await take(conn, "jobs.stuck", 2, **{"from": "earliest"})] == [0, 1]
        await publish(conn, "jobs.stuck", [2], producer="p", first_sequence=2)
        assert (await listing(conn))["jobs.stuck"]["next_offset"] == 3
        assert (await admin(conn, "delete", "jobs.stuck"))["next_offset"] == 3


async def test_a_create_that_a_crash_cut_short_leaves_no_topic_with_other_settings(tmp_path):
    # Killed after the topic's directory was made, before its settings were stored: the next
    # start opened it as a topic with the configuration's settings (durable where memory was
    # asked), and the create, retried, was refused as asking for other settings.
    (tmp_path / "jobs.half").mkdir()
    (tmp_path / "jobs.half" / "settings.json.tmp").write_text('{"format": "rsnet-topic-set')
    (tmp_path / "jobs.half" / "lock").write_bytes(b"")
    (tmp_path / "jobs.was").mkdir()  # a log that lost every segment is not taken for one
    (tmp_path / "jobs.was" / "synced").write_bytes(b"")
    async with configured(tmp_path) as (_broker, conn):
        assert not (tmp_path / "jobs.half").exists()
        assert "jobs.half" not in await listing(conn) and "jobs.was" in await listing(conn)
        created = await admin(conn, "create", "jobs.half", settings=MEMORY_KEEPS_3)
        assert created["created"] and created["settings"]["storage"] == "memory"


async def test_a_delete_whose_offsets_cannot_be_kept_deletes_nothing(tmp_path):
    async with configured(tmp_path) as (broker, conn):
        await publish(conn, "jobs.full", [0, 1])
        faults = FaultyFiles()
        broker.storage_files = faults
        faults.fail("write_all", errno.ENOSPC, suffix=".retired.tmp")
        error = await refused(conn, "delete", "jobs.full")
        assert error.code == BrokerCode.STORAGE_FULL
        assert "'jobs.full' was not deleted: its next offset cannot be kept" in error.message
        assert [r["value"] for r in await take(conn, "jobs.full", 2, **{"from": "earliest"})] == [0, 1]
        assert not (tmp_path / ".retired.tmp").exists()
        faults.heal()
        assert (await admin(conn, "delete", "jobs.full"))["next_offset"] == 2


async def test_a_broker_stopped_partway_through_a_delete_or_a_new_start_keeps_its_offsets(tmp_path):
    async with configured(tmp_path) as (broker, conn):
        await publish(conn, "jobs.kept", [0, 1])
        await admin(conn, "create", "jobs.empty")
        # Stopped after keeping the offset, before the directory went: the topic is still there.
        broker.retired.retire("jobs.kept", 2, broker.storage_files)
    # Stopped in a new start's advance (its segment removed, the new one not yet written).
    for segment in (tmp_path / "jobs.empty").glob("*.log"):
        segment.unlink()
    RetiredOffsets(str(tmp_path)).retire("jobs.empty", 7, FileOps())
    async with configured(tmp_path) as (broker, conn):
        await publish(conn, "jobs.kept", [2])
        assert [r["offset"] for r in await take(conn, "jobs.kept", 3, **{"from": "earliest"})] == [0, 1, 2]
        entry = (await listing(conn))["jobs.empty"]
        assert (entry["first_offset"], entry["next_offset"]) == (7, 7)
        assert len(broker.retired) == 0  # each entry has done its work


def test_deletions_beyond_the_kept_offsets_write_a_bounded_number_of_lines(tmp_path, caplog, monkeypatch):
    """Attack round 7: past MAX_RETIRED deletions, each one logged a warning (12,000 creates
    and deletes in 4 s: 2,000 lines in a second), and topics that never held a record (offset
    0) were kept too, pushing out the offsets of real ones."""
    now = [1000.0]
    monkeypatch.setattr(failures.time, "monotonic", lambda: now[0])
    retired = RetiredOffsets(str(tmp_path), limit=5)
    for index in range(50):
        retired.retire(f"empty.{index}", 0, FileOps())
    assert len(retired) == 0  # nothing to keep: created again, they start at 0 anyway
    with caplog.at_level(logging.WARNING, logger="rsnet.broker.retired"):
        for index in range(50):
            retired.retire(f"used.{index}", index + 1, FileOps())
        assert len(retired) == 5 and retired.get("used.49") == 50 and retired.get("used.44") is None
        assert len(caplog.records) == FORGOTTEN_LINES_PER_MINUTE  # of 45 forgotten
        now[0] += 61
        retired.retire("used.50", 51, FileOps())
    assert caplog.records[-2].getMessage() == (
        f"{45 - FORGOTTEN_LINES_PER_MINUTE} more deleted topics' next offsets were forgotten in the last minute"
    )


@pytest.mark.parametrize("damage", ["flipped byte", "directory", "fifo", "dangling link"])
async def test_a_file_of_deleted_topics_offsets_that_cannot_be_read_stops_the_start(tmp_path, caplog, damage):
    # Going on without it would let a topic created again give its offsets to other records:
    # as for damage recovery cannot place, the start stops unless unclean_recovery (it was set
    # aside at once; a FIFO in its place hung the start, a directory stopped it bare).
    async with configured(tmp_path) as (_broker, conn):
        await publish(conn, "jobs.a", [0])
        await admin(conn, "delete", "jobs.a")
    retired = tmp_path / ".retired"
    if damage == "flipped byte":
        data = bytearray(retired.read_bytes())
        data[-1] ^= 0xFF
        retired.write_bytes(bytes(data))
    else:
        retired.unlink()
        if damage == "directory":
            retired.mkdir()
        elif damage == "fifo":
            os.mkfifo(retired)
        else:
            retired.symlink_to(tmp_path / "unmounted" / "retired")
    async with trio.open_nursery() as nursery:
        with pytest.raises(UncleanRecoveryNeeded, match=r"\.retired: the next offsets of deleted topics cannot be"):
            await nursery.start(Broker(data_dir=tmp_path).run)
    assert os.path.lexists(retired)  # nothing changed
    with caplog.at_level(logging.ERROR, "rsnet.broker"):
        async with configured(tmp_path, unclean_recovery=True) as (_broker, conn):
            assert (await admin(conn, "create", "jobs.a"))["next_offset"] == 0
    assert len(list(tmp_path.glob(".retired.corrupt-*"))) == 1 and not (tmp_path / ".retired").is_dir()
    assert "unclean_recovery: moved to .retired.corrupt-" in caplog.text
    assert str(tmp_path / ".retired") in caplog.text and "is not a topic" not in caplog.text


def test_the_offsets_of_the_oldest_deletions_go_past_the_bound(tmp_path, caplog):
    retired = RetiredOffsets(str(tmp_path), limit=2)
    for name, offset in [("a", 5), ("b", 6), ("a", 3), ("c", 7)]:
        retired.retire(name, offset, FileOps())
    reopened = RetiredOffsets(str(tmp_path), limit=2)
    assert [reopened.get(name) for name in "abc"] == [5, None, 7]  # a: the higher kept, moved last
    assert "the next offset of deleted topic b (6) is forgotten" in caplog.text


async def test_a_delete_that_fails_partway_leaves_no_remains_that_stop_the_next_start(tmp_path, monkeypatch):
    """The topic's directory leaves the topics' place in one rename, then is removed: if the
    removal fails partway (an unlink error, or the broker killed), what is left is not a
    damaged log the next start refuses to start on, and that start removes it."""
    async with configured(tmp_path) as (_broker, conn):
        await publish(conn, "jobs.a", list(range(100)))
        await publish(conn, "jobs.b", [1, 2, 3])

        def fails_partway(path, *args, **kwargs):
            next(pathlib.Path(path).glob("*.log")).unlink()  # one file gone, the rest stays
            raise PermissionError(errno.EPERM, "Operation not permitted", "synced")

        monkeypatch.setattr("rsnet.broker.broker.shutil.rmtree", fails_partway)
        await admin(conn, "delete", "jobs.a")  # the topic is gone for clients all the same
        assert "jobs.a" not in await listing(conn)
    monkeypatch.undo()
    (left,) = (p.name for p in tmp_path.iterdir() if p.name.startswith(".deleted-jobs.a."))
    async with configured(tmp_path) as (_broker, conn):  # starts; was: UncleanRecoveryNeeded
        assert set(await listing(conn)) == {"jobs.b"}
        assert [r["value"] for r in await take(conn, "jobs.b", 3, **{"from": "earliest"})] == [1, 2, 3]
    assert not (tmp_path / left).exists()


async def test_a_memory_topic_with_no_settings_of_its_own_left_leaves_no_directory(tmp_path):
    async with configured(tmp_path, topics=[{"pattern": "mem.>", "storage": "memory"}]) as (_broker, conn):
        await admin(conn, "create", "mem.a", settings=DROP_PAST_5)
        assert (tmp_path / "mem.a" / "settings.json").exists()  # so it comes back after a restart
        await admin(conn, "alter", "mem.a", reset=["slow_subscriber.policy", "slow_subscriber.max_lag"])
        assert not (tmp_path / "mem.a").exists()  # a plain memory topic again: gone with the broker
        assert (await listing(conn))["mem.a"]["settings_from"]["storage"] == "[[topics]] mem.>"


DAMAGE = {
    "not JSON": (b'{"format": "rsnet-topic-settings", "vers', "not valid JSON"),
    "newer version": (
        b'{"format": "rsnet-topic-settings", "version": 2, "settings": {}}',
        "version 2 is not one this broker reads (it reads 1)",
    ),
    "invalid value": (
        b'{"format": "rsnet-topic-settings", "version": 1, "settings": {"retention": {"max_records": -3}}}',
        "settings.retention.max_records: must be a whole number",
    ),
    # Valid JSON, crafted (attack round 4): a traceback and a stopped start, or a start stopped
    # without naming the file.
    "nested 5,000 deep": (b"[" * 5000 + b"]" * 5000, "JSON nested too deep"),
    "an integer of 5,000 digits": (
        b'{"format": "rsnet-topic-settings", "version": 1, "settings": {"retention": {"max_records": '
        + b"9" * 5000
        + b"}}}",
        "not valid JSON (Exceeds the limit (4300 digits)",
    ),
}


@pytest.mark.parametrize("damage", DAMAGE)
async def test_a_damaged_settings_file_holds_retention_and_does_not_stop_the_broker(tmp_path, caplog, damage):
    content, problem = DAMAGE[damage]
    # The configuration removes records after a millisecond: nothing is kept on a guess.
    rules = [{"pattern": "jobs.>", "retention": {"max_age_s": 0.001}}]
    async with configured(tmp_path, topics=rules) as (broker, conn):
        await admin(conn, "create", "jobs.kept", settings={"retention": {"max_age_s": None}})
        await admin(conn, "create", "jobs.control")
        for topic in ("jobs.kept", "jobs.control"):
            await publish(conn, topic, ["a", "b"])
    settings_file = tmp_path / "jobs.kept" / "settings.json"
    settings_file.write_bytes(content)

    with caplog.at_level(logging.ERROR, logger="rsnet.broker"):
        async with configured(tmp_path, topics=rules) as (broker, conn):
            logged = [r.getMessage() for r in caplog.records if "its settings cannot be used" in r.getMessage()]
            assert len(logged) == 1 and problem in logged[0] and str(settings_file) in logged[0]
            entry = (await listing(conn))["jobs.kept"]
            assert problem in entry["settings_error"]
            assert entry["settings"]["retention"] == {"max_records": None, "max_bytes": None, "max_age_s": None}
            assert entry["settings_from"]["retention.max_age_s"] == "held: settings.json unusable"
            assert entry["settings_from"]["slow_subscriber.policy"] == "built-in"
            assert "settings_error" not in (await listing(conn))["jobs.control"]

            later = now_ms() + 60_000
            for name in ("jobs.kept", "jobs.control"):
                topic = broker.topic(name, create=False)
                assert topic is not None
                topic.log.enforce_retention(later)
            assert broker.topics["jobs.control"].log.first_offset == 2  # the configuration's retention applies
            assert [r["value"] for r in await take(conn, "jobs.kept", 2, **{"from": "earliest"})] == ["a", "b"]
            assert settings_file.read_bytes() == content  # left for the operator

            # create cannot confirm settings it cannot read; alter replaces them.
            assert (await refused(conn, "create", "jobs.kept", settings=DROP_PAST_5)).code == ErrorCode.REJECTED
            answer = await admin(conn, "alter", "jobs.kept", settings={"retention": {"max_age_s": None}})
            assert "settings_error" not in answer
            assert answer["settings_from"]["retention.max_age_s"] == "topic"
            assert answer["settings_from"]["retention.max_records"] == "[[topics]] jobs.>"
            assert json.loads(settings_file.read_text())["settings"] == {"retention": {"max_age_s": None}}


async def test_settings_that_cannot_be_stored_create_nothing(tmp_path):
    async with configured(tmp_path) as (broker, conn):
        faults = FaultyFiles()
        broker.storage_files = faults
        faults.fail("write_all", errno.ENOSPC, suffix="settings.json.tmp")
        error = await refused(conn, "create", "jobs.full", settings=DROP_PAST_5)
        assert error.code == BrokerCode.STORAGE_FULL and error.code_name == "STORAGE_FULL"
        assert "the settings of 'jobs.full' cannot be stored" in error.message
        assert "jobs.full" not in await listing(conn)
        assert not (tmp_path / "jobs.full" / "settings.json.tmp").exists()
        faults.heal()
        assert (await admin(conn, "create", "jobs.full", settings=DROP_PAST_5))["created"] is True


def test_parse_reads_what_nest_writes():
    values = parse({"storage": "durable", "retention": {"max_bytes": None, "max_age_s": 1.5}})
    assert values == {"storage": "durable", "retention.max_bytes": None, "retention.max_age_s": 1.5}
    with pytest.raises(InvalidSettings) as caught:
        parse({"retention": 5, "slow_subscriber": {"max_lag": 0}, "color": "red"})
    assert caught.value.problems == [
        "settings.retention: must be a map",
        "settings.slow_subscriber.max_lag: must be a whole number from 1 to 4611686018427387904; got 0",
        "settings: unknown key 'color' (known: storage, retention.max_records, retention.max_bytes, "
        "retention.max_age_s, slow_subscriber.policy, slow_subscriber.max_lag)",
    ]


async def test_an_invalid_request_is_answered_with_a_bounded_error(tmp_path):
    """However much is wrong, the answer lists 20 problems and counts the rest, and echoes
    values shortened (server/README, "error messages the broker writes")."""
    async with broker_running(Broker(data_dir=tmp_path)) as url, rsnet.connect(url) as conn:
        error = await refused(conn, "create", "jobs.a", settings={f"key{n}": n for n in range(20_000)})
        assert error.code == ErrorCode.REJECTED
        assert len(error.data["problems"]) == 21 and error.data["problems"][-1] == "and 19980 more problems"
        assert len(error.message) < 4096 and "[truncated]" not in error.message
        error = await refused(conn, "create", "jobs.a", settings={"retention": {"max_records": "x" * 100_000}})
        assert len(error.message) < 400
        error = await refused(conn, "y" * 100_000, "jobs.a")
        assert len(error.message) < 200
