"""The file-system calls durability rests on, in one place, behind one seam.

``datasync`` forces a file's data (and the metadata needed to read it back, such as its size)
to stable storage: ``fdatasync`` on Linux, ``F_FULLFSYNC`` on macOS (where ``fsync`` only
reaches the drive's cache). ``sync_directory`` does the same for a directory's entries, so a
file created, renamed or deleted stays that way after a power failure.

:class:`FileOps` is every call by which a log changes its files (open for writing, write,
sync, truncate, rename, delete). A :class:`SegmentLog` makes them all through the instance it
was opened with, so a test can pass a subclass that fails chosen calls with ``ENOSPC`` or
``EIO`` (see ``tests/broker/storage_faults.py``) and check what the log, the topic and the
broker then do. Reads go to ``os`` directly: they change nothing.

This module imports the standard library only.
"""

from __future__ import annotations

import fcntl
import os
import sys

if sys.platform == "darwin":  # pragma: no cover

    def datasync(fd: int) -> None:
        fcntl.fcntl(fd, fcntl.F_FULLFSYNC)

else:
    datasync = getattr(os, "fdatasync", os.fsync)


def sync_directory(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_all(fd: int, data: bytes) -> None:
    """Write all of ``data`` (``os.write`` may write less than asked, e.g. near a full disk)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


class FileOps:
    """The calls a log changes its files with; subclass to inject faults (see the module docstring).

    Every method raises OSError as the system call it wraps does.
    """

    def open(self, path: str, flags: int, mode: int = 0o644) -> int:
        """``os.open`` (close-on-exec added); the caller closes the descriptor with ``os.close``."""
        return os.open(path, flags | os.O_CLOEXEC, mode)

    def write_all(self, fd: int, data: bytes) -> None:
        write_all(fd, data)

    def datasync(self, fd: int) -> None:
        datasync(fd)

    def sync_directory(self, path: str) -> None:
        sync_directory(path)

    def truncate(self, fd: int, size: int) -> None:
        os.ftruncate(fd, size)

    def replace(self, source: str, target: str) -> None:
        os.replace(source, target)

    def unlink(self, path: str) -> None:
        os.unlink(path)

    def makedirs(self, path: str) -> None:
        os.makedirs(path, exist_ok=True)


def unlink_if_present(ops: FileOps, path: str, quiet: bool = False) -> None:
    """Delete ``path`` if it exists; other errors are raised unless ``quiet``."""
    try:
        ops.unlink(path)
    except FileNotFoundError:
        pass
    except OSError:
        if not quiet:
            raise


def replace_atomically(ops: FileOps, path: str, data: bytes, durable: bool) -> None:
    """Make ``path`` hold ``data``, all or nothing: write ``path.tmp`` (synced if ``durable``),
    then rename it over ``path``. On OSError the temporary file is removed (a full disk must not
    keep its bytes) and the error raised; ``path`` is then as it was."""
    temporary = path + ".tmp"
    try:
        fd = ops.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        try:
            ops.write_all(fd, data)
            if durable:
                ops.datasync(fd)
        finally:
            os.close(fd)
        ops.replace(temporary, path)
    except OSError:
        unlink_if_present(ops, temporary, quiet=True)
        raise


REAL = FileOps()
"""The operations as the system performs them."""
