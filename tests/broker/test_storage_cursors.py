"""CursorStore: committed offsets survive reopening; a damaged file is a clear error, never a silent reset."""

from __future__ import annotations

import os
import pathlib

import pytest

import rsnet
from rsnet.broker.broker import Broker
from rsnet.broker.client import commit, publish
from rsnet.broker.storage import CorruptData, CursorStore

from .support import broker_running, check_refused_until_unclean


def test_a_new_store_is_empty(tmp_path: pathlib.Path) -> None:
    store = CursorStore.open(tmp_path / "cursors")
    assert store.get("group") is None and store.all() == {}
    assert not (tmp_path / "cursors").exists()  # nothing written until a commit


def test_commits_survive_reopening(tmp_path: pathlib.Path) -> None:
    store = CursorStore.open(tmp_path / "topic" / "cursors")
    store.commit("billing", 10)
    store.commit("audit", 0)
    store.commit("billing", 42)
    assert store.get("billing") == 42
    reopened = CursorStore.open(tmp_path / "topic" / "cursors")
    assert reopened.all() == {"billing": 42, "audit": 0}


def test_a_cursor_can_be_deleted(tmp_path: pathlib.Path) -> None:
    store = CursorStore.open(tmp_path / "cursors")
    store.commit("a", 1)
    store.commit("b", 2)
    assert store.delete("a") is True and store.delete("a") is False
    assert CursorStore.open(tmp_path / "cursors").all() == {"b": 2}


def test_all_returns_a_copy(tmp_path: pathlib.Path) -> None:
    store = CursorStore.open(tmp_path / "cursors")
    store.commit("a", 1)
    store.all()["a"] = 99
    assert store.get("a") == 1


def test_names_and_offsets_are_checked(tmp_path: pathlib.Path) -> None:
    store = CursorStore.open(tmp_path / "cursors")
    for name, offset in [("", 1), (3, 1), ("a", -1), ("a", 1.0), ("a", True)]:
        with pytest.raises(ValueError):
            store.commit(name, offset)  # type: ignore[arg-type]
    assert store.all() == {}


def test_a_commit_interrupted_before_its_rename_leaves_the_previous_cursors(tmp_path: pathlib.Path) -> None:
    store = CursorStore.open(tmp_path / "cursors")
    store.commit("a", 1)
    (tmp_path / "cursors.tmp").write_bytes(b"half a new file")
    reopened = CursorStore.open(tmp_path / "cursors")
    assert reopened.all() == {"a": 1}
    assert not (tmp_path / "cursors.tmp").exists()


def committed(tmp_path: pathlib.Path) -> pathlib.Path:
    store = CursorStore.open(tmp_path / "cursors")
    store.commit("consumers", 1234)
    store.commit("other", 5)
    return tmp_path / "cursors"


def test_a_flipped_byte_is_reported_with_file_and_position(tmp_path: pathlib.Path) -> None:
    path = committed(tmp_path)
    data = bytearray(path.read_bytes())
    data[-3] ^= 0x01
    path.write_bytes(data)
    with pytest.raises(CorruptData, match=r"cursors: corrupt data at byte 12: CRC mismatch") as error:
        CursorStore.open(path)
    assert (error.value.path, error.value.position) == (str(path), 12)
    assert path.read_bytes() == data  # left for the operator to look at


def test_a_cut_off_file_is_reported(tmp_path: pathlib.Path) -> None:
    path = committed(tmp_path)
    os.truncate(path, os.path.getsize(path) - 4)
    with pytest.raises(CorruptData, match="frame cut off"):
        CursorStore.open(path)


def test_a_file_that_is_not_a_cursor_file_is_reported(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "cursors"
    path.write_text('{"consumers": 1234}')
    with pytest.raises(CorruptData, match="at byte 0: not a cursor file"):
        CursorStore.open(path)


def test_bytes_after_the_cursors_are_reported(tmp_path: pathlib.Path) -> None:
    path = committed(tmp_path)
    with open(path, "ab") as file:
        file.write(b"\x00")
    with pytest.raises(CorruptData, match="extra bytes after the cursors"):
        CursorStore.open(path)


@pytest.mark.parametrize("damage", ["a flipped bit", "a directory in its place"])
async def test_unreadable_cursors_refuse_their_topic_unless_unclean_recovery(
    tmp_path: pathlib.Path, damage: str
) -> None:
    """Attack round 4: a damaged cursors file was set aside and the start went on, so a consumer
    resuming by its cursor (committed at 5) started at its ``from`` instead, skipping records,
    with /health at 200. Now its topic is refused, as for damage recovery cannot place (it
    stopped the whole broker's start until this session); with ``unclean_recovery`` it is
    moved aside, said in the log and in the topic's recovery report (which /health shows),
    and every cursor restarts."""
    async with broker_running(Broker(data_dir=tmp_path)) as url, rsnet.connect(url) as conn:
        await publish(conn, "jobs", list(range(10)))
        await commit(conn, "jobs", "workers", 5)
    cursors = tmp_path / "jobs" / "cursors"
    if damage == "a flipped bit":
        data = bytearray(cursors.read_bytes())
        data[-1] ^= 0xFF
        cursors.write_bytes(bytes(data))
    else:
        cursors.unlink()
        cursors.mkdir()
    await check_refused_until_unclean(tmp_path, "jobs", r"jobs/cursors: the committed cursors cannot be read")
    assert cursors.exists() and not list(cursors.parent.glob("cursors.corrupt-*"))  # nothing was changed
    broker = Broker(data_dir=tmp_path, unclean_recovery=True)
    async with broker_running(broker) as url, rsnet.connect(url) as conn:
        await publish(conn, "jobs", [10])  # opens the topic (and its cursors)
        (problem,) = broker.recovery["jobs"].damaged
        assert problem.startswith("cursors could not be read (") and problem.endswith("every cursor restarts")
    assert len(list(cursors.parent.glob("cursors.corrupt-*"))) == 1


async def test_a_commit_that_could_not_be_stored_is_not_stored_by_the_next_write(tmp_path: pathlib.Path) -> None:
    # Attack round 4: a commit refused with STORAGE_FULL stayed staged, and the next commit's
    # write stored it after all; BROKER.md says a refused commit is not stored.
    broker = Broker(data_dir=tmp_path)
    async with broker_running(broker) as url, rsnet.connect(url) as conn:
        await publish(conn, "jobs", list(range(10)))
        await commit(conn, "jobs", "workers", 2)
        blocker = tmp_path / "jobs" / "cursors.tmp"
        blocker.mkdir()  # the cursor file's safe write cannot open its temporary file
        with pytest.raises(rsnet.StreamError, match="could not be stored"):
            await commit(conn, "jobs", "workers", 5)
        blocker.rmdir()
        await commit(conn, "jobs", "others", 7)
    assert CursorStore.open(tmp_path / "jobs" / "cursors").all() == {"workers": 2, "others": 7}
