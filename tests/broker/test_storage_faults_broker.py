"""Storage faults through the broker (issue 10, finding 2): a full or failing disk refuses that
topic's producers with a coded error and nothing else.

In process, with the broker's logs opened through :class:`FaultyFiles`; then for real: the
daemon on a 1 MiB tmpfs that fills up, and on a read-only mount (these two need root to mount
a tmpfs and are skipped, saying so, without it).
"""

from __future__ import annotations

import errno
import json
import logging
import os
import pathlib
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
import trio

import rsnet
from rsnet.broker.broker import Broker
from rsnet.broker.client import publish
from rsnet.broker.codes import BrokerCode
from rsnet.broker.daemon import metrics_refresher
from rsnet.broker.metrics import BrokerMetrics
from rsnet.broker.storage import StorageError
from rsnet.protocol import ErrorCode

from .storage_faults import FaultyFiles
from .support import broker_serving, served_url, start_daemon


def subscribe(conn: rsnet.Client, topic: str, params: dict[str, Any]) -> Any:
    return conn.subscribe(topic, params, prefetch=1024)


def faulty_broker(data_dir: pathlib.Path, **settings: Any) -> tuple[Broker, FaultyFiles]:
    """A broker on ``data_dir`` whose logs are opened through a :class:`FaultyFiles`."""
    broker = Broker(data_dir=data_dir, **settings)
    broker.storage_files = faults = FaultyFiles()
    return broker, faults


async def read_all(conn: rsnet.Client, topic: str) -> list[Any]:
    topics = {t["topic"]: t async for t in conn.subscribe("$topics")}
    end = topics[topic]["next_offset"]
    records: list[dict[str, Any]] = []
    if end:
        async with subscribe(conn, topic, {"from": "earliest"}) as items:
            async for record in items:
                records.append(record)
                if record["offset"] == end - 1:
                    break
    assert [r["offset"] for r in records] == list(range(end))
    return [r["value"] for r in records]


async def test_a_full_disk_refuses_that_topics_producers_coded_and_appends_resume_when_space_is_back(
    tmp_path: pathlib.Path,
) -> None:
    broker, faults = faulty_broker(tmp_path)
    metrics = BrokerMetrics()
    async with broker_serving(broker) as (url, server), rsnet.connect(url) as conn:
        refresh = metrics_refresher(broker, server)
        await publish(conn, "full", list(range(100)), producer="p")
        await publish(conn, "other", list(range(10)), producer="q")

        faults.fail("write_all", errno.ENOSPC, under=tmp_path / "full")
        with pytest.raises(rsnet.StreamError) as refused:
            await publish(conn, "full", list(range(100, 200)), producer="p", first_sequence=100)
        assert refused.value.code == BrokerCode.STORAGE_FULL
        assert "No space left on device" in refused.value.message and refused.value.data == {"topic": "full"}

        assert await read_all(conn, "full") == list(range(100))  # readers of what is stored go on
        await publish(conn, "other", list(range(10, 20)), producer="q", first_sequence=10)  # unaffected
        assert await read_all(conn, "other") == list(range(20))
        refresh(metrics)
        sample = metrics.registry.get_sample_value
        assert sample("rsnet_broker_storage_failing", {"topic": "full"}) == 1
        assert sample("rsnet_broker_storage_failures_total", {"topic": "full"}) >= 1
        assert sample("rsnet_broker_storage_failing", {"topic": "other"}) == 0
        assert broker.topics["full"].storage_failure is not None

        faults.heal()  # space is back: the next offer is stored, nothing twice
        await publish(conn, "full", list(range(100, 200)), producer="p", first_sequence=100)
        assert await read_all(conn, "full") == list(range(200))
        refresh(metrics)
        assert sample("rsnet_broker_storage_failing", {"topic": "full"}) == 0


async def test_an_offer_past_the_records_a_full_disk_refused_is_refused_so_their_resend_is_stored(
    tmp_path: pathlib.Path,
) -> None:
    # Attack round 4: a producer's offer of 100..139 was refused (full disk); its next offer,
    # 140..179, sent before it heard, was stored once space was back; its resend of 100..179,
    # as BROKER.md says, was then dropped up to 179 as duplicates and acknowledged: 100..139
    # acknowledged and never stored.
    broker, faults = faulty_broker(tmp_path)
    async with broker_serving(broker) as (url, _), rsnet.connect(url) as conn:
        await publish(conn, "t", list(range(100)), producer="p")
        faults.fail("write_all", errno.ENOSPC, under=tmp_path / "t")
        with pytest.raises(rsnet.StreamError) as refused:
            await publish(conn, "t", list(range(100, 140)), producer="p", first_sequence=100)
        assert refused.value.code == BrokerCode.STORAGE_FULL
        faults.heal()
        with pytest.raises(rsnet.StreamError) as gap:  # the pipelined offer, after the gap
            await publish(conn, "t", list(range(140, 180)), producer="p", first_sequence=140)
        assert gap.value.code == ErrorCode.REJECTED
        assert gap.value.data == {"topic": "t", "producer": "p", "sequence": 100}
        assert await read_all(conn, "t") == list(range(100))  # nothing of it was stored
        await publish(conn, "t", list(range(100, 180)), producer="p", first_sequence=100)  # the resend
        assert await read_all(conn, "t") == list(range(180))
        await publish(conn, "t", list(range(200, 210)), producer="p", first_sequence=200)  # gaps as before
        assert await read_all(conn, "t") == [*range(180), *range(200, 210)]
        assert broker.fences.resume("t", "p") is None


async def test_a_new_producers_offer_past_its_refused_first_records_is_refused_too(tmp_path: pathlib.Path) -> None:
    # Re-check of the fence: a producer that had never stored a record has no highest
    # sequence to resume after; its pipelined 40..79 was stored and its resend of 0..79
    # acknowledged with 0..39 missing. The fence holds where its refused offer began.
    broker, faults = faulty_broker(tmp_path)
    async with broker_serving(broker) as (url, _), rsnet.connect(url) as conn:
        await publish(conn, "t", ["q"], producer="q")
        faults.fail("write_all", errno.ENOSPC, under=tmp_path / "t")
        with pytest.raises(rsnet.StreamError):
            await publish(conn, "t", list(range(40)), producer="p")
        faults.heal()
        with pytest.raises(rsnet.StreamError) as gap:
            await publish(conn, "t", list(range(40, 80)), producer="p", first_sequence=40)
        assert gap.value.code == ErrorCode.REJECTED and gap.value.data["sequence"] == 0
        await publish(conn, "t", list(range(80)), producer="p")
        assert await read_all(conn, "t") == ["q", *range(80)]


async def failing_for_lack_of_space(broker: Broker, faults: FaultyFiles, conn: rsnet.Client, data_dir: pathlib.Path):
    """Topic "full", its records 0 to 9 stored, then an offer refused by a full disk."""
    await publish(conn, "full", list(range(10)), producer="p")
    faults.fail("write_all", errno.ENOSPC, under=data_dir / "full")
    with pytest.raises(rsnet.StreamError):
        await publish(conn, "full", [10], producer="p", first_sequence=10)
    return broker.topics["full"]


async def test_a_topic_whose_storage_works_again_stops_failing_without_waiting_for_a_producer(
    tmp_path: pathlib.Path,
) -> None:
    # /health stayed 503 after a spell of descriptors running out, until someone published to
    # that topic again: the sweep now checks a failing topic's storage and clears it.
    broker, faults = faulty_broker(tmp_path, retention_sweep_s=0.05)
    async with broker_serving(broker) as (url, _), rsnet.connect(url) as conn:
        topic = await failing_for_lack_of_space(broker, faults, conn, tmp_path)
        checks = len([call for call in faults.calls if call == "write_all"])
        with trio.fail_after(10):
            while len([call for call in faults.calls if call == "write_all"]) < checks + 3:
                await trio.sleep(0.05)  # three sweeps looked: still full, still failing
        assert topic.storage_failure is not None
        faults.heal()
        with trio.fail_after(10):
            while topic.storage_failure is not None:
                await trio.sleep(0.05)
        assert not list((tmp_path / "full").glob(".rsnet-write-check"))
        await publish(conn, "full", [10], producer="p", first_sequence=10)
        assert await read_all(conn, "full") == list(range(11))


async def test_a_disk_without_room_for_a_record_does_not_count_as_working_again(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Attack round 5: 300 KB free, a producer retrying 600 KB records. The sweep's 4 KiB
    # block fit, so the topic went from failing to working and back at every retry: /health
    # flapped 200/503 and each pair logged two lines. It now wants room for a record too.
    broker, faults = faulty_broker(tmp_path, retention_sweep_s=0.05)
    async with broker_serving(broker) as (url, _), rsnet.connect(url) as conn:
        topic = await failing_for_lack_of_space(broker, faults, conn, tmp_path)
        real_statvfs = os.statvfs
        free = {"bytes": broker.max_record_bytes - 1}
        looked: list[Any] = []

        def statvfs(path: Any) -> Any:
            looked.append(path)
            found = real_statvfs(path)
            return os.statvfs_result((found.f_bsize, 1, found.f_blocks, free["bytes"], free["bytes"], *found[5:]))

        monkeypatch.setattr(os, "statvfs", statvfs)
        faults.heal()  # a block can be written again, but a record does not fit
        with trio.fail_after(10):
            while len(looked) < 3:
                await trio.sleep(0.05)  # three sweeps looked: still no room, still failing
        assert topic.storage_failure is not None
        free["bytes"] = broker.max_record_bytes
        with trio.fail_after(10):
            while topic.storage_failure is not None:
                await trio.sleep(0.05)


async def test_an_append_that_writes_nothing_does_not_say_the_disk_works_again(tmp_path: pathlib.Path, caplog) -> None:
    # Re-check of attack round 5: on a full disk, an offer of records all stored already (a
    # resend) appended nothing, without error, and so cleared the failure: /health flapped
    # and the next refusal logged "storage failed" again, one line per offer.
    broker, faults = faulty_broker(tmp_path, retention_sweep_s=3600)
    async with broker_serving(broker) as (url, _), rsnet.connect(url) as conn:
        topic = await failing_for_lack_of_space(broker, faults, conn, tmp_path)
        await publish(conn, "full", list(range(10)), producer="p")  # duplicates: nothing written
        assert topic.storage_failure is not None
        with pytest.raises(rsnet.StreamError):
            await publish(conn, "full", [10], producer="p", first_sequence=10)
        assert len([r for r in caplog.records if "storage failed" in r.getMessage()]) == 1


async def test_a_topic_no_disk_space_lets_create_logs_a_bounded_number_of_lines(tmp_path: pathlib.Path, caplog) -> None:
    # A client retrying a publish to a topic the full disk cannot create wrote one ERROR line
    # per attempt (2,000 in 0.8 s).
    broker, faults = faulty_broker(tmp_path)
    async with broker_serving(broker) as (url, _), rsnet.connect(url) as conn:
        faults.fail("makedirs", errno.ENOSPC, under=tmp_path / "new")
        with caplog.at_level(logging.ERROR, "rsnet.broker"):
            for attempt in range(50):
                with pytest.raises(rsnet.StreamError) as refused:
                    await publish(conn, "new", [attempt], producer="p")
                assert refused.value.code == BrokerCode.STORAGE_FULL
    lines = [r for r in caplog.records if "cannot be opened" in r.getMessage()]
    assert 1 <= len(lines) <= 10


async def test_a_topic_a_full_disk_cannot_create_leaves_no_directory_and_is_created_once_there_is_room(
    tmp_path: pathlib.Path,
) -> None:
    # Attack round of session 21: the refused create left a directory holding only the lock
    # (until the next start removed it).
    broker, faults = faulty_broker(tmp_path)
    async with broker_serving(broker) as (url, _), rsnet.connect(url) as conn:
        faults.fail("write_all", errno.ENOSPC, under=tmp_path / "new")  # its first segment's header
        with pytest.raises(rsnet.StreamError) as refused:
            await publish(conn, "new", [1], producer="p")
        assert refused.value.code == BrokerCode.STORAGE_FULL
        assert not (tmp_path / "new").exists()
        assert "new" not in broker.topic_names()
        faults.heal()
        await publish(conn, "new", [1, 2], producer="p")
        assert await read_all(conn, "new") == [1, 2]


async def test_a_failing_fsync_refuses_producers_and_loses_nothing_acknowledged(tmp_path: pathlib.Path) -> None:
    broker, faults = faulty_broker(tmp_path)
    async with broker_serving(broker) as (url, _), rsnet.connect(url) as conn:
        await publish(conn, "events", list(range(50)), producer="p")
        faults.fail("datasync", errno.EIO, under=tmp_path / "events")
        with pytest.raises(rsnet.StreamError) as refused:
            await publish(conn, "events", list(range(50, 80)), producer="p", first_sequence=50)
        assert refused.value.code == BrokerCode.STORAGE_ERROR
        assert await read_all(conn, "events") == list(range(50))
        faults.heal()
        await publish(conn, "events", list(range(50, 80)), producer="p", first_sequence=50)
        assert await read_all(conn, "events") == list(range(80))


async def test_a_data_dir_that_cannot_be_written_stops_the_broker_before_it_serves(tmp_path: pathlib.Path) -> None:
    faults = FaultyFiles()
    faults.fail("open", errno.EROFS, under=tmp_path)
    broker = Broker(data_dir=tmp_path)
    broker.storage_files = faults
    async with trio.open_nursery() as nursery:
        with pytest.raises(StorageError, match=r"data_dir .* cannot be written \(\[Errno 30\] Read-only file system"):
            await nursery.start(broker.run)


@pytest.mark.parametrize("call", ["write_all", "datasync"])
async def test_a_failed_start_up_write_check_leaves_no_file_behind(tmp_path: pathlib.Path, call: str) -> None:
    """The start-up check writes, syncs and removes a probe file in data_dir; when the disk
    refuses the write or the sync, the broker says so and removes the probe all the same."""
    faults = FaultyFiles()
    faults.fail(call, errno.ENOSPC, under=tmp_path)
    broker = Broker(data_dir=tmp_path)
    broker.storage_files = faults
    async with trio.open_nursery() as nursery:
        with pytest.raises(StorageError, match=r"data_dir .* cannot be written .*No space left"):
            await nursery.start(broker.run)
    assert [path.name for path in tmp_path.iterdir() if path.name.startswith(".rsnet-write")] == []


# -- real file systems --------------------------------------------------------------------------------


def mounted_tmpfs(path: pathlib.Path, size: str) -> Iterator[pathlib.Path]:
    if os.geteuid() != 0:
        pytest.skip(f"mounting a {size} tmpfs needs root (running as uid {os.geteuid()})")
    path.mkdir()
    mount = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True)
    if mount.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mount.stderr.decode().strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=True)


@pytest.fixture
def small_disk(tmp_path: pathlib.Path) -> Iterator[pathlib.Path]:
    yield from mounted_tmpfs(tmp_path / "small", "1m")


async def get_health(url: str) -> tuple[int, dict[str, Any]]:
    host, port = url.removeprefix("http://").split("/")[0].split(":")
    stream = await trio.open_tcp_stream(host, int(port))
    async with stream:
        await stream.send_all(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        response = b""
        while data := await stream.receive_some(65536):
            response += data
    head, body = response.split(b"\r\n\r\n", 1)
    return int(head.split()[1]), json.loads(body)


async def test_a_real_full_file_system_refuses_producers_and_recovers_when_space_is_freed(
    small_disk: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    ballast = small_disk / "ballast"
    ballast.write_bytes(bytes(700 << 10))  # leaves ~300 KiB for the topics
    config = tmp_path / "rsnet.toml"
    config.write_text('[metrics]\nlisten = "127.0.0.1:0"\n')
    process, printed = await start_daemon(
        "--config", str(config), "--data-dir", str(small_disk), "--tcp", "127.0.0.1:0", announces=b"durable in"
    )
    metrics_url = printed.split("metrics on ", 1)[1].split()[0]
    try:
        async with rsnet.connect(served_url(printed)) as conn:
            await publish(conn, "other", ["small"], producer="o")
            record = "x" * 1000
            acknowledged = 0
            with pytest.raises(rsnet.StreamError) as refused:
                while True:  # fill the disk, acknowledged batch by batch
                    await publish(conn, "big", [record] * 20, producer="p", first_sequence=acknowledged)
                    acknowledged += 20
                    assert acknowledged < 2000, "a 1 MiB file system never filled up"
            assert refused.value.code == BrokerCode.STORAGE_FULL
            status, health = await get_health(metrics_url)
            assert status == 503 and "big" in health["storage_failing"]
            stored = await read_all(conn, "big")
            assert stored[:acknowledged] == [record] * acknowledged  # everything acknowledged is there
            assert await read_all(conn, "other") == ["small"]  # and other topics' records are served

            ballast.unlink()  # space is back
            await publish(conn, "big", ["after"], producer="p", first_sequence=len(stored))
            assert (await read_all(conn, "big"))[-1] == "after"
            status, health = await get_health(metrics_url)
            assert status == 200 and health["storage_failing"] == {}
    finally:
        process.terminate()
        with trio.fail_after(10):
            await process.wait()


async def test_a_read_only_data_dir_is_refused_at_start_up_with_the_reason(tmp_path: pathlib.Path) -> None:
    for disk in mounted_tmpfs(tmp_path / "ro", "1m"):
        (disk / "events").mkdir()
        subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
        process = await trio.run_process(
            [sys.executable, "-m", "rsnet.cli", "broker", "--data-dir", str(disk), "--tcp", "127.0.0.1:0"],
            capture_stderr=True,
            check=False,
        )
        printed = process.stderr.decode()
        assert process.returncode == 1, printed
        assert f"cannot start: data_dir {disk} cannot be written" in printed and "Read-only file system" in printed
        assert "topics durable in" not in printed and "serving" not in printed and "Traceback" not in printed
