"""Named consumer cursors (committed offsets) in one small file that survives restarts.

The file is ``b"rsnetcur"`` | version (u32, big-endian, = 1) | one frame (records.py) whose
body is the msgpack map ``{name: offset}`` (``offset_maps.py``). A commit rewrites the whole file the safe way:
write ``PATH.tmp``, fsync it, rename it over ``PATH``, fsync the directory. A crash at any
point leaves either the old file or the new one, never a mix, so a file that fails its check
was damaged after it was written (disk, hand edit). Commits can be *staged* on the store's
thread and written together on another (:meth:`CursorStore.staged`, :meth:`CursorStore.write`,
:meth:`CursorStore.written`), so that the fsyncs stay off the broker's event loop and a flood of
commits costs one write per write's duration, not one per commit. Opening such a file raises
:class:`CorruptData` rather than guessing: silently losing cursors would send consumers back
to the start, or past records they never saw. To start every cursor afresh, delete the file.

This module imports the standard library and this package only.
"""

from __future__ import annotations

import os

from . import offset_maps
from .files import REAL

MAGIC = b"rsnetcur"


class CursorStore:
    """Committed offsets by cursor name, durable on every :meth:`commit`.

    One store per file: two stores (or processes) committing to the same file would each
    overwrite the other's cursors. Not thread-safe, but for :meth:`write`.
    """

    def __init__(self, path: str, cursors: dict[str, int]) -> None:
        """Use :meth:`open`."""
        self.path = path
        self._cursors = cursors  # what the file holds
        self._staged: dict[str, int] = {}  # commits not yet written
        self.closed = False

    @classmethod
    def open(cls, path: str | os.PathLike[str]) -> CursorStore:
        """Load the cursors in ``path`` (none if it does not exist; its directory is created).

        Raises :class:`CorruptData` naming the file, the byte and the problem if the file
        is damaged; the file is left as it is.
        """
        path = os.path.abspath(os.fspath(path))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        try:
            with open(path, "rb") as file:
                data = file.read()
        except FileNotFoundError:
            cursors: dict[str, int] = {}
        else:
            cursors = offset_maps.decode(path, data, MAGIC, "cursor")
        try:
            os.unlink(path + ".tmp")  # a commit interrupted before its rename
        except FileNotFoundError:
            pass
        return cls(path, cursors)

    def get(self, name: str) -> int | None:
        """The committed offset of ``name`` (as written): the next offset its consumer should read."""
        return self._cursors.get(name)

    def all(self) -> dict[str, int]:
        """Every cursor, as written, as a new dict."""
        return dict(self._cursors)

    def names(self) -> int:
        """How many cursors there are, staged ones included."""
        return len(self._cursors.keys() | self._staged.keys())

    def commit(self, name: str, offset: int) -> None:
        """Set ``name`` to ``offset``; durable when this returns (two fsyncs and a rename)."""
        self.stage(name, offset)
        cursors = self.staged()
        if cursors is not None:
            self.write(cursors)
            self.written(cursors)

    def stage(self, name: str, offset: int) -> None:
        """Set ``name`` to ``offset`` at the next write."""
        if type(name) is not str or not name:
            raise ValueError(f"a cursor name is a non-empty str, not {name!r}")
        if type(offset) is not int or offset < 0:
            raise ValueError(f"a cursor offset is an int >= 0, not {offset!r}")
        self._staged[name] = offset

    def staged(self) -> dict[str, int] | None:
        """Every cursor with the staged commits applied, for :meth:`write`; None if that is
        what the file holds already."""
        if all(self._cursors.get(name) == offset for name, offset in self._staged.items()):
            self._staged.clear()
            return None
        return {**self._cursors, **self._staged}

    def written(self, cursors: dict[str, int]) -> None:
        """:meth:`write` of ``cursors`` (from :meth:`staged`) returned: the file holds them.
        Commits staged since stay staged."""
        self._cursors = cursors
        self._staged = {name: offset for name, offset in self._staged.items() if cursors.get(name) != offset}

    def failed(self, cursors: dict[str, int]) -> None:
        """:meth:`write` of ``cursors`` (from :meth:`staged`) failed: the commits it carried
        were refused, so they are not staged any more (a later write must not store them after
        all). Commits staged since stay staged."""
        self._staged = {name: offset for name, offset in self._staged.items() if cursors.get(name) != offset}

    def delete(self, name: str) -> bool:
        """Forget ``name``, durably; False if there was no such cursor."""
        if name not in self._cursors:
            return False
        cursors = dict(self._cursors)
        del cursors[name]
        self._staged.pop(name, None)
        self.write(cursors)
        self._cursors = cursors
        return True

    def write(self, cursors: dict[str, int]) -> None:
        """Make the file hold ``cursors``, durably; on any thread (it touches only the files).
        Raises OSError as the writes, fsyncs and rename do, and if the store was closed."""
        if self.closed:
            raise FileNotFoundError(f"{self.path}: the topic's cursors are gone (the topic was deleted)")
        offset_maps.write(REAL, self.path, MAGIC, cursors)
