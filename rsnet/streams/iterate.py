"""Consume a Publisher with ``async for``: the bridge from Reactive Streams to trio code.

Demand policy (limit-rate replenishment): the iterator requests ``prefetch`` items up front,
and each time the consumer has taken ``limit = prefetch - prefetch // 4`` of them it requests
``limit`` more, in one call. So a request costs one call per ``limit`` items rather than per
item, and the publisher never has more than ``prefetch`` items buffered here (rule 1.1: an
item beyond that is a :class:`MissingBackpressureError`).

Items already buffered are handed out without yielding to the scheduler. The iterator checks
for cancellation whenever it has to wait for items and at least every
``CANCEL_CHECK_INTERVAL`` items taken from its buffer (a trio cancellation check costs more
than handing out an item, so it is not done per item), and it yields to other tasks once per
replenishment, so a fast synchronous publisher cannot starve the rest of the program.

The buffering subscriber also has ``on_next_many(items)``, the same as ``on_next`` for each
item in order: the network session uses it to hand over a received batch in one call.
"""

from __future__ import annotations

from collections import deque
from itertools import repeat
from operator import is_
from typing import Any

import trio

from .interfaces import Publisher, Subscriber, Subscription
from .rules import MAX_DEMAND, MissingBackpressureError, check_signal_argument, validate_subscription

DEFAULT_PREFETCH = 256

CANCEL_CHECK_INTERVAL = 64
"""Buffered items handed out between two cancellation checks (at most)."""


class _BufferingSubscriber(Subscriber[Any]):
    """Buffers up to ``prefetch`` items for the iterator and wakes it."""

    __slots__ = ("error", "prefetch", "queue", "subscription", "terminal", "wakeup")

    def __init__(self, prefetch: int) -> None:
        self.prefetch = prefetch
        self.queue: deque[Any] = deque()
        self.subscription: Subscription | None = None
        self.terminal = False
        self.error: BaseException | None = None
        self.wakeup: trio.Event | None = None

    def on_subscribe(self, subscription: Subscription) -> None:
        if not validate_subscription(self.subscription, subscription):
            return
        self.subscription = subscription
        subscription.request(self.prefetch)

    def on_next(self, item: Any) -> None:
        check_signal_argument(item, "on_next")
        if self.terminal:
            return  # rule 2.8: late items after we cancelled
        if len(self.queue) >= self.prefetch:
            self.subscription.cancel()  # type: ignore[union-attr]  # set by on_subscribe first
            self._terminate(
                MissingBackpressureError(f"rule 1.1: publisher sent more than the {self.prefetch} items requested")
            )
            return
        self.queue.append(item)
        self._wake()

    def on_next_many(self, items: list[Any]) -> None:
        """``on_next`` for each of ``items``, in order, in one call."""
        if any(map(is_, items, repeat(None))):
            raise TypeError("rule 2.13: on_next(None) is not allowed")
        if self.terminal:
            return  # rule 2.8
        queue = self.queue
        room = self.prefetch - len(queue)
        if len(items) <= room:
            queue.extend(items)
            self._wake()
            return
        queue.extend(items[:room])  # what was requested; the next one breaks rule 1.1
        self.subscription.cancel()  # type: ignore[union-attr]  # set by on_subscribe first
        self._terminate(
            MissingBackpressureError(f"rule 1.1: publisher sent more than the {self.prefetch} items requested")
        )

    def on_error(self, error: BaseException) -> None:
        check_signal_argument(error, "on_error")
        self._terminate(error)

    def on_complete(self) -> None:
        self._terminate(None)

    def _terminate(self, error: BaseException | None) -> None:
        if self.terminal:
            return
        self.terminal = True
        self.error = error
        self._wake()

    def _wake(self) -> None:
        if self.wakeup is not None:
            self.wakeup.set()
            self.wakeup = None


class PublisherIterator:
    """An async iterator over a publisher's items; an ``on_error`` is raised from ``__anext__``.

    Subscribes on first use. Leaving early cancels the subscription: use
    ``async with iterate(p) as items:`` for a deterministic cancel; a plain ``async for``
    cancels when the iterator is garbage-collected.
    """

    def __init__(self, publisher: Publisher[Any], prefetch: int) -> None:
        self._publisher: Publisher[Any] | None = publisher
        self._subscriber = _BufferingSubscriber(min(prefetch, MAX_DEMAND))
        self._limit = prefetch if prefetch == MAX_DEMAND else prefetch - (prefetch >> 2)
        self._consumed = 0  # items taken since the last replenishment, up to the last tick
        # Items that may be handed out before the next tick (a cancellation check, and the
        # replenishment when it is due); ``_run`` is what the countdown started from.
        self._run = self._countdown = 1

    def __aiter__(self) -> PublisherIterator:
        return self

    async def __anext__(self) -> Any:
        queue = self._subscriber.queue
        if queue:
            countdown = self._countdown - 1
            if countdown:
                # The fast path: a buffered item, no tick due.
                self._countdown = countdown
                return queue.popleft()
        return await self._next_slow()

    async def _next_slow(self) -> Any:
        subscriber = self._subscriber
        if self._publisher is not None:
            publisher, self._publisher = self._publisher, None
            publisher.subscribe(subscriber)
        queue = subscriber.queue
        waited = False
        while not queue:
            if subscriber.terminal:
                if subscriber.error is not None:
                    raise subscriber.error
                raise StopAsyncIteration
            subscriber.wakeup = wakeup = trio.Event()
            await wakeup.wait()
            waited = True
        if not waited:
            await trio.lowlevel.checkpoint_if_cancelled()
        item = queue.popleft()
        # The tick: account for the items the fast path handed out since the last one.
        self._consumed += self._run - self._countdown + 1
        limit = self._limit
        if self._consumed >= limit and not subscriber.terminal:
            self._consumed = 0
            subscriber.subscription.request(limit)  # type: ignore[union-attr]  # set by on_subscribe first
            await trio.lowlevel.cancel_shielded_checkpoint()
        self._run = self._countdown = max(1, min(CANCEL_CHECK_INTERVAL, limit - self._consumed))
        return item

    async def aclose(self) -> None:
        """Cancel the subscription unless it already terminated. Idempotent."""
        self._cancel()
        await trio.lowlevel.checkpoint()

    def _cancel(self) -> None:
        self._publisher = None
        subscriber = self._subscriber
        if not subscriber.terminal:
            subscriber.terminal = True
            subscriber.queue.clear()
            if subscriber.subscription is not None:
                subscriber.subscription.cancel()

    async def __aenter__(self) -> PublisherIterator:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def __del__(self) -> None:
        # Abandoned mid-stream by a plain ``async for ... break``: cancel so a producer
        # waiting for demand does not keep its nursery open forever.
        self._cancel()


def iterate(publisher: Publisher[Any], *, prefetch: int = DEFAULT_PREFETCH) -> PublisherIterator:
    """Iterate a publisher's items with ``async for``, requesting ``prefetch`` at a time.

    ``prefetch`` bounds the items buffered between publisher and consumer; demand is
    replenished in batches of ``prefetch - prefetch // 4`` (see the module docstring).
    """
    if prefetch < 1:
        raise ValueError(f"prefetch must be >= 1, got {prefetch}")
    return PublisherIterator(publisher, prefetch)
