"""A topic's newest records, encoded once as the wire items its subscribers receive.

A record that reaches a topic with live subscribers is usually read by all of them within
moments. Without this, every subscriber would read it back from storage, decode it, build its
item map and pack that again: the same bytes made once per subscriber. Here the topic's writer
encodes each appended record once, as the map ``{"topic", "offset", "timestamp", "value"}``
a subscriber receives, and every subscriber at the head takes those bytes as they are
(:class:`~rsnet.protocol.Encoded`); the network session writes them into its BATCH frames
without packing anything.

Subscribers that asked for ``items: "arrays"`` share the same way: while a topic has such a
subscriber, its writer also encodes each record as ``[offset, timestamp, value]``, held for
the newest records beside the maps (``arrays``); a topic without one pays nothing for them.

The encoded items are a cache, never the truth: they cover a contiguous run of offsets just
appended, the topic drops them the moment storage fails (offsets not yet acknowledged may
then be given to other records), and a subscriber reading anything else reads storage.

Memory is bounded twice: at most ``RECENT_TOPIC_BYTES`` per topic and a budget shared by the
whole broker (:class:`RecentBudget`); the oldest items make room first, and items every live
subscriber has read are let go at the topic's next append.
"""

from __future__ import annotations

from typing import Any

from ..protocol import Encoded
from ..protocol.codec import new_packer

RECENT_TOPIC_BYTES = 4 << 20
"""Most bytes of encoded recent items one topic keeps."""

RECENT_BROKER_BYTES = 64 << 20
"""Default for the bytes of encoded recent items all of a broker's topics keep together."""


class RecentBudget:
    """Bytes the topics of one broker may hold as encoded recent items, together."""

    __slots__ = ("available", "limit")

    def __init__(self, limit: int = RECENT_BROKER_BYTES) -> None:
        self.limit = limit
        self.available = limit


class RecentItems:
    """The encoded items of one topic's offsets ``first`` up to ``end`` (exclusive)."""

    __slots__ = ("_budget", "_key_prefix", "_pack", "arrays", "first", "items", "size")

    def __init__(self, topic: str, budget: RecentBudget) -> None:
        self._budget = budget
        self._pack = new_packer().pack
        self.first = 0
        self.items: list[Encoded] = []
        # The newest len(arrays) of the same records as [offset, timestamp, value] (the
        # "arrays" shape), encoded only while someone reads that shape: a suffix of ``items``.
        self.arrays: list[Encoded] = []
        self.size = 0  # bytes held, all of them counted against the budget
        self._key_prefix = {"topic": topic}

    @property
    def end(self) -> int:
        return self.first + len(self.items)

    def get(self, offset: int, count: int) -> list[Encoded]:
        """Up to ``count`` items from ``offset`` on; [] if ``offset`` is not held."""
        start = offset - self.first
        if start < 0 or start >= len(self.items):
            return []
        return self.items[start : start + count]

    def get_arrays(self, offset: int, count: int) -> list[Encoded]:
        """As :meth:`get`, in the arrays shape; [] if ``offset`` is not held in it."""
        start = offset - (self.end - len(self.arrays))
        if start < 0 or start >= len(self.arrays):
            return []
        return self.arrays[start : start + count]

    def add(self, timestamp_ms: int, appended: list[tuple[int, Any]], arrays: bool = False) -> None:
        """Encode records just appended, as ``(offset, value)`` pairs in offset order; in the
        arrays shape too if ``arrays`` (else none is held in it any more).

        Records that do not follow on from those held replace them (the held run must stay
        contiguous). If the budget cannot hold them, the oldest held items go first; if even
        that is not enough, nothing is held.
        """
        if not appended:
            return
        if appended[0][0] != self.end:
            self.clear()
            self.first = appended[0][0]
        pack = self._pack
        item: dict[str, Any] = dict(self._key_prefix)
        encoded = []
        for offset, value in appended:
            item["offset"] = offset
            item["timestamp"] = timestamp_ms
            item["value"] = value
            encoded.append(Encoded(pack(item)))
        shaped = [Encoded(pack([offset, timestamp_ms, value])) for offset, value in appended] if arrays else []
        if not arrays and self.arrays:
            self._free(sum(map(len, self.arrays)))
            self.arrays = []
        size = sum(map(len, encoded)) + sum(map(len, shaped))
        if not self._reserve(size):
            self.clear()
            self.first = appended[-1][0] + 1
            return
        self.items += encoded
        self.arrays += shaped  # still a suffix: the held arrays end where the new ones start
        self.size += size

    def trim(self, offset: int) -> None:
        """Let go of every item below ``offset`` (all live subscribers have read them)."""
        self._drop(min(offset, self.end) - self.first)

    def clear(self) -> None:
        """Hold nothing (storage failed, or nobody is reading)."""
        self._drop(len(self.items))

    def _reserve(self, size: int) -> bool:
        budget = self._budget
        if size > RECENT_TOPIC_BYTES or size > budget.limit:
            return False
        # Make room from this topic's own oldest items: one topic never takes another's.
        excess = max(self.size + size - RECENT_TOPIC_BYTES, size - budget.available)
        if excess > 0:
            dropped = 0
            count = 0
            plain = len(self.items) - len(self.arrays)  # the oldest items, held only as maps
            for item in self.items:
                if dropped >= excess:
                    break
                dropped += len(item) + (len(self.arrays[count - plain]) if count >= plain else 0)
                count += 1
            self._drop(count)
            if size > budget.available:
                return False
        budget.available -= size
        return True

    def _drop(self, count: int) -> None:
        """Let go of the oldest ``count`` records, in both shapes."""
        if count <= 0:
            return
        shaped = count - (len(self.items) - len(self.arrays))  # of them held as arrays too
        freed = sum(map(len, self.items[:count]))
        if shaped > 0:
            freed += sum(map(len, self.arrays[:shaped]))
            del self.arrays[:shaped]
        del self.items[:count]
        self.first += count
        self._free(freed)

    def _free(self, size: int) -> None:
        self.size -= size
        self._budget.available += size
