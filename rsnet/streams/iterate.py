"""Consume a Publisher with ``async for``: the bridge from Reactive Streams to trio code.

Demand policy (limit-rate replenishment): the iterator requests ``prefetch`` items up front,
and each time the consumer has taken ``limit = prefetch - prefetch // 4`` of them it requests
``limit`` more, in one call. So a request costs one call per ``limit`` items rather than per
item, and the publisher never has more than ``prefetch`` items buffered here (rule 1.1: an
item beyond that is a :class:`MissingBackpressureError`).

Items already buffered are handed out without yielding to the scheduler; the iterator checks
for cancellation on every item and yields to other tasks once per replenishment, so a fast
synchronous publisher cannot starve the rest of the program.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import trio

from .interfaces import Publisher, Subscriber, Subscription
from .rules import MAX_DEMAND, MissingBackpressureError, check_signal_argument

DEFAULT_PREFETCH = 256


class _BufferingSubscriber(Subscriber[Any]):
    """Buffers up to ``prefetch`` items for the iterator and wakes it."""

    __slots__ = ("prefetch", "queue", "subscription", "terminal", "error", "wakeup")

    def __init__(self, prefetch: int) -> None:
        self.prefetch = prefetch
        self.queue: deque[Any] = deque()
        self.subscription: Subscription | None = None
        self.terminal = False
        self.error: BaseException | None = None
        self.wakeup: trio.Event | None = None

    def on_subscribe(self, subscription: Subscription) -> None:
        check_signal_argument(subscription, "on_subscribe")
        if self.subscription is not None:
            subscription.cancel()  # rule 2.5
            return
        self.subscription = subscription
        subscription.request(self.prefetch)

    def on_next(self, item: Any) -> None:
        check_signal_argument(item, "on_next")
        if self.terminal:
            return  # rule 2.8: late items after we cancelled
        if len(self.queue) >= self.prefetch:
            self.subscription.cancel()  # type: ignore[union-attr]
            self._terminate(
                MissingBackpressureError(
                    f"rule 1.1: publisher sent more than the {self.prefetch} items requested"
                )
            )
            return
        self.queue.append(item)
        self._wake()

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
        self._consumed = 0

    def __aiter__(self) -> PublisherIterator:
        return self

    async def __anext__(self) -> Any:
        subscriber = self._subscriber
        if self._publisher is not None:
            publisher, self._publisher = self._publisher, None
            publisher.subscribe(subscriber)
        queue = subscriber.queue
        while not queue:
            if subscriber.terminal:
                if subscriber.error is not None:
                    raise subscriber.error
                raise StopAsyncIteration
            subscriber.wakeup = wakeup = trio.Event()
            await wakeup.wait()
        await trio.lowlevel.checkpoint_if_cancelled()
        item = queue.popleft()
        self._consumed += 1
        if self._consumed == self._limit and not subscriber.terminal:
            self._consumed = 0
            subscriber.subscription.request(self._limit)  # type: ignore[union-attr]
            await trio.lowlevel.cancel_shielded_checkpoint()
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
