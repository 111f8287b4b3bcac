"""The few file-system calls durability rests on, in one place.

``datasync`` forces a file's data (and the metadata needed to read it back, such as its size)
to stable storage: ``fdatasync`` on Linux, ``F_FULLFSYNC`` on macOS (where ``fsync`` only
reaches the drive's cache). ``sync_directory`` does the same for a directory's entries, so a
file created, renamed or deleted stays that way after a power failure.

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
