"""Storage fault injection: a FileOps that fails chosen calls, for the logs under chosen paths.

    faults = FaultyFiles()
    log, _ = SegmentLog.open(directory, file_ops=faults)
    faults.fail("write", errno.ENOSPC, under=directory)     # every write from now on
    faults.fail("datasync", errno.EIO, times=1)               # the next fsync only
    faults.heal()                                             # space is back

Calls that are not told to fail run for real (on the real file system), so a test sees the
log's own files exactly as the fault left them. ``write`` may write part of the data first
(``partial``), as a write that runs out of space does.

:class:`GatedFiles` also holds fsyncs (the broker runs them in worker threads) until a test
lets them go, to look at what happens while one is in flight. Both may be called from
several threads at once. :func:`stored_values` and :func:`open_descriptors` say what a fault
left behind: the records a fresh open finds, the files still held open.
"""

from __future__ import annotations

import dataclasses
import errno as errno_codes
import os
import pathlib
import threading
from typing import Any

from rsnet.broker.storage import SegmentLog
from rsnet.broker.storage.files import FileOps


@dataclasses.dataclass
class _Fault:
    call: str
    errno: int
    under: str
    suffix: str
    times: int | None  # None: until healed
    partial: bool


class FaultyFiles(FileOps):
    """The real file operations, except those a test told to fail."""

    def __init__(self) -> None:
        self._faults: list[_Fault] = []
        self.failed: list[tuple[str, int]] = []  # (call, errno) of every injected failure
        self.calls: list[str] = []  # every call made, by name
        self._lock = threading.Lock()  # fsyncs come from worker threads too

    def fail(
        self,
        call: str,
        errno: int,
        *,
        under: str | os.PathLike[str] = "/",
        suffix: str = "",
        times: int | None = None,
        partial: bool = False,
    ) -> None:
        """Make ``call`` (a FileOps method name) fail with ``errno`` for files under ``under``
        whose name ends with ``suffix``, the next ``times`` times (None: until :meth:`heal`)."""
        if call not in ("open", "write_all", "datasync", "sync_directory", "truncate", "replace", "unlink", "makedirs"):
            raise ValueError(f"no file operation named {call!r}")
        self._faults.append(_Fault(call, errno, os.path.abspath(os.fspath(under)), suffix, times, partial))

    def heal(self) -> None:
        """Every call works again (space freed, disk replaced)."""
        self._faults.clear()

    def _check(self, call: str, path: str | None) -> _Fault | None:
        with self._lock:
            return self._check_locked(call, path)

    def _check_locked(self, call: str, path: str | None) -> _Fault | None:
        self.calls.append(call)
        for fault in self._faults:
            if fault.call != call or (
                path is not None and not (path.startswith(fault.under) and path.endswith(fault.suffix))
            ):
                continue
            if fault.times is not None:
                fault.times -= 1
                if fault.times == 0:
                    self._faults.remove(fault)
            self.failed.append((call, fault.errno))
            return fault
        return None

    def _raise(self, fault: _Fault, path: str | None) -> None:
        raise OSError(fault.errno, os.strerror(fault.errno), path)

    def open(self, path: str, flags: int, mode: int = 0o644) -> int:
        fault = self._check("open", path)
        if fault is not None:
            self._raise(fault, path)
        return super().open(path, flags, mode)

    def write_all(self, fd: int, data: bytes) -> None:
        path = self._path(fd)
        fault = self._check("write_all", path)
        if fault is not None:
            if fault.partial and len(data) > 1:
                os.write(fd, data[: len(data) // 2])
            self._raise(fault, path)
        super().write_all(fd, data)

    def datasync(self, fd: int) -> None:
        path = self._path(fd)
        fault = self._check("datasync", path)
        if fault is not None:
            self._raise(fault, path)
        super().datasync(fd)

    def sync_directory(self, path: str) -> None:
        fault = self._check("sync_directory", os.path.abspath(path))
        if fault is not None:
            self._raise(fault, path)
        super().sync_directory(path)

    def truncate(self, fd: int, size: int) -> None:
        path = self._path(fd)
        fault = self._check("truncate", path)
        if fault is not None:
            self._raise(fault, path)
        super().truncate(fd, size)

    def replace(self, source: str, target: str) -> None:
        fault = self._check("replace", os.path.abspath(target))
        if fault is not None:
            self._raise(fault, target)
        super().replace(source, target)

    def unlink(self, path: str) -> None:
        fault = self._check("unlink", os.path.abspath(path))
        if fault is not None:
            self._raise(fault, path)
        super().unlink(path)

    def makedirs(self, path: str) -> None:
        fault = self._check("makedirs", os.path.abspath(path))
        if fault is not None:
            self._raise(fault, path)
        super().makedirs(path)

    @staticmethod
    def _path(fd: int) -> str | None:
        """The file ``fd`` is open on (Linux: /proc); None where that cannot be told, and then
        a fault matches whatever its path."""
        try:
            return os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            return None


class GatedFiles(FaultyFiles):
    """:class:`FaultyFiles` whose fsyncs (``datasync``) of files under a path wait, while
    :meth:`hold` is in force, until :meth:`release`; then they go on (and fail if told to).

    ``entered`` is set when a held fsync starts waiting; ``synced`` lists the path of every
    fsync that returned, in order."""

    def __init__(self) -> None:
        super().__init__()
        self._held_under: str | None = None
        self._gate = threading.Event()
        self.entered = threading.Event()
        self.synced: list[str | None] = []

    def hold(self, under: str | os.PathLike[str]) -> None:
        self._held_under = os.path.abspath(os.fspath(under))
        self._gate.clear()
        self.entered.clear()

    def release(self) -> None:
        self._held_under = None
        self._gate.set()

    def datasync(self, fd: int) -> None:
        path = self._path(fd)
        held = self._held_under
        if held is not None and path is not None and path.startswith(held):
            self.entered.set()
            if not self._gate.wait(30):  # a test that never releases fails instead of hanging
                raise AssertionError(f"an fsync of {path} was held for 30 s: release() never came")
        super().datasync(fd)
        with self._lock:
            self.synced.append(path)

    def syncs_under(self, under: str | os.PathLike[str]) -> int:
        """How many fsyncs of files under ``under`` have returned."""
        prefix = os.path.abspath(os.fspath(under))
        with self._lock:
            return sum(1 for path in self.synced if path is not None and path.startswith(prefix))


ENOSPC = errno_codes.ENOSPC
EIO = errno_codes.EIO


def stored_values(directory: pathlib.Path) -> list[Any]:
    """The values a fresh open of the log in ``directory`` finds (recovery's view: what is
    really on disk), checking that it found nothing damaged."""
    log, report = SegmentLog.open(directory)
    with log:
        assert report.clean, report.damaged
        return [record.value for record in log.read(log.first_offset, 10**6)]


def open_descriptors(directory: pathlib.Path) -> list[str]:
    """Files under ``directory`` this process has a descriptor open on (Linux: /proc)."""
    found = []
    for name in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue  # the descriptor listdir itself used, closed since
        if target.startswith(str(directory)):
            found.append(target)
    return found
