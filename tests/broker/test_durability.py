"""The durable broker as a real process: SIGKILL mid-stream, damaged segments, reconnect loops."""

from __future__ import annotations

import contextlib
import pathlib
import signal
import sys

import pytest
import trio

import rsnet
from rsnet.broker.broker import Broker
from rsnet.broker.client import follow, publish
from rsnet.broker.codes import BrokerCode

from .support import broker_serving, served_url, start_daemon

RSNET = [sys.executable, "-m", "rsnet.cli"]


async def start_broker(data_dir, *extra: str) -> tuple[trio.Process, str]:
    process, printed = await start_daemon(
        "--data-dir", str(data_dir), "--tcp", "127.0.0.1:0", *extra, announces=b"serving tcp://"
    )
    return process, served_url(printed)


async def stop(process: trio.Process, how: int = signal.SIGKILL) -> None:
    if process.returncode is None:
        process.send_signal(how)
    with trio.fail_after(10):
        await process.wait()


async def read_all(url: str, topic: str) -> list[dict]:
    async with rsnet.connect(url) as conn:
        snapshot = [t async for t in conn.subscribe("$topics")]
        end = next((t["next_offset"] for t in snapshot if t["topic"] == topic), 0)
        records = []
        if end:
            async with conn.subscribe(topic, {"from": "earliest"}, prefetch=1024) as items:
                async for record in items:
                    records.append(record)
                    if record["offset"] == end - 1:
                        break
    return records


async def test_sigkill_under_fsync_always_loses_no_acknowledged_record(tmp_path):
    broker, url = await start_broker(tmp_path, "--fsync", "always")
    acked = -1
    try:
        async with rsnet.connect(url) as conn:

            async def watch_acks(task_status):
                nonlocal acked
                async with conn.subscribe("$acks", {"producer": "p", "topic": "events"}) as acks:
                    task_status.started()
                    async for ack in acks:
                        acked = ack["sequence"]

            async def kill_when_enough():
                while acked < 2000:
                    await trio.sleep(0.005)
                broker.send_signal(signal.SIGKILL)  # mid-stream: the producer is still sending

            with contextlib.suppress(rsnet.ConnectionLost, rsnet.StreamError):
                async with trio.open_nursery() as nursery:
                    await nursery.start(watch_acks)
                    nursery.start_soon(kill_when_enough)
                    await conn.offer("events", rsnet.range_(0, 10**9), {"producer": "p", "sequence": 0})
    except* rsnet.ConnectionLost:
        pass
    finally:
        await stop(broker)
    assert acked >= 2000

    broker, url = await start_broker(tmp_path, "--fsync", "always")
    try:
        records = await read_all(url, "events")
    finally:
        await stop(broker, signal.SIGTERM)
    values = [r["value"] for r in records]
    assert values[: acked + 1] == list(range(acked + 1))  # every acknowledged record, in order
    assert values == list(range(len(values)))  # once each, and nothing after a gap
    assert [r["offset"] for r in records] == list(range(len(records)))


async def stored_lines(data_dir) -> pathlib.Path:
    """100 records published to the topic "logs" of a broker run once on ``data_dir`` (fsync
    always, acknowledged, the broker stopped cleanly); the topic's only segment."""
    broker, url = await start_broker(data_dir)
    try:
        async with rsnet.connect(url) as conn:
            await publish(conn, "logs", [f"line {i}" for i in range(100)], producer="w")
    finally:
        await stop(broker, signal.SIGTERM)
    (segment,) = sorted((data_dir / "logs").glob("*.log"))
    return segment


async def test_a_torn_write_after_the_acknowledged_records_is_cut_and_the_rest_kept(tmp_path):
    segment = await stored_lines(tmp_path)
    with segment.open("ab") as file:
        file.write(b"\x00\x00\x01\x00torn")  # the start of a record never acknowledged

    broker, url = await start_broker(tmp_path)
    try:
        records = await read_all(url, "logs")
        assert [r["value"] for r in records] == [f"line {i}" for i in range(100)]
        async with rsnet.connect(url) as conn:
            await publish(conn, "logs", ["after repair"], producer="w2")
        records = await read_all(url, "logs")
        assert (records[-1]["offset"], records[-1]["value"]) == (100, "after repair")
    finally:
        await stop(broker, signal.SIGTERM)


async def test_an_acknowledged_record_cut_short_costs_that_record_and_never_its_offset(tmp_path):
    """The last acknowledged record damaged looks like a torn write, but the log's synced mark
    says it was synced: it is damage, not a write to cut and give its offset to another
    record. The broker used to refuse to start, and with unclean_recovery it gave the offset
    again; it now starts, the record's offset is OFFSET_DAMAGED, and new records come after it."""
    segment = await stored_lines(tmp_path)
    data = segment.read_bytes()[:-7]  # the last record is cut off mid-way
    segment.write_bytes(data)
    for restart in range(2):  # and the same at the next start, with the record published after it
        broker, url = await start_broker(tmp_path)
        try:
            async with rsnet.connect(url) as conn:
                with pytest.raises(rsnet.StreamError) as raised:
                    async for _ in conn.subscribe("logs", {"from": 99}):
                        pass
                assert raised.value.code == BrokerCode.OFFSET_DAMAGED
                assert raised.value.data["next_intact"] == 100
                if not restart:
                    await publish(conn, "logs", ["after"], producer="late")
                before, after = [], []
                async for record in conn.subscribe("logs", {"from": "earliest", "until": 99}):
                    before.append(record["value"])
                async for record in conn.subscribe("logs", {"from": 100, "until": 101}):
                    after.append(record["value"])
            assert (before, after) == ([f"line {i}" for i in range(99)], ["after"])
        finally:
            await stop(broker, signal.SIGTERM)


async def test_reconnect_loops_under_load_lose_and_repeat_nothing():
    """Every connection is cut every 50 ms while a producer publishes and a follower reads:
    the producer resumes from its last acknowledgement, the follower from its last offset."""
    total = 3000
    received = []
    connects = {"producer": 0, "cut": 0}

    async def paced(start):
        for value in range(start, total):
            yield value
            if value % 50 == 0:
                await trio.sleep(0.005)  # ~0.3 s in all: several cuts land mid-stream

    async with broker_serving(Broker()) as (url, server):

        async def produce():
            sequence = 0
            while sequence < total:
                connects["producer"] += 1
                try:
                    async with rsnet.connect(url) as conn:
                        async with conn.subscribe("$acks", {"producer": "loader", "topic": "feed"}) as acks:
                            with trio.move_on_after(0.02):  # the last stored sequence, if any
                                sequence = (await acks.__anext__())["sequence"] + 1
                        await publish(conn, "feed", paced(sequence), producer="loader", first_sequence=sequence)
                        sequence = total
                except rsnet.ConnectionLost:
                    await trio.sleep(0.01)

        async def consume():
            async with follow(url, "feed", start="earliest", retry_delay=0.01) as records:
                async for record in records:
                    received.append(record)
                    if len(received) == total:
                        return

        async def chaos():
            while True:
                await trio.sleep(0.05)
                for session in list(server.sessions):
                    connects["cut"] += 1
                    session.close(10, "chaos")

        async with trio.open_nursery() as nursery:
            nursery.start_soon(chaos)
            with trio.fail_after(60):
                async with trio.open_nursery() as work:
                    work.start_soon(produce)
                    work.start_soon(consume)
            nursery.cancel_scope.cancel()
    assert [r["offset"] for r in received] == list(range(total))
    assert [r["value"] for r in received] == list(range(total))
    assert connects["producer"] >= 3 and connects["cut"] >= 10  # it really was cut, repeatedly


async def test_cursors_and_records_survive_a_restart_and_the_cli_sees_them(tmp_path):
    broker, url = await start_broker(tmp_path)
    try:
        pub = await trio.run_process(
            [*RSNET, "pub", url, "jobs", "--producer", "cli"],
            stdin=b'{"n": 1}\n{"n": 2}\n{"n": 3}\n',
            capture_stdout=True,
            capture_stderr=True,
        )
        assert b"3 records stored" in pub.stderr
        async with rsnet.connect(url) as conn:
            from rsnet.broker.client import commit

            await commit(conn, "jobs", "workers", 2)
    finally:
        await stop(broker, signal.SIGTERM)

    broker, url = await start_broker(tmp_path)
    try:
        sub = await trio.run_process(
            [*RSNET, "sub", url, "jobs", "-p", "cursor=workers", "--from", "earliest", "--count", "1"],
            capture_stdout=True,
        )
        assert b'"offset": 2' in sub.stdout and b'"n": 3' in sub.stdout  # resumed at the cursor
        topics = await trio.run_process([*RSNET, "topics", url], capture_stdout=True)
        assert b"jobs" in topics.stdout
        failed = await trio.run_process(
            [*RSNET, "pub", "tcp://127.0.0.1:1", "jobs"], stdin=b"1\n", capture_stderr=True, check=False
        )
        assert failed.returncode == 1 and b"not every record was acknowledged" in failed.stderr
    finally:
        await stop(broker, signal.SIGTERM)


async def test_a_shutdown_ends_subscriptions_at_once_and_lets_producers_drain(tmp_path):
    """SIGTERM: topic and pattern subscriptions end at once with GOING_AWAY (they never
    complete, so waiting for them would hold every restart for the whole grace); a follower
    resumes from its next offset on the next broker, with no gap and no duplicate."""

    from rsnet.protocol import ErrorCode

    data = str(tmp_path / "data")
    process, printed = await start_daemon(
        "--tcp", "127.0.0.1:0", "--data-dir", data, "--grace", "60", announces=b"serving"
    )
    url = served_url(printed)
    ended: dict[str, BaseException] = {}
    async with rsnet.connect(url) as conn:
        await publish(conn, "restart.t", [0, 1, 2])

        async def subscribe(name: str) -> None:
            try:
                async for _ in conn.subscribe(name, {"from": "earliest"}):
                    pass
            except rsnet.StreamError as error:
                ended[name] = error

        async with trio.open_nursery() as nursery:
            nursery.start_soon(subscribe, "restart.t")
            nursery.start_soon(subscribe, "restart.>")
            await trio.sleep(0.5)  # both are reading (and then waiting for more)
            process.send_signal(signal.SIGTERM)
            with trio.fail_after(30):  # well inside the 60 s grace
                await process.wait()
    assert {name: error.code for name, error in ended.items()} == {
        "restart.t": ErrorCode.GOING_AWAY,
        "restart.>": ErrorCode.GOING_AWAY,
    }
    process, printed = await start_daemon("--tcp", "127.0.0.1:0", "--data-dir", data, announces=b"serving")
    try:
        async with follow(served_url(printed), "restart.t", start=1) as records:
            assert (await records.__anext__())["offset"] == 1
    finally:
        process.kill()
        await process.wait()
