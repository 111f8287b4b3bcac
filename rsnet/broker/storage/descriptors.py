"""A bound on the logs that hold file descriptors at once, whatever the number of logs open.

An open :class:`~.segments.SegmentLog` holds up to three descriptors: its directory's lock,
its active segment, and the sealed segment last read (``OPEN_SEALED_SEGMENTS``). A broker may keep
thousands of topics open for their subscribers (a pattern subscription follows every topic it
matches, a subscriber with no demand waits on its topic for ever), so the descriptors cannot
be tied to the log being open: the process's limit (1,024 by default) would be a limit on
topics in use, and one client holding them all would keep every other client from opening
one. Instead the logs share a :class:`DescriptorBudget`: a log that is about to use its
descriptors tells it (:meth:`DescriptorBudget.used`), and when more logs than the budget allows
hold descriptors, the least recently used one gives all of its up (``SegmentLog.suspend``).
A suspended log keeps everything else (its segments' indexes, producers, offsets), and takes
its descriptors again, under its lock, the next time it reads, appends or syncs.

What it costs: a log used again after it was suspended opens two files (its lock and its
active segment) and a sealed segment it reads; a workload that cycles through more topics
than the budget pays that per topic it comes back to. A sync running in a worker thread has
descriptors of its own (``begin_sync``), so suspending a log never closes one under it.

This module imports the standard library only.
"""

from __future__ import annotations

import collections
from typing import Protocol


class Suspendable(Protocol):
    def suspend(self) -> None:
        """Close every file descriptor held, to take them again when next used."""


class DescriptorBudget:
    """At most ``max_logs`` logs hold file descriptors at once; see the module docstring."""

    __slots__ = ("_holding", "max_logs", "suspensions")

    def __init__(self, max_logs: int) -> None:
        if max_logs < 1:
            raise ValueError(f"max_logs must be at least 1, got {max_logs!r}")
        self.max_logs = max_logs
        self._holding: collections.OrderedDict[Suspendable, None] = collections.OrderedDict()  # oldest use first
        self.suspensions = 0
        """Logs made to give their descriptors up, since the start."""

    def __len__(self) -> int:
        """Logs holding descriptors now."""
        return len(self._holding)

    def used(self, log: Suspendable) -> None:
        """``log`` holds its descriptors and uses them now: the least recently used others give
        theirs up, if more than ``max_logs`` would hold some."""
        holding = self._holding
        if log in holding:
            holding.move_to_end(log)
            return
        holding[log] = None
        while len(holding) > self.max_logs:
            oldest, _ = holding.popitem(last=False)
            self.suspensions += 1
            oldest.suspend()

    def released(self, log: Suspendable) -> None:
        """``log`` holds no descriptor any more (suspended or closed)."""
        self._holding.pop(log, None)
