"""A log's fsync split in three (``begin_sync``, ``PendingSync.run`` on another thread,
``finish_sync``), as the broker runs it to keep fsyncs out of its event loop (issue 13).

Real segment files in tmp dirs, real threads; faults through :class:`FaultyFiles`. A sync that
must be seen in flight is held by :class:`GatedFiles` until the test lets it go.
"""

from __future__ import annotations

import contextlib
import errno
import os
import pathlib
import sys
import threading
from collections.abc import Iterator

import pytest

from rsnet.broker.storage import (
    FsyncPolicy,
    MemoryLog,
    PendingSync,
    Retention,
    SegmentLog,
    WriteFailed,
)

from .storage_faults import FaultyFiles, GatedFiles, open_descriptors, stored_values


def open_log(
    directory: pathlib.Path,
    files: FaultyFiles,
    fsync: FsyncPolicy = FsyncPolicy.ALWAYS,
    segment_bytes: int = 1 << 20,
    retention: Retention | None = None,
) -> SegmentLog:
    log, report = SegmentLog.open(directory, retention or Retention(), fsync, segment_bytes, file_ops=files)
    assert report.clean, report.damaged
    return log


def in_thread(pending: PendingSync) -> tuple[threading.Thread, list[OSError]]:
    """Run ``pending`` on a thread of its own, as the broker's worker does; the OSError it
    raised, if any, is collected in the list."""
    raised: list[OSError] = []

    def run() -> None:
        try:
            pending.run()
        except OSError as failure:
            raised.append(failure)

    thread = threading.Thread(target=run)
    thread.start()
    return thread, raised


def held_in_fsync(
    log: SegmentLog, files: GatedFiles, directory: pathlib.Path
) -> tuple[PendingSync, threading.Thread, list[OSError]]:
    """Begin a sync of ``log`` and run it on a thread (:func:`in_thread`) until it is held inside
    its fsync (``files`` gates ``directory``); ``files.release()`` lets it go on."""
    files.hold(directory)
    pending = log.begin_sync()
    assert pending is not None
    thread, raised = in_thread(pending)
    assert files.entered.wait(10)
    return pending, thread, raised


@contextlib.contextmanager
def release_when_blocked(files: GatedFiles, waiting_in: str) -> Iterator[None]:
    """Let the held fsync go once the main thread is blocked in the function ``waiting_in``
    (seen in its stack): proof that it waited for the sync rather than ran beside it. A main
    thread that never blocks there leaves the fsync held until GatedFiles gives up (30 s)."""
    main = threading.main_thread().ident
    stop = threading.Event()

    def watch() -> None:
        while not stop.wait(0.001):  # poll the main thread's stack: a condition, not a timing
            frame = sys._current_frames().get(main or 0)
            while frame is not None:
                if frame.f_code.co_name == waiting_in:
                    files.release()
                    return
                frame = frame.f_back

    thread = threading.Thread(target=watch)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


# -- the split ----------------------------------------------------------------------------------


def test_append_without_sync_writes_and_a_sync_begun_covers_what_was_written_before_it(
    tmp_path: pathlib.Path,
) -> None:
    files = FaultyFiles()
    log = open_log(tmp_path, files)
    files.calls.clear()  # opening synced the first segment's header
    assert log.append(["a", "b"], timestamp_ms=0, producer="p", first_sequence=0, sync=False) == [0, 1]
    assert files.calls.count("datasync") == 0
    assert (log.next_offset, log.durable_offset) == (2, 0)  # written, readable, not durable
    assert [record.value for record in log.read(0, 10)] == ["a", "b"]

    pending = log.begin_sync()
    assert pending is not None and pending.end_offset == 2
    log.append(["c"], timestamp_ms=0, producer="p", first_sequence=2, sync=False)  # after it began
    pending.run()
    assert log.durable_offset == 0  # not before finish_sync, on the log's thread
    log.finish_sync(pending, None)
    assert (log.durable_offset, log.next_offset) == (2, 3)  # "c" waits for the next sync

    follow_up = log.begin_sync()
    assert follow_up is not None and follow_up.end_offset == 3
    follow_up.run()
    log.finish_sync(follow_up, None)
    assert log.durable_offset == 3 and log.begin_sync() is None  # nothing left to sync
    assert files.calls.count("datasync") == 2
    log.close()
    assert stored_values(tmp_path) == ["a", "b", "c"]


def test_one_sync_covers_every_append_made_while_the_previous_one_ran(tmp_path: pathlib.Path) -> None:
    files = GatedFiles()
    log = open_log(tmp_path, files)
    before = files.syncs_under(tmp_path)  # opening synced the first segment's header
    log.append(["first"], timestamp_ms=0, sync=False)
    running, thread, raised = held_in_fsync(log, files, tmp_path)
    for n in range(50):  # the log's thread goes on appending while the fsync is held
        log.append([n], timestamp_ms=0, sync=False)
    assert (log.next_offset, log.durable_offset) == (51, 0)
    files.release()
    thread.join()
    log.finish_sync(running, None)
    assert log.durable_offset == 1
    group = log.begin_sync()
    assert group is not None and group.end_offset == 51
    group.run()
    log.finish_sync(group, None)
    assert log.durable_offset == 51 and not raised
    assert files.syncs_under(tmp_path) - before == 2  # 51 appends, two fsyncs
    log.close()


def test_the_sync_uses_a_descriptor_of_its_own_so_closing_the_log_cannot_pull_it_away(
    tmp_path: pathlib.Path,
) -> None:
    files = GatedFiles()
    log = open_log(tmp_path, files, FsyncPolicy.NEVER)  # close() does not sync: nothing waits
    log.append(["a"], timestamp_ms=0)
    pending, thread, raised = held_in_fsync(log, files, tmp_path)
    log.close()  # the log's descriptors are closed while the thread is inside fsync
    reused = os.open(os.devnull, os.O_RDONLY)  # may take the number the active segment had
    try:
        files.release()
        thread.join()
    finally:
        os.close(reused)
    assert not raised  # no EBADF, and it synced the segment, not whatever reused a number
    assert [path for path in files.synced if path is not None] == [str(tmp_path / f"{0:020d}.log")]
    assert open_descriptors(tmp_path) == []
    log.finish_sync(pending, None)  # given up when the log closed: nothing happens


def test_a_sync_given_up_before_it_ran_gives_its_descriptors_back(tmp_path: pathlib.Path) -> None:
    files = FaultyFiles()
    log = open_log(tmp_path, files)
    files.calls.clear()  # opening synced the first segment's header
    log.append(["a"], timestamp_ms=0, sync=False)
    pending = log.begin_sync()
    assert pending is not None
    assert len(open_descriptors(tmp_path)) == 3  # the lock, the active segment, the sync's dup
    pending.close()  # e.g. its task was cancelled while waiting for a thread
    pending.run()  # a thread that takes it afterwards does nothing
    assert files.calls.count("datasync") == 0 and len(open_descriptors(tmp_path)) == 2
    log.sync()  # the next sync covers what it would have
    assert log.durable_offset == 1
    log.close()
    assert open_descriptors(tmp_path) == []


def test_a_memory_log_has_nothing_to_sync() -> None:
    log = MemoryLog()
    log.append(["a"], timestamp_ms=0, sync=False)
    assert log.begin_sync() is None and log.durable_offset == 1


# -- failures ----------------------------------------------------------------------------------


def test_an_fsync_failing_in_a_thread_rolls_back_everything_since_the_last_sync_point(
    tmp_path: pathlib.Path,
) -> None:
    files = GatedFiles()
    log = open_log(tmp_path, files)
    log.append(["a"], timestamp_ms=0, producer="p", first_sequence=0)  # synced: acknowledged
    log.append(["b"], timestamp_ms=0, producer="p", first_sequence=1, sync=False)
    pending, thread, raised = held_in_fsync(log, files, tmp_path)
    log.append(["c"], timestamp_ms=0, producer="q", first_sequence=0, sync=False)  # while it runs
    files.fail("datasync", errno.EIO, under=tmp_path, times=1)
    files.release()
    thread.join()
    assert len(raised) == 1
    with pytest.raises(WriteFailed, match="Input/output error"):
        log.finish_sync(pending, raised[0])
    # "b" and "c" were never durable, so never acknowledged: cut, and their producers forgotten
    assert (log.next_offset, log.durable_offset, log.last_sequence("p"), log.last_sequence("q")) == (1, 1, 0, None)
    assert log.append(["b2"], timestamp_ms=0, producer="p", first_sequence=1) == [1]  # goes on
    log.close()
    assert stored_values(tmp_path) == ["a", "b2"]  # offset 1 was never acknowledged before: not reused


def test_a_sync_that_cannot_get_a_descriptor_fails_without_touching_the_log(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = FaultyFiles()
    log = open_log(tmp_path, files)
    log.append(["a"], timestamp_ms=0, sync=False)

    def no_descriptors(fd: int) -> int:
        raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))

    with monkeypatch.context() as patched:
        patched.setattr(os, "dup", no_descriptors)
        with pytest.raises(WriteFailed, match="Too many open files"):
            log.begin_sync()
    assert (log.next_offset, log.durable_offset) == (1, 0)
    log.sync()
    assert log.durable_offset == 1
    log.close()


# -- what waits for a sync in flight ------------------------------------------------------------------


@pytest.mark.parametrize("fails", [False, True], ids=["it succeeds", "it fails"])
def test_rolling_to_a_new_segment_waits_for_the_sync_in_flight_and_finishes_it(
    tmp_path: pathlib.Path, fails: bool
) -> None:
    files = GatedFiles()
    log = open_log(tmp_path, files, segment_bytes=400)
    for n in range(5):
        log.append([f"{n:040d}"], timestamp_ms=0, producer="p", first_sequence=n, sync=False)
    pending, thread, raised = held_in_fsync(log, files, tmp_path)
    if fails:
        files.fail("datasync", errno.EIO, under=tmp_path, times=1)

    def fill_the_segment() -> None:
        for n in range(5, 20):
            log.append([f"{n:040d}"], timestamp_ms=0, producer="p", first_sequence=n, sync=False)

    with release_when_blocked(files, "wait"):  # PendingSync.wait, called by the roll
        if fails:  # the roll finishes the failed sync: the append rolls back and raises
            with pytest.raises(WriteFailed, match="Input/output error"):
                fill_the_segment()
        else:
            fill_the_segment()
    thread.join()
    assert len(raised) == int(fails)
    if fails:
        assert (log.next_offset, log.durable_offset) == (0, 0)  # nothing had been synced
    else:
        assert len([name for name in os.listdir(tmp_path) if name.endswith(".log")]) > 1  # it rolled
        assert log.durable_offset >= 5  # the roll finished the sync that ran, then synced the rest
    log.finish_sync(pending, raised[0] if raised else None)  # already finished: nothing
    log.close()
    expected = [] if fails else [f"{n:040d}" for n in range(20)]
    assert stored_values(tmp_path) == expected


def test_closing_waits_for_the_sync_in_flight_then_syncs_the_rest(tmp_path: pathlib.Path) -> None:
    files = GatedFiles()
    log = open_log(tmp_path, files)
    before = files.syncs_under(tmp_path)
    log.append(["a"], timestamp_ms=0, sync=False)
    _, thread, raised = held_in_fsync(log, files, tmp_path)
    log.append(["b"], timestamp_ms=0, sync=False)
    with release_when_blocked(files, "wait"):
        log.close()
    thread.join()
    assert not raised
    assert files.syncs_under(tmp_path) - before == 2  # the one in flight, then close's own for "b"
    assert stored_values(tmp_path) == ["a", "b"]


def test_retention_may_delete_a_segment_while_a_sync_runs(tmp_path: pathlib.Path) -> None:
    files = GatedFiles()
    log = open_log(tmp_path, files, segment_bytes=200, retention=Retention(max_records=3))
    for n in range(12):
        log.append([f"{n:030d}"], timestamp_ms=0)  # synced, several sealed segments
    log.append(["last"], timestamp_ms=0, sync=False)
    # The segments' fsync is held (every segment's name starts with 0000), not the synced mark's,
    # which retention syncs first: another file, so not an fsync of what the sync covers.
    pending, thread, raised = held_in_fsync(log, files, tmp_path / "0000")
    assert log.enforce_retention(0) > 0  # deletes sealed segments: none is the sync's
    files.release()
    thread.join()
    log.finish_sync(pending, raised[0] if raised else None)
    assert not raised and log.durable_offset == 13
    log.close()
    assert stored_values(tmp_path)[-1] == "last"
