"""Issue 10, finding 3: one flipped byte in record 10,004 of 20,000 costs that record only.

Before damaged ranges, recovery cut the segment at the damage: 9,996 acknowledged records were
deleted and new records then reused their offsets. Now the damaged record's offset becomes a
damaged range, every other record keeps its offset and value, new records get offsets after
the old end, and the damaged bytes are copied to ``quarantine/``.
"""

from __future__ import annotations

import os
import pathlib
import sys
import zlib
from typing import Any

import pytest
import trio

import rsnet
from rsnet.broker import broker as broker_module
from rsnet.broker.broker import Broker, TopicSettings
from rsnet.broker.client import commit, publish
from rsnet.broker.codes import BrokerCode
from rsnet.broker.daemon import metrics_refresher
from rsnet.broker.metrics import BrokerMetrics
from rsnet.broker.storage import FsyncPolicy, OffsetDamaged, Retention, SegmentLog
from rsnet.broker.storage import records as records_module
from rsnet.protocol import ErrorCode

from .support import broker_serving, check_refused_until_unclean, served_url, start_daemon
from .test_broker_security import http_get

COUNT = 20_000
DAMAGED = 10_003  # the 10,004th record


def write(directory: pathlib.Path, segment_bytes: int) -> None:
    log, _ = SegmentLog.open(directory, Retention(), FsyncPolicy.NEVER, segment_bytes)
    with log:
        for start in range(0, COUNT, 1000):
            log.append(
                [{"n": n} for n in range(start, start + 1000)],
                timestamp_ms=start,
                producer="p",
                first_sequence=start,
            )


def flip_inside(directory: pathlib.Path, offset: int) -> tuple[str, int, int]:
    """Flip one byte inside the body of the record with ``offset``; (segment, its start, its end)."""
    name, position, end = record_at(directory, offset)
    path = directory / name
    damaged = bytearray(path.read_bytes())
    damaged[position + 10] ^= 0x01
    path.write_bytes(damaged)
    return name, position, end


def record_at(directory: pathlib.Path, offset: int) -> tuple[str, int, int]:
    """(segment, start, end) of the record with ``offset`` in the (closed) log in ``directory``."""
    log, _ = SegmentLog.open(directory, Retention(), FsyncPolicy.NEVER)
    with log:
        segment = next(s for s in reversed(log._segments) if s.base_offset <= offset)
        name = os.path.basename(segment.path)
        _, position = segment.locate(offset)
        # walk from the indexed record to ours by the length fields
        data = (directory / name).read_bytes()
        here = segment.locate(offset)[0]
        while here < offset:
            position += 8 + int.from_bytes(data[position : position + 4], "big")
            here += 1
    return name, position, position + 8 + int.from_bytes(data[position : position + 4], "big")


@pytest.mark.parametrize("segment_bytes", [64 << 20, 64 << 10], ids=["active segment", "sealed segment"])
def test_one_flipped_byte_in_record_10004_of_20000_costs_that_record_only(
    tmp_path: pathlib.Path, segment_bytes: int
) -> None:
    write(tmp_path, segment_bytes)
    name, start, end = flip_inside(tmp_path, DAMAGED)
    damaged_bytes = (tmp_path / name).read_bytes()[start:end]

    log, report = SegmentLog.open(tmp_path, Retention(), FsyncPolicy.ALWAYS, segment_bytes)
    with log:
        assert report.truncated_bytes == 0 and report.records == COUNT - 1
        assert [(d.first, d.end) for d in report.damaged_ranges] == [(DAMAGED, DAMAGED + 1)]
        assert (log.first_offset, log.next_offset) == (0, COUNT)
        before = log.read(0, COUNT)  # stops before the damage
        assert [(r.offset, r.value["n"]) for r in before] == [(n, n) for n in range(DAMAGED)]
        with pytest.raises(OffsetDamaged) as raised:
            log.read(DAMAGED, 10)
        assert raised.value.damage.end == DAMAGED + 1
        after = log.read(DAMAGED + 1, COUNT)
        assert [(r.offset, r.value["n"]) for r in after] == [(n, n) for n in range(DAMAGED + 1, COUNT)]
        assert log.last_sequence("p") == COUNT - 1  # a retry of any stored record is still a duplicate
        assert log.append([{"n": "new"}], timestamp_ms=COUNT, producer="q", first_sequence=0) == [COUNT]
        assert log.offset_for_timestamp(10_001) == 11_000  # found by reading across the damaged range
    copy = tmp_path / "quarantine" / f"{name}.bytes-{start}-{end - 1}"
    assert copy.read_bytes() == damaged_bytes

    log, report = SegmentLog.open(tmp_path, Retention(), FsyncPolicy.ALWAYS, segment_bytes)
    with log:  # the same at the next open, and the new record kept its offset
        assert [(d.first, d.end) for d in log.damaged_ranges] == [(DAMAGED, DAMAGED + 1)]
        assert log.next_offset == COUNT + 1 and log.read(COUNT, 1)[0].value == {"n": "new"}


def test_the_search_past_damage_among_large_random_values_checks_each_byte_about_once(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An outside check: one flipped bit among 20 records of 1 MB of random bytes held the
    broker's start for 10 s (63 records: minutes), in the event loop. The search for the next
    intact record checked the CRC of every position whose first byte could start a length, and
    in random bytes about one in fifty can, each over up to the rest of the file. It now checks
    what costs nothing first (the body starts as a record with an offset in range): counted
    here, the bytes CRC-checked stay within a few times the file's size, not its square."""
    values = [os.urandom(256 << 10) for _ in range(8)]
    log, _ = SegmentLog.open(tmp_path, Retention(), FsyncPolicy.NEVER)
    with log:
        log.append(values, timestamp_ms=0, producer="p", first_sequence=0)
    name, _, _ = flip_inside(tmp_path, 1)
    size = (tmp_path / name).stat().st_size
    checked = 0
    real_crc32 = zlib.crc32

    def counting_crc32(data: Any, value: int = 0) -> int:
        nonlocal checked
        checked += len(data)
        return real_crc32(data, value)

    monkeypatch.setattr(records_module.zlib, "crc32", counting_crc32)
    log, report = SegmentLog.open(tmp_path, Retention(), FsyncPolicy.NEVER)
    with log:
        assert [(d.first, d.end) for d in report.damaged_ranges] == [(1, 2)]
        assert [r.value for r in log.read(2, 6)] == values[2:]
    assert checked < 4 * size, f"{checked:,} bytes CRC-checked for a {size:,}-byte segment"


def test_retention_removes_a_damaged_range_with_its_segment(tmp_path: pathlib.Path) -> None:
    write(tmp_path, 64 << 10)
    flip_inside(tmp_path, 100)
    log, _ = SegmentLog.open(tmp_path, Retention(max_records=COUNT // 2), FsyncPolicy.NEVER, 64 << 10)
    with log:
        assert [(d.first, d.end) for d in log.damaged_ranges] == [(100, 101)]
        log.enforce_retention(now_ms=0)
        assert log.first_offset > 100 and log.damaged_ranges == []
        assert log.read(log.first_offset, 1)[0].offset == log.first_offset


def test_age_retention_keeps_a_segment_of_unknown_age_until_a_later_one_expires(tmp_path: pathlib.Path) -> None:
    """An outside check: an oldest segment none of whose records can be read (emptied here)
    has no known time, which age retention read as the oldest possible: its damaged range was
    deleted, and reported as trimmed, a second after it was found. Its records came before
    the next segment's, so it expires by age when that one does, not before."""
    log, _ = SegmentLog.open(tmp_path, Retention(), FsyncPolicy.NEVER, 64 << 10)
    with log:
        for start in range(0, 3000, 100):
            batch = [{"n": n, "pad": "x" * 50} for n in range(start, start + 100)]
            log.append(batch, timestamp_ms=1_000_000 + start, producer="p", first_sequence=start)
    oldest = min(path for path in tmp_path.iterdir() if path.suffix == ".log")
    oldest.write_bytes(b"")
    week = 7 * 86_400_000
    log, report = SegmentLog.open(tmp_path, Retention(max_age_ms=week), FsyncPolicy.NEVER, 64 << 10)
    with log:
        (damage,) = report.damaged_ranges
        assert damage.first == 0
        log.enforce_retention(now_ms=1_000_000 + week)  # nothing has expired: every record is younger
        assert log.first_offset == 0 and [(d.first, d.end) for d in log.damaged_ranges] == [(0, damage.end)]
        second_newest = log._segments[1].max_timestamp
        log.enforce_retention(now_ms=second_newest + week + 1)  # the segment after it has expired
        assert log.first_offset > damage.end and log.damaged_ranges == []


# -- through the broker -------------------------------------------------------------------------


def subscribe(conn: rsnet.Client, topic: str, params: dict[str, Any]) -> Any:
    return conn.subscribe(topic, params, prefetch=1024)


async def check_new_records_come_after_the_old(conn: rsnet.Client) -> None:
    """A record published now gets the offset after the COUNT written (no offset given again)."""
    await publish(conn, "events", ["new"], producer="late")
    (new,) = await read_range(conn, "events", COUNT, COUNT + 1)
    assert new["value"] == "new"


async def read_range(conn: rsnet.Client, topic: str, start: int, stop: int) -> list[dict[str, Any]]:
    records = []
    async with subscribe(conn, topic, {"from": start}) as items:
        async for record in items:
            records.append(record)
            if record["offset"] == stop - 1:
                break
    return records


async def test_a_subscriber_reaching_a_damaged_range_gets_offset_damaged_and_can_go_on(
    tmp_path: pathlib.Path,
) -> None:
    (tmp_path / "events").mkdir()
    write(tmp_path / "events", 64 << 10)
    flip_inside(tmp_path / "events", DAMAGED)
    broker = Broker(data_dir=tmp_path)
    async with broker_serving(broker) as (url, server), rsnet.connect(url) as conn:
        metrics = BrokerMetrics()
        metrics_refresher(broker, server)(metrics)
        assert metrics.registry.get_sample_value("rsnet_broker_storage_damaged_records", {"topic": "events"}) == 1
        topics = [t async for t in conn.subscribe("$topics")]
        (damaged,) = topics[0]["damaged"]
        assert (damaged["first"], damaged["end"]) == (DAMAGED, DAMAGED + 1)
        assert "CRC mismatch" in damaged["problem"]
        listing = await trio.run_process([sys.executable, "-m", "rsnet.cli", "topics", url], capture_stdout=True)
        assert f"  damaged: offsets {DAMAGED} to {DAMAGED}: " in listing.stdout.decode()

        received = []
        with pytest.raises(rsnet.StreamError) as raised:
            async with subscribe(conn, "events", {"from": DAMAGED - 5}) as items:
                async for record in items:
                    received.append(record["offset"])
        assert received == list(range(DAMAGED - 5, DAMAGED))  # everything before it, then the error
        assert raised.value.code == BrokerCode.OFFSET_DAMAGED
        assert raised.value.data == {
            "topic": "events",
            "requested": DAMAGED,
            "first": DAMAGED,
            "next_intact": DAMAGED + 1,
        }

        with pytest.raises(rsnet.StreamError) as raised:  # refused at subscribe time too
            await read_range(conn, "events", DAMAGED, DAMAGED + 1)
        assert raised.value.code == BrokerCode.OFFSET_DAMAGED

        after = await read_range(conn, "events", DAMAGED + 1, COUNT)
        assert [(r["offset"], r["value"]["n"]) for r in after] == [(n, n) for n in range(DAMAGED + 1, COUNT)]
        await check_new_records_come_after_the_old(conn)


async def test_a_flipped_byte_in_the_only_segments_header_stops_nothing_and_costs_no_record(
    tmp_path: pathlib.Path,
) -> None:
    """It stopped the start ("the active segment's header is unreadable"), and with
    unclean_recovery every record of the topic went to quarantine and offsets began at 0 again."""
    (tmp_path / "events").mkdir()
    write(tmp_path / "events", 64 << 20)
    (segment,) = sorted((tmp_path / "events").glob("*.log"))
    data = bytearray(segment.read_bytes())
    data[20] ^= 0xFF  # inside the only (active) segment's header
    segment.write_bytes(data)
    broker, printed = await start_daemon(
        "--data-dir", str(tmp_path), "--tcp", "127.0.0.1:0", announces=b"serving tcp://"
    )
    try:
        async with rsnet.connect(served_url(printed)) as conn:
            records = await read_range(conn, "events", 0, COUNT)
            assert [(r["offset"], r["value"]["n"]) for r in records] == [(n, n) for n in range(COUNT)]
            await check_new_records_come_after_the_old(conn)
    finally:
        broker.terminate()
        await broker.wait()


async def test_the_broker_refuses_a_topic_with_damage_it_cannot_place_until_told_to(tmp_path: pathlib.Path) -> None:
    """It refused to start at all, every other topic with it; now it serves the others, and
    /health and $topics name the topic and why."""
    (tmp_path / "events").mkdir()
    write(tmp_path / "events", 64 << 20)
    (segment,) = sorted((tmp_path / "events").glob("*.log"))
    data = bytearray(segment.read_bytes())
    data[11] ^= 0x40  # the only segment's format version: 65, written by a newer rsnet or damaged
    segment.write_bytes(data)
    flags = ("--data-dir", str(tmp_path), "--tcp", "127.0.0.1:0", "--metrics", "127.0.0.1:0")
    broker, printed = await start_daemon(*flags, announces=b"metrics on")
    try:
        assert "topic events cannot be opened; it is refused until it can be" in printed
        port = int(printed.split("metrics on http://", 1)[1].split("/", 1)[0].rsplit(":", 1)[1])
        async with rsnet.connect(served_url(printed)) as conn:
            with pytest.raises(rsnet.StreamError) as refused:
                await read_range(conn, "events", 0, 1)
            assert refused.value.code == BrokerCode.STORAGE_ERROR
            assert "segment format version 65" in refused.value.message
            assert "unclean_recovery = true" in refused.value.message
            (listed,) = [t async for t in conn.subscribe("$topics", {"match": "events"})]
            assert listed["unavailable"].startswith("cannot be opened: ")
            await publish(conn, "other", ["served"], producer="p")
        health = await http_get(port, "/health")
        assert " 503 " in health.split("\r\n", 1)[0] and '"events": "cannot be opened: ' in health
    finally:
        broker.terminate()
        await broker.wait()
    assert segment.read_bytes() == data  # nothing changed

    config = tmp_path / "rsnet.toml"
    config.write_text("unclean_recovery = true\n")
    broker, printed = await start_daemon(
        "--config", str(config), "--data-dir", str(tmp_path), "--tcp", "127.0.0.1:0", announces=b"serving tcp://"
    )
    try:  # taken for damage: a damaged header, whose records follow it
        async with rsnet.connect(served_url(printed)) as conn:
            (listed,) = [t async for t in conn.subscribe("$topics", {"match": "events"})]
            assert (listed["first_offset"], listed["next_offset"]) == (0, COUNT) and "unavailable" not in listed
    finally:
        broker.terminate()
        await broker.wait()


async def until_closed(broker: Broker, name: str) -> None:
    """The broker closes a topic whose read found damage just after that read's stream ended."""
    with trio.fail_after(10):
        while name in broker.topics:
            await trio.sleep(0.01)


async def test_bytes_damaged_inside_the_log_while_the_broker_runs_become_a_damaged_range(
    tmp_path: pathlib.Path,
) -> None:
    # Attack round 4: a read that met damage made since start-up ended its subscription with
    # STORAGE_ERROR, and every later one at the same place too, until a restart; /health and
    # $topics said nothing. Now the topic is opened again, and its recovery places the damage.
    broker = Broker(data_dir=tmp_path)
    async with broker_serving(broker) as (url, _), rsnet.connect(url) as conn:
        await publish(conn, "events", [{"n": n} for n in range(100)], producer="p")
        broker._close_topic(broker.topics["events"])
        name, position, _ = record_at(tmp_path / "events", 40)
        broker.topic("events", create=False)  # open again, with nothing in memory: readers read the file
        damaged = bytearray((tmp_path / "events" / name).read_bytes())
        damaged[position + 10] ^= 0x01  # behind the broker's back
        (tmp_path / "events" / name).write_bytes(damaged)
        received = []
        with pytest.raises(rsnet.StreamError) as raised:
            async with subscribe(conn, "events", {"from": 0}) as items:
                async for record in items:
                    received.append(record["value"]["n"])
        assert raised.value.code == BrokerCode.STORAGE_ERROR and "subscribe again" in raised.value.message
        assert received == list(range(40))
        await until_closed(broker, "events")
        with pytest.raises(rsnet.StreamError) as raised:  # opened again: the damage is placed
            await read_range(conn, "events", 40, 41)
        assert raised.value.code == BrokerCode.OFFSET_DAMAGED and raised.value.data["next_intact"] == 41
        assert [r["value"]["n"] for r in await read_range(conn, "events", 41, 100)] == list(range(41, 100))
        (listed,) = [t async for t in conn.subscribe("$topics")]
        assert [(d["first"], d["end"]) for d in listed["damaged"]] == [(40, 41)]
        await publish(conn, "events", [{"n": 100}], producer="p", first_sequence=100)
        assert [r["offset"] for r in await read_range(conn, "events", 100, 101)] == [100]


async def test_damage_to_the_last_synced_record_while_it_runs_costs_that_record_only(tmp_path: pathlib.Path) -> None:
    # It was damage recovery could not place (the record was acknowledged, so not a torn
    # write to cut): the topic was refused until a restart with unclean_recovery. Its offset
    # is now a damaged range, the other records are served and new ones go on after it.
    (tmp_path / "events").mkdir()
    write(tmp_path / "events", 64 << 20)
    broker, printed = await start_daemon("--data-dir", str(tmp_path), "--tcp", "127.0.0.1:0", announces=b"serving")
    try:
        async with rsnet.connect(served_url(printed)) as conn:
            assert len(await read_range(conn, "events", 0, 1)) == 1  # the topic is open
            (segment,) = sorted((tmp_path / "events").glob("*.log"))
            data = bytearray(segment.read_bytes())
            data[-5] ^= 0xFF  # inside the last record, behind the broker's back
            segment.write_bytes(data)
            with pytest.raises(rsnet.StreamError) as raised:
                await read_range(conn, "events", 0, COUNT)
            assert raised.value.code == BrokerCode.STORAGE_ERROR
            with trio.fail_after(10):
                while True:  # closed just after that stream ended, then opened again
                    with pytest.raises(rsnet.StreamError) as raised:
                        await read_range(conn, "events", COUNT - 1, COUNT)
                    if raised.value.code == BrokerCode.OFFSET_DAMAGED:
                        break
                    await trio.sleep(0.05)
            assert raised.value.data["next_intact"] == COUNT
            before = await read_range(conn, "events", 0, COUNT - 1)
            assert [r["value"]["n"] for r in before] == list(range(COUNT - 1))
            await check_new_records_come_after_the_old(conn)
    finally:
        broker.terminate()
        await broker.wait()


async def test_damage_the_broker_cannot_place_while_it_runs_refuses_the_topic_and_says_so_in_health(
    tmp_path: pathlib.Path,
) -> None:
    # Damage a start would refuse (the only segment's format version: a newer rsnet's, or
    # damaged), met at run time by a read of a damaged record: the topic is refused (its
    # other readers and producers too), naming why, and /health says so (it said 200); other
    # topics go on.
    (tmp_path / "events").mkdir()
    write(tmp_path / "events", 64 << 20)
    flags = ("--data-dir", str(tmp_path), "--tcp", "127.0.0.1:0", "--metrics", "127.0.0.1:0")
    broker, printed = await start_daemon(*flags, announces=b"metrics on")
    try:
        port = int(printed.split("metrics on http://", 1)[1].split("/", 1)[0].rsplit(":", 1)[1])
        async with rsnet.connect(served_url(printed)) as conn:
            await publish(conn, "other", [1, 2, 3], producer="p")
            (segment,) = sorted((tmp_path / "events").glob("*.log"))
            data = bytearray(segment.read_bytes())
            data[11] ^= 0x40  # its format version, behind the broker's back
            data[-5] ^= 0xFF  # and the last record, which a read then meets
            segment.write_bytes(data)
            with pytest.raises(rsnet.StreamError) as raised:
                await read_range(conn, "events", 0, COUNT)
            assert raised.value.code == BrokerCode.STORAGE_ERROR
            with trio.fail_after(10):
                while True:  # closed just after that stream ended, then refused
                    with pytest.raises(rsnet.StreamError) as raised:
                        await read_range(conn, "events", 0, 1)
                    if "cannot be opened" in raised.value.message:
                        break
                    await trio.sleep(0.05)
            assert "unclean_recovery" in raised.value.message
            assert [r["value"] for r in await read_range(conn, "other", 0, 3)] == [1, 2, 3]
        health = await http_get(port, "/health")
        assert " 503 " in health.split("\r\n", 1)[0]
        assert '"events": "cannot be opened: ' in health
    finally:
        broker.terminate()
        await broker.wait()


async def test_a_closed_topic_whose_oldest_record_is_damaged_still_gets_its_age_retention(
    tmp_path: pathlib.Path,
) -> None:
    (tmp_path / "events").mkdir()
    write(tmp_path / "events", 64 << 10)
    flip_inside(tmp_path / "events", 0)
    settings = TopicSettings(durable=True, retention=Retention(max_age_ms=10**6))
    broker = Broker(data_dir=tmp_path, settings_for=lambda name: settings)
    async with broker_serving(broker):
        # opened at start for recovery, then closed: its expiry comes from the first readable record
        closed = broker._closed["events"]
        assert closed.first_offset == 0 and closed.expires_ms is not None


async def test_a_log_that_lost_records_its_cursors_passed_is_refused_until_told_to(tmp_path: pathlib.Path) -> None:
    """The newest (here the only) segment deleted by hand leaves no trace in the log, but a
    cursor committed past the log's end shows it: the broker refuses that topic, changing
    nothing, instead of giving the lost offsets to new records that the cursor would then
    skip; with unclean_recovery it opens and says so."""
    async with broker_serving(Broker(data_dir=tmp_path)) as (url, _), rsnet.connect(url) as conn:
        await publish(conn, "events", list(range(10)), producer="p")
        await commit(conn, "events", "dashboards", 10)
    for segment in (tmp_path / "events").glob("*.log"):
        segment.unlink()
    for name in ("synced", "synced.copy"):  # the mark, as an OS crash can lose its last writes
        (tmp_path / "events" / name).unlink()
    cursors = (tmp_path / "events" / "cursors").read_bytes()
    await check_refused_until_unclean(tmp_path, "events", "committed up to offset 10, but the log ends at 0")
    assert (tmp_path / "events" / "cursors").read_bytes() == cursors  # nothing changed
    async with broker_serving(Broker(data_dir=tmp_path, unclean_recovery=True)) as (url, _):
        async with rsnet.connect(url) as conn:
            assert await publish(conn, "events", ["new"], producer="q") == 1


@pytest.mark.parametrize("fsync", [FsyncPolicy.ALWAYS, FsyncPolicy.INTERVAL])
async def test_a_deleted_only_segment_leaves_its_offsets_damaged_and_never_given_again(
    tmp_path: pathlib.Path, fsync: FsyncPolicy
) -> None:
    """No cursor needed: the log's synced mark shows that records were synced beyond what the
    segments hold. It stopped the start, and with unclean_recovery the offsets began at 0
    again; now they are a damaged range and the topic goes on after them, at every start."""
    async with broker_serving(Broker(data_dir=tmp_path, fsync=fsync)) as (url, _), rsnet.connect(url) as conn:
        await publish(conn, "events", list(range(10)), producer="p")
    for segment in (tmp_path / "events").glob("*.log"):
        segment.unlink()
    for start in range(2):
        async with broker_serving(Broker(data_dir=tmp_path, fsync=fsync)) as (url, _), rsnet.connect(url) as conn:
            with pytest.raises(rsnet.StreamError) as raised:
                await read_range(conn, "events", 0, 1)
            assert raised.value.code == BrokerCode.OFFSET_DAMAGED and raised.value.data["next_intact"] == 10
            if not start:
                await publish(conn, "events", ["new"], producer="q")
            assert [r["value"] for r in await read_range(conn, "events", 10, 11)] == ["new"]


async def test_a_cursor_cannot_be_committed_past_the_last_stored_record(tmp_path: pathlib.Path) -> None:
    async with broker_serving(Broker(data_dir=tmp_path)) as (url, _), rsnet.connect(url) as conn:
        await publish(conn, "events", list(range(3)), producer="p")
        await commit(conn, "events", "g", 3)  # up to the end: everything was read
        with pytest.raises(rsnet.StreamError) as rejected:
            await commit(conn, "events", "g", 4)
        assert rejected.value.code == ErrorCode.REJECTED and "at most 3" in rejected.value.message


async def test_damage_found_at_start_stays_in_the_report_when_the_topic_is_opened_again(
    tmp_path: pathlib.Path,
) -> None:
    # Attack round 4: a damaged synced mark was logged, but by the time the topic had been
    # closed and opened again, /health's recovered_damage was empty (the repaired mark left
    # nothing to find): the report of damage stays while the process runs.
    async with broker_serving(Broker(data_dir=tmp_path)) as (url, _), rsnet.connect(url) as conn:
        await publish(conn, "events", [{"n": n} for n in range(10)], producer="p")
    (tmp_path / "events" / "synced").write_bytes(b"\xff" * 24)
    broker = Broker(data_dir=tmp_path)
    async with broker_serving(broker) as (url, _):
        found = list(broker.recovery["events"].damaged)
        assert found and any("synced" in problem for problem in found)
        broker.topic("events", create=False)
        broker._close_topic(broker.topics["events"])
        broker.topic("events", create=False)  # opened again: nothing left to find
        assert broker.recovery["events"].damaged == found


async def test_a_topic_that_cannot_be_opened_is_not_recovered_again_at_every_request(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each attempt to open it reads its whole log: a client repeating a request to it made
    the broker do that at every request. It is refused from the last failure for
    REOPEN_AFTER_S, then tried again."""
    (tmp_path / "events").mkdir()
    write(tmp_path / "events", 64 << 20)
    (segment,) = sorted((tmp_path / "events").glob("*.log"))
    data = bytearray(segment.read_bytes())
    data[11] ^= 0x40  # the only segment's format version: refused until an operator decides
    segment.write_bytes(data)
    opened = []
    real_open = SegmentLog.open

    def counted(*args: Any, **kwargs: Any) -> Any:
        opened.append(args[0])
        return real_open(*args, **kwargs)

    monkeypatch.setattr(SegmentLog, "open", counted)
    async with broker_serving(Broker(data_dir=tmp_path)) as (url, _), rsnet.connect(url) as conn:
        assert len(opened) == 1  # at start
        for _ in range(20):
            with pytest.raises(rsnet.StreamError) as refused:
                await read_range(conn, "events", 0, 1)
            assert refused.value.code == BrokerCode.STORAGE_ERROR and "format version 65" in refused.value.message
        assert len(opened) == 1
        monkeypatch.setattr(broker_module, "REOPEN_AFTER_S", 0.0)  # as if that long had passed
        with pytest.raises(rsnet.StreamError):
            await read_range(conn, "events", 0, 1)
        assert len(opened) == 2
