"""``$commit`` on a durable topic: answered once the commit is stored, the cursor file written
off the event loop, and commits that arrive while a write runs share the next one, so a flood
of commits costs one write per write's duration, not one file rewrite per commit (server/README,
"Resource budget")."""

from __future__ import annotations

import errno
import threading
from typing import Any

import pytest
import trio

import rsnet
from rsnet.broker.broker import Broker
from rsnet.broker.client import commit, publish
from rsnet.broker.codes import BrokerCode
from rsnet.broker.storage import cursors as cursor_files
from rsnet.broker.storage.files import FileOps
from rsnet.protocol import Batch, Complete, Error, Next, Subscribe

from .support import RawClient, broker_running


class HeldWrites:
    """The cursor file's fsyncs, counted, and held while ``hold`` is clear (a slow disk)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.writes = 0
        self.release = threading.Event()
        self.release.set()
        self.entered = threading.Event()
        self.failure: int | None = None
        writes = self

        class Held(FileOps):
            def datasync(self, fd: int) -> None:
                writes.entered.set()
                assert writes.release.wait(10), "a cursor write was held for 10 s"
                if writes.failure is not None:
                    raise OSError(writes.failure, "injected")
                writes.writes += 1
                super().datasync(fd)

        monkeypatch.setattr(cursor_files, "REAL", Held())  # the file operations cursor writes use


def commit_frames(first_id: int, count: int, offsets: list[int]) -> list[Subscribe]:
    return [
        Subscribe(first_id + 2 * n, "$commit", {"topic": "jobs", "cursor": "c", "offset": offsets[n]}, 1, {})
        for n in range(count)
    ]


async def answers(client: RawClient, stream_ids: list[int]) -> dict[int, Any]:
    """Each stream's NEXT item (then COMPLETE) or ERROR."""
    got: dict[int, Any] = {}
    while len(got) < len(stream_ids):
        frame = await client.next_frame()
        if isinstance(frame, Next):
            got[frame.stream_id] = frame.item
        elif isinstance(frame, Batch):
            (got[frame.stream_id],) = frame.items
        elif isinstance(frame, Error):
            got[frame.stream_id] = frame
        else:
            assert isinstance(frame, Complete) or frame.stream_id in stream_ids
    return got


async def test_commits_arriving_during_a_write_share_the_next_one_and_the_loop_goes_on(tmp_path, monkeypatch):
    writes = HeldWrites(monkeypatch)
    async with broker_running(Broker(data_dir=tmp_path)) as url, rsnet.connect(url) as conn:
        assert await publish(conn, "jobs", list(range(10))) == 10
        client = await RawClient.connect(url)
        writes.release.clear()
        await client.send(*commit_frames(1, 1, [1]))
        await trio.to_thread.run_sync(writes.entered.wait, 10)  # the first write runs, held
        await client.send(*commit_frames(3, 100, [n % 10 for n in range(100)]))
        assert await publish(conn, "other", ["meanwhile"]) == 1  # the event loop goes on
        early: list[Any] = []
        with trio.move_on_after(0.05):  # what arrives meanwhile: ACCEPTs only, no answer
            while True:
                early.append(await client.next_frame())
        assert not [frame for frame in early if isinstance(frame, (Next, Batch, Complete, Error))]
        writes.release.set()
        got = await answers(client, list(range(1, 203, 2)))
        assert all(isinstance(item, dict) for item in got.values())
        assert writes.writes == 2  # one for the first commit, one for the 100 that came meanwhile
        assert [r["value"] for r in await take_from_cursor(conn)] == [9]  # the last commit (offset 99 % 10)


async def take_from_cursor(conn: rsnet.Client) -> list[dict[str, Any]]:
    async with conn.subscribe("jobs", {"cursor": "c"}) as items:
        async for item in items:
            return [item]
    return []


async def test_a_commit_of_the_stored_offset_writes_nothing(tmp_path, monkeypatch):
    writes = HeldWrites(monkeypatch)
    async with broker_running(Broker(data_dir=tmp_path)) as url, rsnet.connect(url) as conn:
        assert await publish(conn, "jobs", [1, 2]) == 2
        await commit(conn, "jobs", "c", 1)
        for _ in range(50):
            await commit(conn, "jobs", "c", 1)
        assert writes.writes == 1


async def test_a_failing_cursor_write_refuses_the_commits_it_held_and_the_next_one_works(tmp_path, monkeypatch):
    writes = HeldWrites(monkeypatch)
    async with broker_running(Broker(data_dir=tmp_path)) as url, rsnet.connect(url) as conn:
        assert await publish(conn, "jobs", [1, 2]) == 2
        writes.failure = errno.ENOSPC
        with pytest.raises(rsnet.StreamError) as refused:
            await commit(conn, "jobs", "c", 1)
        assert refused.value.code == BrokerCode.STORAGE_FULL and refused.value.data == {"topic": "jobs"}
        writes.failure = None
        await commit(conn, "jobs", "c", 2)
        (listed,) = [t async for t in conn.subscribe("$topics")]
        assert listed["cursors"] == {"c": 2}
