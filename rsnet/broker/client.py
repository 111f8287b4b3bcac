"""Client helpers for the broker: publish with acknowledgements, follow a topic across reconnects.

    async with rsnet.connect(url) as conn:
        await publish(conn, "sensors.kitchen", readings, producer="kitchen-1")

    async with follow(url, "sensors.kitchen", start="earliest") as records:
        async for record in records:
            ...   # {"topic", "offset", "timestamp", "value"}; reconnects and resumes by itself

``follow`` is a context manager around a channel, not a bare async iterator: its connection
lives in a task of its own for as long as the ``async with`` block, so leaving the loop
early (``break``, an exception) closes it there and then, in the right task.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncGenerator, AsyncIterable, AsyncIterator, Iterable
from contextlib import asynccontextmanager
from typing import Any

import trio

from ..errors import ConnectionLost, HandshakeError, StreamError, single_errors
from ..net.client import Client, connect
from ..net.iterator import CANCEL_CHECK_INTERVAL
from ..protocol import ErrorCode
from ..streams import Publisher, from_async_iterable, from_iterable, ops


async def publish(
    conn: Client,
    topic: str,
    records: Iterable[Any] | AsyncIterable[Any],
    *,
    producer: str | None = None,
    first_sequence: int = 0,
) -> int:
    """Publish ``records`` to ``topic`` and wait until the broker has stored every one.

    The broker pulls the records with its own demand (backpressure); acknowledgements arrive
    on the ``$acks`` stream. Returns how many records were published. Raises
    :class:`StreamError` if the broker refuses, :class:`ConnectionLost` if the connection
    ends first: records not acknowledged then may or may not be stored, and publishing them
    again with the same ``producer`` and sequences is safe (the broker drops duplicates).
    """
    producer = producer or f"producer-{uuid.uuid4()}"
    last_acked = trio.Event()
    acked = first_sequence - 1  # the highest sequence acknowledged so far
    wanted: int | None = None  # the last sequence offered, once the offer has completed
    sent = 0

    def count(record: Any) -> Any:
        nonlocal sent
        sent += 1
        return record

    refused: list[StreamError] = []

    async def watch_acks(task_status: trio.TaskStatus[None]) -> None:
        acks = conn.subscribe("$acks", {"producer": producer, "topic": topic}, prefetch=16)
        async with acks:
            task_status.started()
            nonlocal acked
            try:
                async for ack in acks:
                    acked = max(acked, ack["sequence"])
                    if wanted is not None and acked >= wanted:
                        last_acked.set()
                        return
            except StreamError as error:  # refused (e.g. UNAUTHORIZED): publishing cannot succeed
                refused.append(error)
                nursery.cancel_scope.cancel()

    with single_errors():
        async with trio.open_nursery() as nursery:
            await nursery.start(watch_acks)
            source: Publisher[Any]
            if isinstance(records, AsyncIterable):
                source = from_async_iterable(records, nursery=nursery)
            else:
                source = from_iterable(records)
            await conn.offer(topic, source.pipe(ops.map(count)), {"producer": producer, "sequence": first_sequence})
            wanted = first_sequence + sent - 1
            if sent == 0 or acked >= wanted:
                last_acked.set()
            await last_acked.wait()
            nursery.cancel_scope.cancel()
    if refused:
        raise refused[0]
    return sent


async def commit(conn: Client, topic: str, cursor: str, offset: int) -> None:
    """Commit ``cursor`` on ``topic`` at ``offset``: the next record the group wants."""
    async for _ in conn.subscribe("$commit", {"topic": topic, "cursor": cursor, "offset": offset}):
        pass


_log = logging.getLogger(__name__)


@asynccontextmanager
async def follow(
    url: str,
    topic: str,
    *,
    start: Any = "latest",
    cursor: str | None = None,
    prefetch: int | None = None,
    budget: int | None = None,
    token: str | None = None,
    retry_delay: float = 0.5,
    max_retry_delay: float = 5.0,
) -> AsyncIterator[AsyncIterator[dict[str, Any]]]:
    """A topic's records, reconnecting after connection failures: ``async with follow(url,
    topic) as records: async for record in records: ...``.

    ``start`` is the subscription's ``from`` (BROKER.md: ``"earliest"``, ``"latest"``, an offset,
    ``{"timestamp": ms}``); with ``cursor``, the first subscription starts at that named cursor's
    committed offset if it has one. After a reconnect it subscribes from the offset after the
    last record it received, so the records continue with no gap and no duplicate. A broker
    going away (GOING_AWAY: a restart) is waited for like a lost connection; other stream
    errors (e.g. the offset was trimmed by retention) and refused credentials are raised, not
    retried. Each retry is logged (a warning on the ``rsnet.broker.client`` logger: a wrong
    address looks like a quiet topic otherwise). ``prefetch`` and ``budget`` as for
    ``subscribe`` (neither: adaptive demand within a byte budget).

    The connection lives in a task of the ``async with`` block (``trio.as_safe_channel``) and
    ends with it: an async generator that yielded from inside its connection crashed the
    program when its loop was left without ``aclosing``. That task hands the records over a
    batch at a time, up to 64 of those the subscription holds (one hand-over per record cost
    seven times the rate: 70,000 records a second against 510,000).
    """
    async with _batches(url, topic, start, cursor, prefetch, budget, token, retry_delay, max_retry_delay) as batches:
        yield _Flattened(batches)


class _Flattened:
    """The records of a channel of record lists, one at a time."""

    def __init__(self, batches: trio.abc.ReceiveChannel[list[dict[str, Any]]]) -> None:
        self._batches = batches
        self._batch: list[dict[str, Any]] = []
        self._next = 0

    def __aiter__(self) -> _Flattened:
        return self

    async def __anext__(self) -> dict[str, Any]:
        if self._next == len(self._batch):
            try:
                self._batch = await self._batches.receive()
            except trio.EndOfChannel:
                raise StopAsyncIteration from None
            self._next = 0
        record = self._batch[self._next]
        self._next += 1
        return record


@trio.as_safe_channel
async def _batches(
    url: str,
    topic: str,
    start: Any,
    cursor: str | None,
    prefetch: int | None,
    budget: int | None,
    token: str | None,
    retry_delay: float,
    max_retry_delay: float,
) -> AsyncGenerator[list[dict[str, Any]]]:
    """``follow``'s connections, one after another: each record it receives, with the ones
    already buffered behind it."""
    position: Any = start
    delay = retry_delay
    while True:
        params: dict[str, Any] = {"from": position}
        if cursor is not None:
            params["cursor"] = cursor
        try:
            async with connect(url, token=token) as conn:
                async with conn.subscribe(topic, params, prefetch=prefetch, budget=budget) as records:
                    delay = retry_delay
                    async for record in records:
                        batch = [record]
                        # Each without a wait; at most as many as the iterator hands out
                        # between two cancellation checks, since the loop taking them runs
                        # through a batch without one.
                        for _ in range(min(records.buffered, CANCEL_CHECK_INTERVAL - 1)):
                            batch.append(await records.__anext__())
                        position = batch[-1]["offset"] + 1
                        cursor = None  # resume from our own position, not the cursor's
                        yield batch
            return
        except HandshakeError as refused:
            if refused.code in (ErrorCode.UNAUTHORIZED, ErrorCode.UNSUPPORTED_VERSION):
                raise  # retrying cannot help
            why: Exception = refused
        except StreamError as error:
            if error.code != ErrorCode.GOING_AWAY:
                raise
            why = error
        except ConnectionLost as lost:
            why = lost
        _log.warning("follow %s at %s: %s; retrying in %g s", topic, url, why, delay)
        await trio.sleep(delay)
        delay = min(delay * 2, max_retry_delay)
