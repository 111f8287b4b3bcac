"""Producers a failure refused, held to resume where their stored records end.

When a topic refuses its producers (its disk is full or failing, or it stopped on an
unexpected error) or one producer (a record it cannot store), nothing after each producer's last stored sequence was stored
(protocol/BROKER.md, "Publishing"), and the producer is to offer those records again. But an
offer it sent before it heard of the failure (a pipelined one, the next records' sequences)
may reach the topic once the disk takes writes again. Stored, it would put the producer's
highest sequence past the records that were refused, and their resend would then be dropped
as duplicates and acknowledged: acknowledged, never stored.

So a refused producer is *fenced* on its topic: until it offers again from at most the first
sequence its refused offers had not had acknowledged (or, if records after that were kept,
the one after its highest stored sequence), its records after such a gap are refused
(REJECTED), and its first offer that does not leave one lifts the fence. (Not the highest
stored sequence alone: a producer that never stored a record has none, and one that skipped
sequences on purpose may resume past it.) A fence is the broker's, not
one topic object's: it outlasts a topic reopened after a failure. At most ``MAX_FENCES`` are
kept; past that the oldest is forgotten (that producer is then treated as any other).
"""

from __future__ import annotations

MAX_FENCES = 10_000
"""Fenced (topic, producer) pairs the broker keeps at most (each a producer id of at most
255 characters and a topic name): a bound on what failing offers can make it hold."""


class Fences:
    """The fenced (topic, producer) pairs, oldest first, each with the sequence its producer
    resumes from: the first its refused offers had not had acknowledged."""

    def __init__(self, limit: int = MAX_FENCES) -> None:
        self._limit = limit
        self._fenced: dict[tuple[str, str], int] = {}

    def fence(self, topic: str, resume: dict[str, int]) -> None:
        """The producers in ``resume`` were refused by a failure of ``topic``; each is to offer
        again from its sequence there."""
        for producer, sequence in resume.items():
            key = (topic, producer)
            earlier = self._fenced.pop(key, None)  # (newest last)
            self._fenced[key] = sequence if earlier is None else min(earlier, sequence)
        while len(self._fenced) > self._limit:
            del self._fenced[next(iter(self._fenced))]

    def resume(self, topic: str, producer: str) -> int | None:
        """Where a fenced producer is to offer again from; None if it is not fenced."""
        return self._fenced.get((topic, producer))

    def lift(self, topic: str, producer: str) -> None:
        self._fenced.pop((topic, producer), None)

    def forget_topic(self, topic: str) -> None:
        """The topic was deleted: a topic created under its name starts without fences."""
        for key in [key for key in self._fenced if key[0] == topic]:
            del self._fenced[key]

    def __len__(self) -> int:
        return len(self._fenced)
