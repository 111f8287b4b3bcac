"""Producers a failure refused, held to resume where their stored records end.

When a topic refuses its producers (its disk is full or failing, or it stopped on an
unexpected error), nothing after each producer's last stored sequence was stored
(protocol/BROKER.md, "Publishing"), and the producer is to offer those records again. But an
offer it sent before it heard of the failure (a pipelined one, the next records' sequences)
may reach the topic once the disk takes writes again. Stored, it would put the producer's
highest sequence past the records that were refused, and their resend would then be dropped
as duplicates and acknowledged: acknowledged, never stored.

So a refused producer is *fenced* on its topic: until it offers again from at most the
sequence after its last stored one, its records after such a gap are refused (REJECTED),
and its first offer that does not leave one lifts the fence. A fence is the broker's, not
one topic object's: it outlasts a topic reopened after a failure. At most ``MAX_FENCES`` are
kept; past that the oldest is forgotten (that producer is then treated as any other).
"""

from __future__ import annotations

MAX_FENCES = 10_000
"""Fenced (topic, producer) pairs the broker keeps at most (each a producer id of at most
255 characters and a topic name): a bound on what failing offers can make it hold."""


class Fences:
    """The fenced (topic, producer) pairs, oldest first."""

    def __init__(self, limit: int = MAX_FENCES) -> None:
        self._limit = limit
        self._fenced: dict[tuple[str, str], None] = {}

    def fence(self, topic: str, producers: list[str]) -> None:
        """``producers`` were refused by a failure of ``topic``."""
        for producer in producers:
            self._fenced.pop((topic, producer), None)  # (newest last)
            self._fenced[(topic, producer)] = None
        while len(self._fenced) > self._limit:
            del self._fenced[next(iter(self._fenced))]

    def holds(self, topic: str, producer: str) -> bool:
        return (topic, producer) in self._fenced

    def lift(self, topic: str, producer: str) -> None:
        self._fenced.pop((topic, producer), None)

    def forget_topic(self, topic: str) -> None:
        """The topic was deleted: a topic created under its name starts without fences."""
        for key in [key for key in self._fenced if key[0] == topic]:
            del self._fenced[key]

    def __len__(self) -> int:
        return len(self._fenced)
