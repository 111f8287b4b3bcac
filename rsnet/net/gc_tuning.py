"""CPython's cyclic garbage collector, tuned for a process whose job is serving connections.

Reference counting frees almost every object the moment it is no longer used; the cyclic
collector is there for the rest, objects in reference cycles. CPython runs it by allocation
counts: a young collection once 700 more container objects (lists, dicts, tasks, coroutines...)
were allocated than freed, a middle one every 10 young ones, and a full one, which walks every
live object, every 10 middle ones once the old generation has grown by a quarter. A server that
holds thousands of connections keeps about a hundred such objects alive for each (trio's tasks,
their coroutines and cancel scopes, the session's lists and sets), so while connections arrive
the collector walks all of them again and again, and finds nothing to free: a connection's
objects form no cycles (``tests/net/test_no_cycles.py``). Measured on the servers of issue 13's
benchmarks (``s8-live-10000``, ``s3-conns-tcp``): with 10,000 live connections the server spent
10.9 of its 19.3 CPU seconds collecting (7.4 s in all with the collector off); serving 1,000
connections x 100 items, 0.19 of 0.71 s.

:func:`tune_for_serving` changes two settings of the whole process, as long-running Python
servers commonly do:

- **It freezes what start-up made** (``gc.collect()``, then ``gc.freeze()``): the imported
  modules, the server and its configuration, some 33,000 objects for ``rsnet serve``, live as
  long as the process; no collection walks them again.
- **It raises the young generation's threshold to** :data:`YOUNG` (from 700), keeping the
  middle and old ones at CPython's 10 and 10. Collections happen 70 times less often; what
  lives a short while (a stream's batch lists, a short connection's whole state) is usually
  gone before one happens instead of being walked and promoted; and a full collection needs
  5,000,000 net allocations instead of 70,000, so growing to 10,000 connections triggers none.
  With both (and no reference cycles left by closed connections), the 10,000 connections
  cost 7.9 CPU seconds, 1.6 of them collecting, and the 1,000 connections 0.56 s (0.03 s).

What it costs: cyclic garbage waits longer. Up to about :data:`YOUNG` objects of it wait for
the next young collection, which then takes longer (10 to 50 ms on the 2-core machine of the
benchmarks, instead of about one); garbage that reached the old generation waits for the
next full collection, as it does by default. ``benchmarks/gc_churn.py`` runs ``rsnet serve``
with an application that leaves a cycle behind every item and every stream, through 200 busy
connections that end cleanly, are cancelled or reset (some 250 connections a second). With
CPython's settings the server's RSS stayed at 48 MiB and collecting took 17% of its CPU; tuned,
it took 8%, and the RSS rose from 59 to 66 MiB over 180 s, half of that in the first 20 s, while
the old generation held under 1,000 objects throughout: the garbage was collected. With the
collector off the RSS passed 600 MiB within a minute.

``rsnet serve`` and ``rsnet broker`` call it once the configuration is loaded and the server
built. A program that embeds :class:`rsnet.Server` may call it the same way, once, after its own
start-up and before serving. A program that does much besides serving had better keep
CPython's defaults. The thresholds are written for CPython 3.11-3.13's generational collector
(3.14's incremental collector reads them differently).
"""

from __future__ import annotations

import gc

YOUNG = 50_000
"""Net new container objects between young collections (CPython's default: 700)."""
MIDDLE = 10
"""Young collections per middle one (CPython's default, kept)."""
OLD = 10
"""Middle collections before a full one is considered (CPython's default, kept)."""


def tune_for_serving() -> None:
    """Freeze the objects start-up made and raise the young generation's threshold (the
    module's documentation says what this changes and why). Call it once, after start-up and
    before serving: no object alive at the call is collected afterwards, so freezing again
    later would also keep whatever cycles the connections alive then leave behind."""
    gc.collect()  # start-up's own garbage is freed, not frozen with the rest
    gc.freeze()
    gc.set_threshold(YOUNG, MIDDLE, OLD)
