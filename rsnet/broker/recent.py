"""A topic's newest records, encoded once as the wire items its subscribers receive.

A record that reaches a topic with live subscribers is usually read by all of them within
moments. Without this, every subscriber would read it back from storage, decode it, build its
item map and pack that again: the same bytes made once per subscriber. Here the topic's writer
encodes each appended record once, as the map ``{"topic", "offset", "timestamp", "value"}``
a subscriber receives, and every subscriber at the head takes those bytes as they are
(:class:`~rsnet.protocol.Encoded`); the network session writes them into its BATCH frames
without packing anything.

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

    __slots__ = ("_budget", "_key_prefix", "_pack", "first", "items", "size")

    def __init__(self, topic: str, budget: RecentBudget) -> None:
        self._budget = budget
        self._pack = new_packer().pack
        self.first = 0
        self.items: list[Encoded] = []
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

    def add(self, timestamp_ms: int, appended: list[tuple[int, Any]]) -> None:
        """Encode records just appended, as ``(offset, value)`` pairs in offset order.

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
        size = sum(map(len, encoded))
        if not self._reserve(size):
            self.clear()
            self.first = appended[-1][0] + 1
            return
        self.items += encoded
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
            for item in self.items:
                if dropped >= excess:
                    break
                dropped += len(item)
                count += 1
            self._drop(count)
            if size > budget.available:
                return False
        budget.available -= size
        return True

    def _drop(self, count: int) -> None:
        if count <= 0:
            return
        freed = sum(map(len, self.items[:count]))
        del self.items[:count]
        self.first += count
        self.size -= freed
        self._budget.available += freed
