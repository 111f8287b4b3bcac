"""The broker fsyncs durable topics in worker threads, never in its event loop (issue 13).

An in-process broker on 127.0.0.1 (fsync ``always``, its default) whose logs change their files
through :class:`GatedFiles`: a test holds one topic's fsync and looks at what happens while it
is in flight. Acknowledged means stored: nothing is acknowledged or delivered before the fsync
covering it has returned, and everything else (other topics, the connection) goes on.
"""

from __future__ import annotations

import errno
import logging
import pathlib
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio
import trio.testing

import rsnet
from rsnet.broker.broker import Broker, TopicSettings
from rsnet.broker.client import publish
from rsnet.broker.codes import BrokerCode
from rsnet.broker.storage import FsyncPolicy, Retention, SegmentLog, synced_mark
from rsnet.broker.topic import now_ms
from rsnet.streams import from_iterable

from .storage_faults import GatedFiles, open_descriptors, stored_values
from .support import broker_serving


async def until(condition: Callable[[], bool]) -> None:
    """Wait until ``condition()`` holds (checked every millisecond: a state, not a timing)."""
    with trio.fail_after(10):
        while not condition():
            await trio.sleep(0.001)


async def entered(files: GatedFiles) -> None:
    """Wait until a held fsync has started (in the broker's worker thread)."""
    assert await trio.to_thread.run_sync(files.entered.wait, 10), "no fsync was held"


async def collect(
    conn: rsnet.Client, name: str, params: dict[str, Any], into: list[Any], *, task_status: trio.TaskStatus[None]
) -> None:
    async with conn.subscribe(name, params, prefetch=1024) as items:
        task_status.started()
        async for item in items:
            into.append(item)


async def offer(conn: rsnet.Client, topic: str, records: list[Any], producer: str, sequence: int) -> None:
    """Send ``records`` without waiting for their acknowledgement."""
    await conn.offer(topic, from_iterable(records), {"producer": producer, "sequence": sequence})


def gated_broker(tmp_path: pathlib.Path) -> tuple[Broker, GatedFiles]:
    files = GatedFiles()
    broker = Broker(data_dir=tmp_path)  # fsync always
    broker.storage_files = files
    return broker, files


def interval_broker(tmp_path: pathlib.Path, settings: TopicSettings | None = None) -> tuple[Broker, GatedFiles]:
    """A broker syncing every 10 ms (fsync interval), its files gated; every topic ``settings``
    if given, else the broker's defaults."""
    files = GatedFiles()
    broker = Broker(
        data_dir=tmp_path,
        fsync=FsyncPolicy.INTERVAL,
        fsync_interval=0.01,
        settings_for=None if settings is None else lambda name: settings,
    )
    broker.storage_files = files
    return broker, files


@asynccontextmanager
async def serving_gated(tmp_path: pathlib.Path) -> AsyncIterator[tuple[Broker, GatedFiles, rsnet.Client]]:
    """A gated broker, served, and a connection to it; a test that fails while it holds an
    fsync has it released first, so the broker's shutdown does not wait for it."""
    broker, files = gated_broker(tmp_path)
    async with broker_serving(broker) as (url, _), rsnet.connect(url) as conn:
        try:
            yield broker, files, conn
        finally:
            files.release()


async def test_an_acks_opened_while_its_records_fsync_runs_waits_for_the_fsync(tmp_path: pathlib.Path) -> None:
    # A producer that opens $acks after offering (a reconnecting one, or the blocking
    # publish) was told at once the last sequence written, before its records were durable:
    # lost records after a failed fsync or a power cut, acknowledged.
    async with serving_gated(tmp_path) as (broker, files, conn), trio.open_nursery() as nursery:
        await publish(conn, "t", ["a0"], producer="p")
        files.hold(tmp_path / "t")
        nursery.start_soon(offer, conn, "t", ["a1", "a2"], "p", 1)
        await entered(files)
        topic = broker.topics["t"]
        await until(lambda: topic.log.next_offset == 3)  # written, its fsync held
        acks: list[Any] = []
        await nursery.start(collect, conn, "$acks", {"producer": "p", "topic": "t"}, acks)
        await trio.testing.wait_all_tasks_blocked()
        assert acks == [] and topic.log.durable_offset == 1
        files.release()
        await until(lambda: bool(acks))
        assert acks[0]["sequence"] == 2 and topic.log.durable_offset == 3
        nursery.cancel_scope.cancel()


async def test_records_an_acks_waited_for_that_a_failed_fsync_cut_are_never_acknowledged(
    tmp_path: pathlib.Path,
) -> None:
    # The waiting first item is given up when the fsync fails (the records are cut, and their
    # offsets go to other records): the $acks hears of the failure, never of a1 and a2, even
    # once other records made the log as long again.
    broker, files = gated_broker(tmp_path)
    acks: list[Any] = []

    async def acknowledgements(*, task_status: trio.TaskStatus[None]) -> None:
        with pytest.raises(rsnet.StreamError) as failed:
            await collect(conn, "$acks", {"producer": "p", "topic": "t"}, acks, task_status=task_status)
        acks.append(failed.value.code_name)

    async with (
        broker_serving(broker) as (url, _),
        rsnet.connect(url) as conn,
        trio.open_nursery() as nursery,
    ):
        await publish(conn, "t", ["a0"], producer="p")
        files.hold(tmp_path / "t")
        files.fail("datasync", errno.EIO, under=tmp_path / "t", times=1)
        async with rsnet.connect(url) as gone:
            nursery.start_soon(offer, gone, "t", ["a1", "a2"], "p", 1)
            await entered(files)
            topic = broker.topics["t"]
            await until(lambda: topic.log.next_offset == 3)
        await nursery.start(acknowledgements)
        await trio.testing.wait_all_tasks_blocked()
        assert acks == []  # a1 and a2 are written, not durable
        files.release()  # the fsync fails: they are cut
        await until(lambda: topic.log.next_offset == 1)
        files.heal()
        again: list[Any] = []  # p, reconnecting, asks where to resume
        await nursery.start(collect, conn, "$acks", {"producer": "p", "topic": "t"}, again)
        await publish(conn, "t", ["b1", "b2"], producer="q")  # offsets 1 and 2 again, durable
        await trio.testing.wait_all_tasks_blocked()
        assert acks == ["STORAGE_ERROR"]
        assert [ack["sequence"] for ack in again] == [0]  # a0's: a1 and a2 are to be sent again
        assert [r.value for r in topic.log.read(0, 3)] == ["a0", "b1", "b2"]
        nursery.cancel_scope.cancel()


async def test_while_a_topics_fsync_runs_nothing_of_it_is_acknowledged_or_delivered_and_other_topics_go_on(
    tmp_path: pathlib.Path,
) -> None:
    async with serving_gated(tmp_path) as (broker, files, conn), trio.open_nursery() as nursery:
        await publish(conn, "slow", ["s0"], producer="p")
        await publish(conn, "fast", ["f0"], producer="q")
        slow_records: list[Any] = []
        acks: list[Any] = []
        fast_records: list[Any] = []
        await nursery.start(collect, conn, "slow", {"from": "earliest"}, slow_records)
        await nursery.start(collect, conn, "$acks", {"producer": "p", "topic": "slow"}, acks)
        await nursery.start(collect, conn, "fast", {"from": "earliest"}, fast_records)
        await until(lambda: len(slow_records) == 1 and len(acks) == 1 and len(fast_records) == 1)
        assert acks[0]["sequence"] == 0
        slow = broker.topics["slow"]

        files.hold(tmp_path / "slow")
        nursery.start_soon(offer, conn, "slow", ["s1", "s2", "s3"], "p", 1)
        await entered(files)
        await until(lambda: slow.log.next_offset == 4)  # written while its fsync is held

        # The event loop is free: another durable topic stores (its fsync in another thread),
        # acknowledges and delivers, on the same connection.
        await publish(conn, "fast", ["f1", "f2"], producer="q", first_sequence=1)
        await until(lambda: len(fast_records) == 3)
        await trio.testing.wait_all_tasks_blocked()
        assert slow.log.durable_offset == 1
        assert [r["value"] for r in slow_records] == ["s0"] and len(acks) == 1  # nothing before the fsync

        files.release()
        await until(lambda: len(slow_records) == 4 and acks[-1]["sequence"] == 3)
        assert [r["value"] for r in slow_records] == ["s0", "s1", "s2", "s3"]
        assert [r["value"] for r in fast_records] == ["f0", "f1", "f2"]
        nursery.cancel_scope.cancel()


async def test_appends_made_during_one_fsync_are_all_covered_by_the_next_one(tmp_path: pathlib.Path) -> None:
    directory = tmp_path / "slow"
    async with serving_gated(tmp_path) as (broker, files, conn), trio.open_nursery() as nursery:
        await publish(conn, "slow", ["s0"], producer="p")
        slow = broker.topics["slow"]
        files.hold(directory)
        syncs = files.syncs_under(directory)
        writes = files.calls.count("write_all")
        nursery.start_soon(offer, conn, "slow", ["s1"], "p", 1)
        await entered(files)  # the first fsync, for s1, is in flight
        for n in range(4):  # four producers, one append each at least (the writer appends per producer)
            nursery.start_soon(offer, conn, "slow", [f"{n}-{i}" for i in range(5)], f"producer-{n}", 0)
        await until(lambda: slow.log.next_offset == 22)
        assert files.calls.count("write_all") - writes >= 5 and slow.log.durable_offset == 1
        files.release()
        await until(lambda: slow.log.durable_offset == 22)
        assert files.syncs_under(directory) - syncs == 2  # the one held, then one for the other 20 records
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize(
    ("error", "code"), [(errno.EIO, BrokerCode.STORAGE_ERROR), (errno.ENOSPC, BrokerCode.STORAGE_FULL)]
)
async def test_an_fsync_failing_in_its_thread_refuses_the_producers_and_keeps_what_was_acknowledged(
    tmp_path: pathlib.Path, error: int, code: BrokerCode
) -> None:
    directory = tmp_path / "slow"
    async with serving_gated(tmp_path) as (broker, files, conn):
        await publish(conn, "slow", ["s0"], producer="p")
        slow = broker.topics["slow"]
        files.hold(directory)
        refused: list[rsnet.StreamError] = []

        async def refused_publish(records: list[Any], producer: str, first_sequence: int) -> None:
            with pytest.raises(rsnet.StreamError) as raised:
                await publish(conn, "slow", records, producer=producer, first_sequence=first_sequence)
            refused.append(raised.value)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(refused_publish, ["s1", "s2", "s3"], "p", 1)
            await entered(files)
            nursery.start_soon(refused_publish, ["q0"], "q", 0)  # appended while the fsync runs
            await until(lambda: slow.log.next_offset == 5)
            files.fail("datasync", error, under=directory, times=1)
            files.release()
        assert [refusal.code for refusal in refused] == [code] * 2
        # Rolled back to what the last successful fsync made durable: s0. Nothing else was
        # acknowledged, so nothing acknowledged is lost, and offset 1 is free for a resend.
        assert (slow.log.next_offset, slow.log.durable_offset) == (1, 1)
        await publish(conn, "slow", ["s1", "s2", "s3"], producer="p", first_sequence=1)

    assert stored_values(directory) == ["s0", "s1", "s2", "s3"]  # a reopen finds every acknowledged record
    async with broker_serving(Broker(data_dir=tmp_path)) as (url, _), rsnet.connect(url) as conn:
        records = []
        async with conn.subscribe("slow", {"from": "earliest"}) as items:
            async for record in items:
                records.append((record["offset"], record["value"]))
                if len(records) == 4:
                    break
        assert records == [(0, "s0"), (1, "s1"), (2, "s2"), (3, "s3")]


async def test_shutting_down_waits_for_the_fsync_in_flight_then_closes_the_logs(tmp_path: pathlib.Path) -> None:
    broker, files = gated_broker(tmp_path)
    directory = tmp_path / "slow"
    stopped = trio.Event()
    scope = trio.CancelScope()

    async def serve(*, task_status: trio.TaskStatus[str]) -> None:
        with scope:
            async with broker_serving(broker) as (url, _):
                task_status.started(url)
                await trio.sleep_forever()
        stopped.set()

    async with trio.open_nursery() as nursery:
        url = await nursery.start(serve)
        async with rsnet.connect(url) as conn:
            await publish(conn, "slow", ["s0"], producer="p")
            slow = broker.topics["slow"]
            files.hold(directory)
            async with trio.open_nursery() as offering:
                offering.start_soon(offer, conn, "slow", ["s1", "s2", "s3"], "p", 1)
                await entered(files)
                await until(lambda: slow.log.next_offset == 4)
                offering.cancel_scope.cancel()
        scope.cancel()  # stop the broker while the fsync of s1.. is held in its thread
        await trio.testing.wait_all_tasks_blocked()
        assert not stopped.is_set() and broker.topics.get("slow") is slow  # its log is still open
        files.release()
        with trio.fail_after(10):
            await stopped.wait()
    assert "slow" not in broker.topics and open_descriptors(tmp_path) == []  # closed, no descriptor left
    assert stored_values(directory) == ["s0", "s1", "s2", "s3"]  # closing synced what was written


async def test_fsyncs_run_in_at_most_sync_threads_threads_per_broker(tmp_path: pathlib.Path) -> None:
    files = GatedFiles()
    broker = Broker(data_dir=tmp_path, sync_threads=1)
    broker.storage_files = files
    async with broker_serving(broker) as (url, _), rsnet.connect(url) as conn, trio.open_nursery() as nursery:
        try:
            await publish(conn, "a", ["a0"], producer="p")
            await publish(conn, "b", ["b0"], producer="q")
            a, b = broker.topics["a"], broker.topics["b"]
            files.hold(tmp_path / "a")
            nursery.start_soon(offer, conn, "a", ["a1"], "p", 1)
            await entered(files)  # a's fsync has the broker's only thread
            nursery.start_soon(offer, conn, "b", ["b1"], "q", 1)
            await until(lambda: b.log.next_offset == 2)
            await trio.testing.wait_all_tasks_blocked()
            assert b.log.durable_offset == 1  # b's fsync waits for a thread
            assert broker.sync_threads.borrowed_tokens == 1 and broker.sync_threads.statistics().tasks_waiting == 1
        finally:
            files.release()
        await until(lambda: a.log.durable_offset == 2 and b.log.durable_offset == 2)
        nursery.cancel_scope.cancel()


async def test_under_interval_the_periodic_fsync_runs_in_a_thread_and_acknowledges_only_when_it_returned(
    tmp_path: pathlib.Path,
) -> None:
    broker, files = interval_broker(tmp_path)
    async with broker_serving(broker) as (url, _), rsnet.connect(url) as conn, trio.open_nursery() as nursery:
        try:
            await publish(conn, "t", ["r0"], producer="p")
            topic = broker.topics["t"]
            acks: list[Any] = []
            records: list[Any] = []
            await nursery.start(collect, conn, "$acks", {"producer": "p", "topic": "t"}, acks)
            await nursery.start(collect, conn, "t", {"from": "earliest"}, records)
            await until(lambda: len(acks) == 1 and len(records) == 1)
            files.hold(tmp_path / "t")
            nursery.start_soon(offer, conn, "t", ["r1", "r2"], "p", 1)
            await until(lambda: topic.log.next_offset == 3)
            await entered(files)  # the next periodic fsync is the one held
            await trio.testing.wait_all_tasks_blocked()
            assert topic.log.durable_offset == 1 and len(acks) == 1 and len(records) == 1
        finally:
            files.release()
        await until(lambda: acks[-1]["sequence"] == 2 and len(records) == 3)
        nursery.cancel_scope.cancel()


async def test_under_interval_a_backpressure_topic_writes_at_most_max_lag_records_ahead_of_the_sync(
    tmp_path: pathlib.Path,
) -> None:
    # server/README.md: subscribers see only synced records, so what waits for the sync is their
    # lag, and backpressure holds producers at max_lag records per interval.
    broker, files = interval_broker(tmp_path, TopicSettings(durable=True, max_lag=20))
    async with broker_serving(broker) as (url, _), rsnet.connect(url) as conn, trio.open_nursery() as nursery:
        try:
            await publish(conn, "t", ["r0"], producer="p")
            topic = broker.topics["t"]
            records: list[Any] = []
            await nursery.start(collect, conn, "t", {"from": "earliest"}, records)
            await until(lambda: len(records) == 1)
            files.hold(tmp_path / "t")
            nursery.start_soon(offer, conn, "t", [f"r{i}" for i in range(1, 101)], "p", 1)
            await entered(files)  # a periodic fsync is held: nothing more becomes durable
            await until(lambda: topic.log.next_offset >= 21)
            await trio.testing.wait_all_tasks_blocked()
            durable = topic.log.durable_offset
            assert len(records) == durable <= 21  # the subscriber read all it may see
            assert topic.log.next_offset == durable + 20  # held at max_lag past it, not at 101
        finally:
            files.release()
        await until(lambda: len(records) == 101)  # each sync lets the next 20 in
        assert [r["value"] for r in records] == [f"r{i}" for i in range(101)]
        nursery.cancel_scope.cancel()


def aging_broker(tmp_path: pathlib.Path) -> tuple[Broker, GatedFiles]:
    """A broker whose durable topics keep records for a second, swept every 10 ms, its files gated."""
    files = GatedFiles()
    settings = TopicSettings(durable=True, retention=Retention(max_age_ms=1000))
    broker = Broker(data_dir=tmp_path, settings_for=lambda name: settings, retention_sweep_s=0.01)
    broker.storage_files = files
    return broker, files


async def test_retention_syncs_the_topics_new_start_in_a_thread_before_deleting_a_segment(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A segment retention deleted must not read as lost after an OS crash: the log's new start
    goes into its synced mark, fsynced (in a worker thread) before the segment is deleted."""
    broker, files = aging_broker(tmp_path)
    async with broker_serving(broker) as (url, _), rsnet.connect(url) as conn:
        await publish(conn, "aged", ["a0", "a1", "a2"], producer="p")
        aged = broker.topics["aged"]
        segments = sorted(tmp_path.joinpath("aged").glob("*.log"))
        files.hold(tmp_path / "aged" / "synced")
        monkeypatch.setattr("rsnet.broker.broker.now_ms", lambda: now_ms() + 3_600_000)  # everything has expired
        try:
            await entered(files)  # the sweep waits for the mark's fsync, in its thread
            assert synced_mark.read(str(tmp_path / "aged")).first == 3
            assert all(segment.exists() for segment in segments) and aged.log.first_offset == 0
            assert await publish(conn, "other", ["o0"], producer="p") == 1  # the event loop goes on
        finally:
            files.release()
        await until(lambda: aged.log.first_offset == 3)
        assert not any(segment.exists() for segment in segments)
    log, report = SegmentLog.open(tmp_path / "aged")
    with log:
        assert report.clean and (log.first_offset, log.next_offset) == (3, 3)


async def test_retention_goes_on_when_the_topics_new_start_cannot_be_synced(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """On a failing or full disk retention is what frees space: said once, and done."""
    broker, files = aging_broker(tmp_path)
    async with broker_serving(broker) as (url, _), rsnet.connect(url) as conn:
        await publish(conn, "aged", ["a0", "a1", "a2"], producer="p")
        aged = broker.topics["aged"]
        files.fail("datasync", errno.EIO, suffix="synced")
        with caplog.at_level(logging.WARNING, logger="rsnet.broker"):
            monkeypatch.setattr("rsnet.broker.broker.now_ms", lambda: now_ms() + 3_600_000)
            await until(lambda: aged.log.first_offset == 3)
        assert [r.getMessage() for r in caplog.records if "retention" in r.getMessage()] == [
            "topic aged: retention's new start could not be synced ([Errno 5] Input/output error: "
            f"'{tmp_path / 'aged' / 'synced'}')"
        ]
