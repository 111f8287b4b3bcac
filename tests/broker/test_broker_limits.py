"""What a client's params can make the broker store or say is bounded (server/README.md,
"Resource budget"): producer ids and how many a topic remembers, cursor names, cursors per
topic, echoed values in errors, what a producer may send before it is stored."""

from __future__ import annotations

import logging
import pathlib
import re
import socket
import tracemalloc
from typing import Any

import pytest
import trio
import trio.testing

import rsnet
from rsnet.broker.broker import DEFAULT_MAX_RECORD_BYTES, MAX_ID_LENGTH, Broker, TopicSettings
from rsnet.broker.client import commit, publish
from rsnet.broker.codes import BrokerCode
from rsnet.broker.storage import Retention
from rsnet.broker.storage.memory import PRODUCER_COST
from rsnet.broker.topic import STORAGE_LINES_PER_MINUTE, TopicSink
from rsnet.net import failures
from rsnet.net.session import DEFAULT_CONNECTION_WINDOW_BYTES
from rsnet.protocol import Complete, ErrorCode, Hello, Next, Offer, Request, Subscribe, Welcome

from .support import RawClient, broker_running, broker_serving, take


async def refused(coroutine) -> rsnet.StreamError:
    with pytest.raises(rsnet.StreamError) as caught:
        await coroutine
    assert caught.value.code == ErrorCode.REJECTED
    return caught.value


@pytest.mark.parametrize("producer", ["", "p" * (MAX_ID_LENGTH + 1), 7])
async def test_producer_ids_are_bounded(producer):
    async with broker_running(Broker()) as url, rsnet.connect(url) as conn:
        error = await refused(conn.offer("orders", rsnet.just(1), {"producer": producer}))
        assert f"1 to {MAX_ID_LENGTH} characters" in error.message
        assert await publish(conn, "orders", [1], producer="p" * MAX_ID_LENGTH) == 1


async def test_cursor_names_and_acks_params_are_bounded():
    async with broker_running(Broker()) as url, rsnet.connect(url) as conn:
        assert await publish(conn, "jobs", [1, 2]) == 2
        long = "c" * (MAX_ID_LENGTH + 1)
        await refused(commit(conn, "jobs", long, 1))
        await refused(take(conn, "jobs", 1, cursor=long))
        await refused(take(conn, "$acks", 1, producer=long, topic="jobs"))
        error = await refused(take(conn, "$acks", 1, producer="p", topic="x" * 100_000))
        assert len(error.message) < 200  # the name is checked, and shown shortened
        error = await refused(commit(conn, "x" * 100_000, "c", 1))
        assert len(error.message) < 200


async def test_cursors_per_topic_are_bounded(tmp_path):
    async with broker_running(Broker(data_dir=tmp_path, max_cursors=3)) as url, rsnet.connect(url) as conn:
        assert await publish(conn, "jobs", [1, 2]) == 2
        for name in ("a", "b", "c"):
            await commit(conn, "jobs", name, 1)
        error = await refused(commit(conn, "jobs", "d", 1))
        assert error.data == {"topic": "jobs", "max_cursors": 3}
        await commit(conn, "jobs", "a", 0)  # existing cursors still move
        assert [r["value"] for r in await take(conn, "jobs", 2, cursor="a")] == [1, 2]


async def test_an_invalid_start_position_is_echoed_shortened():
    async with broker_running(Broker()) as url, rsnet.connect(url) as conn:
        assert await publish(conn, "jobs", [1]) == 1
        huge = {f"key{i}": "v" * 1000 for i in range(1000)}
        error = await refused(take(conn, "jobs", 1, **{"from": huge}))
        assert len(error.message) < 300
        error = await refused(take(conn, "missing", 1, **{"from": huge}))
        assert len(error.message) < 300


async def publish_as_granted(client: RawClient, log, stream_id: int, values: list) -> tuple[list[int], int]:
    """Send ``values`` on the OFFER ``stream_id`` only as the broker grants them; return each
    grant and the most records that were granted and not yet stored in ``log`` at a grant."""
    grants, granted, sent, most = [], 0, 0, 0
    while sent < len(values):
        request = await client.frame_of(Request, stream_id)
        grants.append(request.n)
        granted += request.n
        most = max(most, granted - log.next_offset)  # the grant follows the append that made room
        await client.send(*(Next(stream_id, value) for value in values[sent:granted]))
        sent = min(granted, len(values))
    return grants, most


async def test_a_producer_is_granted_at_most_the_sink_window_of_unwritten_records():
    broker = Broker(sink_window=8)
    async with broker_running(broker) as url:
        client = await RawClient.connect(url)
        await client.send(Offer(1, "orders", {"producer": "p"}, {}))
        grants, most = await publish_as_granted(client, broker.topic("orders", create=True).log, 1, list(range(100)))
        assert most <= 8  # never more, whatever the producer's speed
        assert grants[0] == 4  # before anything is stored, records count as 1 MiB each: 4 MiB / 1 MiB
        assert 4 < max(grants) <= 8  # once some are stored, they count as the small records they are
        await client.aclose()


async def test_a_resend_of_records_already_stored_is_granted_at_their_size_not_the_largest():
    """A producer resending what was stored (a retry after a lost connection) sends only
    duplicates, which store nothing: its window stayed at the size of the largest record, and
    400 small records were granted 4 at a time (100 round trips). They are sized as the
    topic's stored records are on average once the first duplicates are appended."""
    broker = Broker()
    async with broker_running(broker) as url:
        async with rsnet.connect(url) as conn:
            await publish(conn, "orders", list(range(400)), producer="p")
        log = broker.topics["orders"].log
        client = await RawClient.connect(url)
        await client.send(Offer(1, "orders", {"producer": "p", "sequence": 0}, {}))  # all stored already
        grants, _ = await publish_as_granted(client, log, 1, list(range(400)))
        assert log.next_offset == 400  # nothing stored twice
        assert grants[0] == 4 and len(grants) == 2, grants  # the rest at once, within the count window
        await client.aclose()


async def test_a_producer_of_large_records_gets_demand_only_as_their_bytes_are_stored():
    broker = Broker(sink_window=1024, sink_window_bytes=1 << 20)
    record = b"x" * 200_000  # about 200 kB in the log: 5 fit in the 1 MiB window
    async with broker_running(broker) as url:
        client = await RawClient.connect(url)
        await client.send(Offer(1, "big", {"producer": "p"}, {}))
        log = broker.topic("big", create=True).log
        grants, most = await publish_as_granted(client, log, 1, [record] * 40)
        assert grants[:2] == [1, 5] and most <= 5  # not 1,024 records (200 MB) granted at once
        # Small records on the same topic are granted the whole count window again.
        await client.send(Offer(3, "big", {"producer": "q"}, {}))
        grants, most = await publish_as_granted(client, log, 3, [b"y" * 100] * 3000)
        assert grants[:2] == [1, 1024] and most <= 1024
        await client.aclose()


async def test_invented_producer_ids_are_forgotten_oldest_first_within_the_bound_across_a_restart(tmp_path):
    settings = TopicSettings(durable=True, retention=Retention(max_producers=5))

    def broker() -> Broker:
        return Broker(data_dir=tmp_path, settings_for=lambda name: settings)

    async with broker_running(first := broker()) as url, rsnet.connect(url) as conn:
        for n in range(20):
            await publish(conn, "orders", [n], producer=f"invented-{n}")
        log = first.topics["orders"].log
        assert (log.producer_count, log.next_offset) == (5, 20)
        # A producer still remembered is deduplicated: its resend is dropped.
        await publish(conn, "orders", [19], producer="invented-19")
        assert log.next_offset == 20
    async with broker_running(second := broker()) as url, rsnet.connect(url) as conn:
        acks = await take(conn, "$acks", 1, producer="invented-19", topic="orders")
        assert acks == [{"topic": "orders", "producer": "invented-19", "sequence": 0}]
        log = second.topic("orders", create=False).log
        assert log.producer_count == 5 and log.last_sequence("invented-14") is None
        # What a forgotten producer sees: no first acknowledgement, and its resend is new.
        await publish(conn, "orders", [0], producer="invented-0")
        assert log.next_offset == 21 and log.producer_count == 5
        assert log.last_sequence("invented-15") is None  # the least recently written made room


async def test_records_granted_in_bulk_are_held_in_memory_only_until_the_writer_runs(monkeypatch):
    """Granted is not held: records a producer was granted wait in the sockets; the broker's
    memory holds only what its reader handed over since the topic's writer last ran."""
    held = []
    on_next = TopicSink.on_next

    def observed(sink: TopicSink, item) -> None:
        on_next(sink, item)
        held.append(sum(len(value) for value in sink.buffer))

    monkeypatch.setattr(TopicSink, "on_next", observed)
    broker = Broker(sink_window=1024, sink_window_bytes=1 << 40)  # 1,024 records granted at once
    record = b"y" * 900_000
    async with broker_running(broker) as url:
        client = await RawClient.connect(url)
        await client.send(Offer(1, "big", {"producer": "p"}, {}))
        assert (await client.frame_of(Request, 1)).n == 1024
        for _ in range(40):  # 36 MB as fast as the socket takes them
            await client.send(Next(1, record))
        log = broker.topic("big", create=False).log
        while log.next_offset < 40:
            await client.next_frame()  # the grants that follow each append
        assert len(held) == 40 and max(held) == len(record)  # one record at a time, never 36 MB
        await client.aclose()


@pytest.mark.parametrize("durable", [False, True], ids=["memory", "durable"])
async def test_a_record_too_large_to_deliver_is_refused_to_its_producer(tmp_path, durable):
    """A topic takes no record that a subscriber at the default max_frame_size (1 MiB) could
    not be sent: one that fits is delivered in every shape, also through a pattern."""
    broker = Broker(data_dir=tmp_path if durable else None, settings_for=lambda name: TopicSettings(durable=durable))
    fits, too_large = b"x" * (DEFAULT_MAX_RECORD_BYTES - 100), b"x" * (DEFAULT_MAX_RECORD_BYTES - 10)
    async with broker_running(broker) as url, rsnet.connect(url) as conn:
        error = await refused(publish(conn, "big.one", [too_large], producer="p"))
        assert "record too large" in error.message
        assert error.data == {"topic": "big.one", "producer": "p", "sequence": 0}
        assert await publish(conn, "big.one", [fits, "after"], producer="p", first_sequence=0) == 2
        for name, params in [
            ("big.one", {"from": "earliest"}),
            ("big.one", {"from": "earliest", "items": "arrays"}),
            ("big.one", {"from": "earliest", "items": "stored"}),
            ("big.*", {"from": "earliest"}),
            ("big.*", {"from": "earliest", "items": "stored"}),
        ]:
            values = [
                item["value"] if isinstance(item, dict) else item[2] for item in await take(conn, name, 2, **params)
            ]
            assert values == [fits, "after"], (name, params)  # and the record after it too


async def held_by_peers_that_read_nothing(
    broker: Broker, topic: str, *, connections: int, streams: int, **server_settings: Any
) -> int:
    """Open ``streams`` subscriptions to ``topic`` from its first record on each of
    ``connections`` connections with a small receive window that then read nothing; the
    bytes of records the broker has handed to them (beyond the sockets', in its memory), or,
    if more, the memory it allocated meanwhile less ``STREAM_COST`` a stream (records handed
    over once but held in two copies count twice)."""
    tracemalloc.start()
    try:
        async with broker_serving(broker, **server_settings) as (url, server):
            before = tracemalloc.get_traced_memory()[0]
            peers = []
            for _ in range(connections):
                sock = trio.socket.socket()
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connecting: a small window
                await sock.connect(("127.0.0.1", int(url.rsplit(":", 1)[1])))
                raw = RawClient(trio.SocketStream(sock))
                # Frames at most about a record: the broker's first guess of a record's size,
                # the largest frame, is then close to what it takes.
                await raw.send(Hello("rsnet", [1], {"max_frame_size": RECORD_BYTES + 1024}))
                assert isinstance(await raw.next_frame(), Welcome)
                peers.append(raw)
            for raw in peers:  # once all are open: each takes its share of them all
                await raw.send(*(Subscribe(2 * i + 1, topic, {"from": "earliest"}, 1_000, {}) for i in range(streams)))
            with trio.fail_after(10):
                while sum(len(session._outbound) for session in server.sessions) < connections * streams:
                    await trio.sleep(0.01)
            await trio.testing.wait_all_tasks_blocked(0.05)  # the server's writers wait for the peers
            allocated = tracemalloc.get_traced_memory()[0] - before - connections * streams * STREAM_COST
            readers = broker.topic(topic, create=False).readers
            handed = sum(reader.delivered for reader in readers) * RECORD_BYTES
            for raw in peers:
                await raw.aclose()
    finally:
        tracemalloc.stop()
    return max(handed, allocated)


STREAM_COST = 4096
"""Memory a subscription takes beyond its records, in the broker and its session (about 1.5
KiB measured), with room to spare."""

RECORD_BYTES = 256 * 1024

SOCKET_BUFFER = int(pathlib.Path("/proc/sys/net/ipv4/tcp_wmem").read_text().split()[2])
"""What the kernel may take into one socket's send buffer (tcp_wmem's maximum)."""


async def test_a_peer_with_many_subscriptions_that_reads_nothing_holds_the_connection_window():
    """Each stream may be sent at least one record whatever its share of the connection's
    window: 256 subscriptions to 256 KiB records took 64 MiB (1 GiB with 1,024 streams of 1 MiB
    records) from a peer that read none. The broker now reads for a connection only while
    what it holds unwritten is within the connection window (16 MiB), one record beyond at most."""
    broker = Broker()
    async with broker_running(broker) as url, rsnet.connect(url) as conn:
        await publish(conn, "big", [b"r" * (RECORD_BYTES - 64)] * 100, producer="p")
    held = await held_by_peers_that_read_nothing(broker, "big", connections=1, streams=256)
    assert held <= DEFAULT_CONNECTION_WINDOW_BYTES + SOCKET_BUFFER + RECORD_BYTES


async def test_peers_that_read_nothing_hold_at_most_the_servers_output_budget_in_all():
    """Connections share the server's output budget: each holds at most an equal share of it
    (and its own 16 MiB window): 4 connections that read nothing took 4 x 16 MiB before."""
    broker = Broker()
    async with broker_running(broker) as url, rsnet.connect(url) as conn:
        await publish(conn, "big", [b"r" * (RECORD_BYTES - 64)] * 100, producer="p")
    budget = 8 << 20
    held = await held_by_peers_that_read_nothing(broker, "big", connections=4, streams=64, output_budget_bytes=budget)
    assert held <= budget + 4 * (SOCKET_BUFFER + RECORD_BYTES)


async def test_subscriptions_waiting_for_their_connections_room_all_go_on_as_the_peer_reads():
    """The same window, a peer that reads: every subscription gets every record, and quiet
    subscriptions (waiting for records, holding nothing) hold no one back."""
    broker = Broker()
    async with broker_running(broker) as url, rsnet.connect(url) as conn:
        await publish(conn, "big", [b"r" * (RECORD_BYTES - 64)] * 30, producer="p")
        await publish(conn, "quiet", ["q"], producer="p")
        counts: list[int] = []

        async def read_all(topic: str, count: int) -> None:
            async with conn.subscribe(topic, {"from": "earliest", "items": "arrays"}) as records:
                async for offset, _, _ in records:
                    if offset == count - 1:
                        counts.append(count)
                        return

        async with trio.open_nursery() as nursery:
            for _ in range(200):
                nursery.start_soon(read_all, "quiet", 2)  # the second record never comes
            await trio.testing.wait_all_tasks_blocked()
            with trio.fail_after(60):
                async with trio.open_nursery() as busy:
                    for _ in range(16):
                        busy.start_soon(read_all, "big", 30)
            nursery.cancel_scope.cancel()
        assert counts == [30] * 16


async def admin(conn: rsnet.Client, action: str, topic: str) -> None:
    async for _ in conn.subscribe("$admin", {"action": action, "topic": topic}):
        pass


async def test_memory_topics_hold_at_most_the_memory_budget_together():
    """Attack round 5: memory topics took 3.3 times their max_bytes in RAM, and nothing bound
    them all together (10,000 topics of 1 GiB). A broker's memory topics now share a budget
    counted in memory (their frames and the overhead of each record): an offer beyond it is
    refused STORAGE_FULL, as on a full disk, and a purge or a delete gives it back."""
    broker = Broker(memory_budget_bytes=200_000)
    record = "x" * 1000
    async with broker_running(broker) as url, rsnet.connect(url) as conn:
        stored = 0
        with pytest.raises(rsnet.StreamError) as refused:
            while True:  # acknowledged batch by batch until the budget is used up
                await publish(conn, "a", [record] * 10, producer="p", first_sequence=stored)
                stored += 10
                assert stored < 1000, "the budget never ran out"
        assert refused.value.code == BrokerCode.STORAGE_FULL and "memory_budget_bytes" in refused.value.message
        assert 150 <= stored < 200 and broker.memory_budget.used <= 200_000
        with pytest.raises(rsnet.StreamError) as other:  # the budget is every memory topic's
            await publish(conn, "b", [record] * 10, producer="q")
        assert other.value.code == BrokerCode.STORAGE_FULL
        assert len(await take(conn, "a", stored, **{"from": "earliest"})) == stored  # what was stored is served
        await admin(conn, "purge", "a")
        await publish(conn, "b", [record] * 100, producer="q")
        await admin(conn, "delete", "b")
        await publish(conn, "a", [record] * 150, producer="p", first_sequence=stored)
        assert broker.memory_budget.used <= 200_000


async def test_the_producers_a_memory_topic_remembers_count_in_the_memory_budget():
    """Attack round 5: 10,000 producer ids per memory topic took 7.6 MiB each, outside any
    bound but max_topics; retention drops records, not the producers it remembers."""
    broker = Broker(memory_budget_bytes=60_000)
    async with broker_running(broker) as url, rsnet.connect(url) as conn:
        producers = 0
        with pytest.raises(rsnet.StreamError) as refused:
            while True:
                await publish(conn, "many", [producers], producer=f"producer-{producers}")
                producers += 1
                assert producers < 200, "the budget never ran out"
        assert refused.value.code == BrokerCode.STORAGE_FULL
        assert producers * PRODUCER_COST <= broker.memory_budget.used <= 60_000
        assert producers < 60_000 // PRODUCER_COST
        await admin(conn, "purge", "many")  # the records go, the producers stay remembered
        assert broker.memory_budget.used == producers * PRODUCER_COST
        await admin(conn, "delete", "many")
        assert broker.memory_budget.used == 0


async def test_memory_topics_failing_and_recovering_in_turn_write_a_bounded_number_of_lines(caplog, monkeypatch):
    """Attack round 6: a client that fills the memory budget every memory topic shares, and
    purges it, made each topic log an ERROR (storage failed) and a WARNING (works again), as
    often as it liked: log lines without bound. At most STORAGE_LINES_PER_MINUTE of them a
    minute now; the next minute begins with one line counting the rest."""
    now = [1000.0]
    monkeypatch.setattr(failures.time, "monotonic", lambda: now[0])
    broker = Broker(memory_budget_bytes=20_000, retention_sweep_s=0.01)
    with caplog.at_level(logging.WARNING, logger="rsnet.broker"):
        async with broker_running(broker) as url, rsnet.connect(url) as conn:
            await publish(conn, "fill", ["x" * 1000] * 15, producer="fill")
            for i in range(40):  # 40 topics fail: 40 reports
                with pytest.raises(rsnet.StreamError) as refused:
                    await publish(conn, f"t{i}", ["x" * 1000] * 10, producer="p")
                assert refused.value.code == BrokerCode.STORAGE_FULL
            await admin(conn, "purge", "fill")
            with trio.fail_after(10):  # and work again: 40 more
                while any(topic.storage_failure for topic in broker.topics.values()):
                    await trio.sleep(0.01)
            reports = [r.getMessage() for r in caplog.records if "storage" in r.getMessage()]
            assert len(reports) == STORAGE_LINES_PER_MINUTE
            assert all(
                re.fullmatch(r"topic \w+: storage (failed, producers refused.*|works again)", r) for r in reports
            )
            now[0] += 61
            with pytest.raises(rsnet.StreamError):  # fills it again: the next line says what was left out
                await publish(conn, "fill", ["x" * 1000] * 40, producer="fill", first_sequence=15)
    summary = [r.getMessage() for r in caplog.records if "were left out" in r.getMessage()]
    assert summary == [
        f"{80 - STORAGE_LINES_PER_MINUTE} more reports of topics' storage failing or working again in the last "
        "minute were left out (/health and the storage_failing metric show each topic)"
    ]


async def test_a_memory_topic_a_full_budget_refused_works_again_once_there_is_room_for_it():
    """Attack round 7: a memory topic counted as failing (/health 503) until the budget had
    room for the largest record a producer may send (1 MiB), which a 20 KB budget never has:
    purged and empty, it stayed failing for good, and a probe would restart the broker."""
    broker = Broker(memory_budget_bytes=20_000, retention_sweep_s=0.01)
    async with broker_running(broker) as url, rsnet.connect(url) as conn:
        await publish(conn, "fill", ["x" * 1000] * 15, producer="fill")
        with pytest.raises(rsnet.StreamError) as refused:
            await publish(conn, "t", ["x" * 1000] * 10, producer="p")
        assert refused.value.code == BrokerCode.STORAGE_FULL
        await trio.sleep(0.1)  # sweeps: still no room for it
        assert broker.topics["t"].storage_failure is not None
        await admin(conn, "purge", "fill")
        with trio.fail_after(5):
            while broker.topics["t"].storage_failure is not None:
                await trio.sleep(0.01)


async def test_offers_a_full_budget_refused_after_they_completed_leave_their_topic():
    # Re-check of attack round 5: an offer whose COMPLETE came before the writer refused its
    # records (a full memory budget, a full disk) stayed in its topic's producers for good:
    # 30,000 refused offers left 29,225 behind, 1.1 KB each, and each refusal walked them all.
    broker = Broker(memory_budget_bytes=20_000)
    async with broker_running(broker) as url, rsnet.connect(url) as conn:
        await publish(conn, "t", ["x" * 1000] * 15, producer="fill")
        client = await RawClient.connect(url)
        for i in range(20):  # records and COMPLETE in one write: done before the writer runs
            stream = 2 * i + 1
            await client.send(Offer(stream, "t", {"producer": f"p{i}"}, {}))
            await client.frame_of(Request, stream)
            await client.send(Next(stream, "y" * 1000), Complete(stream))
        await client.aclose()
        topic = broker.topics["t"]
        with trio.fail_after(5):
            while topic.sinks:
                await trio.sleep(0.01)
        assert topic.storage_failure is not None  # (they were refused)
