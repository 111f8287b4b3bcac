"""Sources driven by trio tasks: async iterables, async generator functions, memory channels.

Where the producer task lives
-----------------------------
Each subscription runs one producer task, in the nursery given when the publisher was
created. ``subscribe`` opens the async iterator and starts the task, so a source that cannot
start (its factory raises, the nursery is closed) rejects the subscriber at once with
``on_subscribe`` then ``on_error`` (rule 1.9). The task pulls the next item from the iterator
only while there is outstanding demand, so the source never runs ahead of its subscriber
(rule 1.1), and lives in its own cancel scope: ``cancel()`` cancels that scope at once
(rules 3.5, 3.12). When the nursery's owner is cancelled the subscriber receives
:class:`ProducerCancelledError`. No task outlives its nursery, so no task is orphaned.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator, Callable
from typing import Any

import trio

from .interfaces import Publisher, Subscriber
from .rules import check_subscriber
from .subscriptions import EmittingSubscription, subscribe_failed


class ProducerCancelledError(Exception):
    """The nursery owning a producer task was cancelled before its stream terminated."""


class _ProducerSubscription(EmittingSubscription):
    __slots__ = ("_demand", "_release", "_scope")

    def __init__(self, subscriber: Subscriber[Any], release: Callable[[], None] | None = None) -> None:
        super().__init__(subscriber)
        self._release = release
        self._scope = trio.CancelScope()
        self._demand = trio.Event()

    def start(self, open_iterator: Callable[[], AsyncIterator[Any]], nursery: trio.Nursery) -> None:
        """Open the source and start the producer; call right after ``on_subscribe``."""
        if self.cancelled:
            return
        try:
            iterator = open_iterator()
            nursery.start_soon(self._produce, iterator)
        except Exception as error:
            # (RuntimeError from start_soon means the nursery is closed to new tasks)
            self._signal_error(error)

    def _emit(self) -> bool:
        # Called from request(): the producer emits on its own task; wake it.
        self._demand.set()
        return False

    def _on_cancel(self) -> None:
        self._scope.cancel()
        if self._release is not None:
            self._release()

    async def _produce(self, iterator: AsyncIterator[Any]) -> None:
        with self._scope:
            try:
                await self._pump(iterator)
            except trio.Cancelled:
                if not self._scope.cancel_called:
                    self._signal_error(ProducerCancelledError("the nursery running this producer was cancelled"))
                raise
            finally:
                aclose = getattr(iterator, "aclose", None)
                if aclose is not None:
                    await aclose()

    async def _pump(self, iterator: AsyncIterator[Any]) -> None:
        while not self.cancelled:
            while not self.requested:
                self._demand = trio.Event()
                await self._demand.wait()
                if self.cancelled:
                    return
            try:
                item = await iterator.__anext__()
            except StopAsyncIteration:
                self._signal_complete()
                return
            except Exception as error:
                if not self.cancelled:  # else it is the source noticing our cancel
                    self._signal_error(error)
                return
            if self.cancelled:
                return  # cancelled while we awaited the source: drop the item (rule 3.6)
            if item is None:
                self._signal_error(TypeError("rule 2.13: the async iterable produced None"))
                return
            # request() from inside on_next must not signal on this stack (rule 1.3):
            # mark the drain loop busy, then let it deliver any error that arrived.
            self._draining = True
            try:
                self._signal_next(item)
            finally:
                self._draining = False
            if self._bad_request is not None:
                self._drain()


class AsyncIterablePublisher(Publisher[Any]):
    """Publishes what an async iterator yields, pulling only under demand.

    ``source`` is a zero-argument callable returning an async iterable (e.g. an async
    generator function), called once per subscriber; or an async iterable whose
    ``__aiter__`` is called once per subscriber.
    """

    __slots__ = ("_nursery", "_source")

    def __init__(
        self,
        source: AsyncIterable[Any] | Callable[[], AsyncIterable[Any]],
        nursery: trio.Nursery,
    ) -> None:
        self._source = source
        self._nursery = nursery

    def subscribe(self, subscriber: Subscriber[Any]) -> None:
        check_subscriber(subscriber)
        subscription = _ProducerSubscription(subscriber)
        subscriber.on_subscribe(subscription)
        subscription.start(self._open, self._nursery)

    def _open(self) -> AsyncIterator[Any]:
        source = self._source
        iterable = source() if callable(source) else source
        return iterable.__aiter__()


def from_async_iterable(
    source: AsyncIterable[Any] | Callable[[], AsyncIterable[Any]], *, nursery: trio.Nursery
) -> Publisher[Any]:
    """A publisher over an async iterable, with its producer tasks in ``nursery``.

    Pass an async generator *function* (or any zero-argument callable) to give every
    subscriber its own iteration; an async generator *object* can serve only one.
    """
    return AsyncIterablePublisher(source, nursery)


class ChannelPublisher(Publisher[Any]):
    """Publishes what arrives on a trio memory channel; takes ownership of the channel.

    Unicast (rule 1.11 lets a publisher choose): the first subscriber receives from the
    channel and a later one is rejected with on_error. When the subscription ends, by
    cancel or termination, the channel is closed, so senders see
    ``trio.BrokenResourceError``: cancel travels back to the source.
    """

    __slots__ = ("_channel", "_nursery", "_taken")

    def __init__(self, channel: trio.MemoryReceiveChannel[Any], nursery: trio.Nursery) -> None:
        self._channel = channel
        self._nursery = nursery
        self._taken = False

    def subscribe(self, subscriber: Subscriber[Any]) -> None:
        check_subscriber(subscriber)
        if self._taken:
            subscribe_failed(subscriber, RuntimeError("rule 1.11: this channel publisher is unicast"))
            return
        self._taken = True
        channel = self._channel
        # Closing the channel when the subscription ends, even before the producer
        # started, is what makes the senders notice a cancel.
        subscription = _ProducerSubscription(subscriber, channel.close)
        subscriber.on_subscribe(subscription)
        subscription.start(channel.__aiter__, self._nursery)


def from_channel(channel: trio.MemoryReceiveChannel[Any], *, nursery: trio.Nursery) -> Publisher[Any]:
    """A unicast publisher of the items received on ``channel`` (see :class:`ChannelPublisher`)."""
    return ChannelPublisher(channel, nursery)
