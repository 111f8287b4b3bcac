"""The broker's conventions over the blocking client: for code that cannot run an event loop.

The counterpart of :mod:`rsnet.broker.client` for :mod:`rsnet.sync` (a Spark executor's worker,
a script): list topics and their offsets (``$topics``), read an exact offset range, commit a
cursor (``$commit``), publish with an idempotent producer and wait for ``$acks``.

    with rsnet.sync.connect(url) as client:
        for chunk in read_range(client, "orders", 100, 200):   # offsets 100..199, in order
            ...
        publish(client, "totals", rows, producer="job-7", first_sequence=0)

Every call into :mod:`rsnet.sync` goes through the few functions at the top of this module
(:func:`connect`, :func:`subscribe`, ``_offer`` and :func:`read_range`), so a change of the
blocking client's API is adapted here and nowhere else.

This module must never import trio or asyncio (a test checks it): it runs where no event loop can.
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Iterable, Iterator
from typing import Any, Literal

from ..errors import StreamError
from ..protocol import ErrorCode
from ..sync import BlockingClient
from ..sync import connect as _connect
from .codes import BrokerCode
from .names import MAX_MATCH_PATTERNS, MAX_MATCH_WILDCARDS, is_wildcard, topic_matches, validate_pattern

READ_WINDOW = 8192
"""Records :func:`read_range` keeps requested and not yet taken, at most (its memory bound)."""

_BEYOND_ANY_END = 2**63 - 1  # an offset no topic reaches: the broker answers with the topic's end


# -- the only calls into rsnet.sync --------------------------------------------------------------


def connect(url: str, *, token: str | None = None, timeout: float = 10.0) -> BlockingClient:
    """``rsnet.sync.connect``: raises ValueError for a bad URL, ConnectionLost if the broker
    cannot be reached or refuses (``code`` UNAUTHORIZED for a bad token)."""
    return _connect(url, token=token, timeout=timeout)


def subscribe(client: BlockingClient, name: str, params: dict[str, Any] | None, prefetch: int) -> Iterator[Any]:
    """``client.subscribe``: the publisher's params as one mapping."""
    return client.subscribe(name, params or {}, prefetch=prefetch)


def _offer(client: BlockingClient, name: str, items: Iterable[Any], params: dict[str, Any]) -> None:
    client.offer(name, items, params)


def read_range(
    client: BlockingClient,
    topic: str,
    start: int,
    end: int,
    *,
    window: int = READ_WINDOW,
    items: Literal["maps", "arrays", "stored"] = "maps",
) -> Iterator[list[Any]]:
    """The records of ``topic`` with offsets in ``[start, end)``, in order, as lists of up to
    ``window`` records (so the caller handles them in bulk), shaped as the subscription's
    ``items`` param says (protocol/BROKER.md): maps ``{"topic", "offset", "timestamp",
    "value"}``; ``"arrays"``, lists ``[offset, timestamp, value]`` (about half the decoding,
    for a reader that knows its topic); ``"stored"``, lists ``[offset, timestamp, value,
    producer, sequence]`` (the broker sends them as stored: the cheapest read from storage).

    The subscription's ``until`` is ``end``: the broker completes it there, and sends no
    record beyond. Demand is exact too: the total requested is never more than
    ``end - start``, and at most ``window`` records are requested and not yet taken (the memory
    bound). The subscription is cancelled if the caller stops early. Records the broker
    skipped (a lagging subscriber on a ``drop`` topic) shorten the range: the skip shows as a
    gap in the offsets (and, in maps, as ``"skipped"``), at the end too (the last record
    returned is then before ``end - 1``, or none is).

    Raises :class:`StreamError` as the broker sends it: ``OFFSET_TRIMMED`` (4100) if ``start``
    (or a record not yet read) was removed by retention, ``OFFSET_DAMAGED`` (4110) for a
    damaged range, ``OFFSET_OUT_OF_RANGE`` (4101) if ``start`` is beyond the topic's end,
    ``UNAUTHORIZED``, ``UNKNOWN_PUBLISHER``.
    """
    count = end - start
    if count <= 0:
        return
    params: dict[str, Any] = {"from": start, "until": end, "items": items}
    records = client.subscribe(topic, params, prefetch=min(window, count), limit=count)  # close() cancels
    try:
        while chunk := list(itertools.islice(records, window)):  # C-level iteration, no per-item step
            yield chunk
    finally:
        records.close()  # cancels the subscription if the range was not read to its end


# -- the broker's conventions --------------------------------------------------------------------


def list_topics(client: BlockingClient, match: list[str] | None = None) -> list[dict[str, Any]]:
    """``$topics``: one map per topic the client may subscribe to (``topic``, ``first_offset``,
    ``next_offset``, ...; see protocol/BROKER.md), only those matching a name or pattern of
    ``match`` if given."""
    return list(subscribe(client, "$topics", None if match is None else {"match": match}, 1024))


def resolve_topics(client: BlockingClient, names: Iterable[str]) -> dict[str, tuple[int, int]]:
    """``{topic: (first_offset, next_offset)}`` for topic names and patterns.

    A pattern (``*``, ``>``) matches the topics that exist now. A plain name missing from
    ``$topics`` is asked for directly: a topic that does not exist yet reads as empty (a
    subscription reads it from its first record once a publish creates it), unless the broker
    refuses subscriptions to missing topics (``UNKNOWN_PUBLISHER``); an unauthorized name fails
    with ``UNAUTHORIZED``. Raises :class:`StreamError` for those and ValueError for an invalid
    name.
    """
    names = list(names)
    for name in names:
        try:
            validate_pattern(name)
        except ValueError as invalid:
            raise ValueError(f"invalid topic or pattern {name!r}: {invalid}") from None
    asked = len(names) <= MAX_MATCH_PATTERNS and sum(map(is_wildcard, names)) <= MAX_MATCH_WILDCARDS
    listed = list_topics(client, names if asked else None)  # else every topic, filtered here
    known = {info["topic"]: (info["first_offset"], info["next_offset"]) for info in listed}
    found: dict[str, tuple[int, int]] = {}
    for name in names:
        if is_wildcard(name):
            found.update((topic, ends) for topic, ends in known.items() if topic_matches(name, topic))
        elif name in known:
            found[name] = known[name]
        else:
            found[name] = _probe(client, name)
    return dict(sorted(found.items()))


def _probe(client: BlockingClient, topic: str) -> tuple[int, int]:
    """Ask for an offset past any end: the broker answers OFFSET_OUT_OF_RANGE with the topic's
    next offset (0 for a topic that does not exist yet), or says why not."""
    try:
        for _ in subscribe(client, topic, {"from": _BEYOND_ANY_END}, 1):
            break
    except StreamError as error:
        if error.code == BrokerCode.OFFSET_OUT_OF_RANGE and isinstance(error.data, dict):
            end = int(error.data["next"])
            return end, end
        raise
    raise StreamError(ErrorCode.APPLICATION_ERROR, f"the broker sent a record of {topic!r} at offset 2**63-1")


def commit(client: BlockingClient, topic: str, cursor: str, offset: int) -> None:
    """``$commit``: cursor ``cursor`` of ``topic`` is at ``offset`` (the next record it wants)."""
    for _ in subscribe(client, "$commit", {"topic": topic, "cursor": cursor, "offset": offset}, 1):
        pass


def publish(
    client: BlockingClient,
    topic: str,
    values: Iterable[Any],
    *,
    producer: str | None = None,
    first_sequence: int = 0,
    wait: bool = True,
) -> int:
    """Publish ``values`` to ``topic`` as ``producer`` with sequences ``first_sequence``,
    ``first_sequence + 1``, ...; with ``wait``, return when the broker has stored every one
    (see :func:`wait_acknowledged`, which a caller publishing several times calls once, with a
    ``producer`` of its own). As the trio client's ``publish``: without ``producer``, one made
    up for this call.

    The broker stores each (producer, sequence) once, so publishing the same values with the
    same sequences again (a retried task) stores nothing twice, and neither do other values
    under a producer and sequences stored already. Returns how many values were sent. Raises
    :class:`StreamError` if the broker refuses or stops the offer,
    :class:`~rsnet.errors.ConnectionLost` if the connection ends first.
    """
    producer = producer or f"producer-{uuid.uuid4()}"
    sent = 0
    finished = False

    def counted() -> Iterator[Any]:
        nonlocal sent, finished
        for value in values:
            sent += 1
            yield value
        finished = True

    _offer(client, topic, counted(), {"producer": producer, "sequence": first_sequence})
    if not finished:  # offer returns early if the broker cancelled
        raise StreamError(ErrorCode.APPLICATION_ERROR, f"the broker stopped taking records for {topic!r} after {sent}")
    if wait and sent:
        wait_acknowledged(client, topic, producer=producer, last_sequence=first_sequence + sent - 1)
    return sent


def wait_acknowledged(client: BlockingClient, topic: str, *, producer: str, last_sequence: int) -> None:
    """Return once ``$acks`` says every record of ``producer`` on ``topic`` up to
    ``last_sequence`` is stored (under the topic's fsync policy).

    Subscribed after the offers (the blocking client opens a subscription only when it waits
    for an item): the first ack is then the last sequence stored so far, so an ack sent
    before this subscription is not missed.
    """
    for ack in subscribe(client, "$acks", {"producer": producer, "topic": topic}, 16):
        if ack["sequence"] >= last_sequence:
            return
