"""Scenario 5, broker fan-out: reported "not available" until there is a broker to measure.

What it will measure (issue 6, broker: issue 5): one producer publishing into a topic with
``conn.offer`` and 1, 10 and 100 subscribers on it, deliveries/s; then a durable topic under
each fsync policy (every record, interval, never). No number is ever made up here: until
``rsnet.broker`` exists *and* this module has a client written against its API,
:func:`unavailable` returns the reason and the suite prints it instead of a table.

To enable it: implement ``serve(transport, ready, storage, fsync)`` (a ``Broker`` behind
``rsnet.Server(host=broker)``; a durable one in ``$RSNET_BENCH_SCRATCH``, which the runner
creates and removes) and ``run_client`` for a ``fanout`` kind (``subscribers`` connections
subscribing ``from="earliest"``, one producer ``publish``-ing ``count`` records of ``size``
bytes; deliveries/s = count x subscribers / time until the last subscriber has them all),
register the module in :data:`benchmarks.systems.MODULES` as ``"rsnet-broker"``, add the
rows (``Row(systems=("rsnet-broker",), server_params={"storage": ..., "fsync": ...})``)
and set :data:`READY` to True.
"""

from __future__ import annotations

import importlib.util

READY = False
"""True once this module measures the broker (see the module docstring)."""

SUBSCRIBERS = (1, 10, 100)
STORAGE = (("memory", None), ("durable", "every record"), ("durable", "interval"), ("durable", "never"))


def planned_rows() -> list[str]:
    """The titles of the rows scenario 5 will have."""
    rows = []
    for _storage, fsync in STORAGE:
        where = "in-memory topic" if fsync is None else f"durable topic, fsync {fsync}"
        rows.append(f"1 producer to {'/'.join(map(str, SUBSCRIBERS))} subscribers, {where}")
    return rows


def unavailable() -> str | None:
    """Why scenario 5 cannot run now, or None when it can."""
    try:
        found = importlib.util.find_spec("rsnet.broker") is not None
    except ImportError:
        found = False
    if not found:
        return "rsnet.broker does not exist yet (issue 5)"
    if not READY:
        return "rsnet.broker exists, but benchmarks/systems/broker.py has no fan-out client for it yet"
    return None
