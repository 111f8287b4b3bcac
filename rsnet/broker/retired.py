"""The next offsets of deleted topics, so that a topic created again under a deleted one's
name goes on from where it ended: an offset is never given to other data, a delete included.

A reader that holds a position in the deleted topic (a Spark checkpoint, an offset kept by
the application) then finds the records it had not read gone (``OFFSET_TRIMMED``, a data-loss
error), as after a purge, and is never handed new records under offsets it had already read,
as it would be if the new topic started at 0 again.

A durable broker keeps them in ``data_dir/.retired`` (not a topic name, so never a topic's
directory): a checked map ``{topic: next offset}`` (``storage/offset_maps.py``, magic
``b"rsnetret"``), replaced all at once and synced before the topic's directory goes. A file
that cannot be read stops the broker's start unless ``unclean_recovery`` (it is then moved
aside, loudly, and a topic re-created under a name it held starts at 0). An entry goes once
a topic of that name starts from it. (A file removed by hand leaves no trace to go by.)

Bound: at most :data:`MAX_RETIRED` names (the oldest deletion is forgotten first, with a
warning, at most :data:`FORGOTTEN_LINES_PER_MINUTE` such lines a minute), each at most 255
characters: the file stays under 2.7 MB. A topic deleted at offset 0 (it never held a record)
is not kept: one created again under its name starts there anyway.
"""

from __future__ import annotations

import logging
import os
import stat

from ..net.failures import RateLimitedLog
from .storage import CorruptData, offset_maps
from .storage.files import FileOps

log = logging.getLogger(__name__)

FILE_NAME = ".retired"
MAGIC = b"rsnetret"

MAX_RETIRED = 10_000
"""Deleted topics whose next offsets are kept; past it, the oldest deletion is forgotten."""

FORGOTTEN_LINES_PER_MINUTE = 10
"""Warnings that a deleted topic's next offset was forgotten, a minute (the rest are counted):
a client allowed to create and delete topics can make thousands of deletions a second
(attack round 7: 2,800 lines a second)."""


class RetiredOffsets:
    """Next offsets by deleted topic's name; durable on every change if ``directory`` is set."""

    def __init__(self, directory: str | None, limit: int = MAX_RETIRED) -> None:
        """Load ``directory/.retired`` (none if it does not exist); ``None`` keeps them in memory.
        Raises CorruptData (naming the file and the byte) for a damaged file, or one that is
        not a regular file (never waiting on a FIFO), and OSError for one that cannot be read;
        it is left as it is."""
        self._path = None if directory is None else os.path.join(directory, FILE_NAME)
        self._limit = limit
        self._offsets: dict[str, int] = {}  # oldest deletion first
        self._forgotten_log = RateLimitedLog(
            log,
            FORGOTTEN_LINES_PER_MINUTE,
            "%d more deleted topics' next offsets were forgotten in the last minute",
            logging.WARNING,
        )
        if self._path is not None:
            try:
                fd = os.open(self._path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            except FileNotFoundError:
                if os.path.islink(self._path):  # a link to nothing (an unmounted target, say)
                    raise CorruptData(self._path, 0, "a symbolic link to nothing") from None
                return
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                os.close(fd)
                raise CorruptData(self._path, 0, "not a regular file")
            with open(fd, "rb") as file:
                self._offsets = offset_maps.decode(self._path, file.read(), MAGIC, "retired offset")

    def get(self, topic: str) -> int | None:
        """The next offset of the deleted topic ``topic``; None if none is kept."""
        return self._offsets.get(topic)

    def retire(self, topic: str, next_offset: int, files: FileOps) -> None:
        """Keep ``next_offset`` for ``topic``, about to be deleted (a kept higher one stays).
        Durable when this returns; raises OSError, changing nothing, if it cannot be stored.
        ``files``: how the file is written (the broker's ``storage_files``)."""
        if next_offset == 0 and topic not in self._offsets:
            return  # nothing to keep: a topic created again starts at 0 either way
        offsets = dict(self._offsets)
        offsets[topic] = max(next_offset, offsets.pop(topic, 0))  # newest last
        while len(offsets) > self._limit:
            oldest = next(iter(offsets))
            self._forgotten_log.log(
                logging.WARNING,
                "the next offset of deleted topic %s (%d) is forgotten: %d deleted topics' are kept at most, and a "
                "topic created under its name starts at offset 0",
                oldest,
                offsets.pop(oldest),
                self._limit,
            )
        self._store(offsets, files)

    def forget(self, topic: str, files: FileOps) -> None:
        """A topic named ``topic`` starts at its kept offset now. Best effort: an entry left
        (the file could not be written) is harmless, as it only ever holds a topic back."""
        if topic not in self._offsets:
            return
        offsets = dict(self._offsets)
        del offsets[topic]
        try:
            self._store(offsets, files)
        except OSError as exc:
            log.warning("%s: the next offset kept for topic %s could not be removed: %s", self._path, topic, exc)

    def __len__(self) -> int:
        return len(self._offsets)

    def _store(self, offsets: dict[str, int], files: FileOps) -> None:
        if self._path is not None:
            offset_maps.write(files, self._path, MAGIC, offsets)
        self._offsets = offsets
