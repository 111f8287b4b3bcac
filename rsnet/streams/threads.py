"""The safe path for threads other than the trio thread that owns a stream.

rsnet's publishers, subscribers and subscriptions are single-threaded: they must be called
on the trio thread running the stream. From any other thread:

- wrap a subscription in :class:`ThreadSafeSubscription` to call ``request``/``cancel``;
- use :func:`subscribe_from_thread` to subscribe (the subscriber receives its signals on
  the trio thread, and a :class:`ThreadSafeSubscription` it may call from anywhere);
- or consume with :func:`blocking_iterate`, an ordinary iterator for worker threads.

All of them hand the call to the trio thread with ``TrioToken.run_sync_soon``, which runs
callbacks in the order they were submitted, so signals keep their order (rule 1.3).
"""

from __future__ import annotations

import queue
from collections.abc import Generator
from typing import Any

import trio

from .interfaces import Publisher, Subscriber, Subscription
from .rules import MissingBackpressureError, check_signal_argument, check_subscriber, validate_subscription


class ThreadSafeSubscription(Subscription):
    """A subscription whose ``request`` and ``cancel`` may be called from any thread.

    Calls made after the trio run finished are no-ops: the stream is gone with it.
    """

    __slots__ = ("_subscription", "_token")

    def __init__(self, subscription: Subscription, trio_token: trio.lowlevel.TrioToken) -> None:
        self._subscription = subscription
        self._token = trio_token

    def request(self, n: int) -> None:
        self._call(self._subscription.request, n)

    def cancel(self) -> None:
        self._call(self._subscription.cancel)

    def _call(self, fn: Any, *args: Any) -> None:
        try:
            self._token.run_sync_soon(fn, *args)
        except trio.RunFinishedError:
            pass


class _HandOver(Subscriber[Any]):
    """Gives the real subscriber a thread-safe subscription; forwards signals as they are."""

    __slots__ = ("_subscriber", "_token")

    def __init__(self, subscriber: Subscriber[Any], token: trio.lowlevel.TrioToken) -> None:
        self._subscriber = subscriber
        self._token = token

    def on_subscribe(self, subscription: Subscription) -> None:
        check_signal_argument(subscription, "on_subscribe")
        self._subscriber.on_subscribe(ThreadSafeSubscription(subscription, self._token))

    def on_next(self, item: Any) -> None:
        self._subscriber.on_next(item)

    def on_error(self, error: BaseException) -> None:
        self._subscriber.on_error(error)

    def on_complete(self) -> None:
        self._subscriber.on_complete()


def subscribe_from_thread(
    publisher: Publisher[Any], subscriber: Subscriber[Any], trio_token: trio.lowlevel.TrioToken
) -> None:
    """Subscribe from a foreign thread; signals run on the trio thread (see module docs)."""
    check_subscriber(subscriber)
    trio_token.run_sync_soon(publisher.subscribe, _HandOver(subscriber, trio_token))


_COMPLETE = object()


class _Failed:
    """Carries an on_error through the queue (an exception may also be a plain item)."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error


class _QueueSubscriber(Subscriber[Any]):
    """Runs on the trio thread and puts signals into a queue the worker thread reads.

    The queue never holds more than ``prefetch`` items plus one terminal marker, because
    the worker requests only as it consumes, so ``put_nowait`` cannot block the trio thread.
    """

    __slots__ = ("_prefetch", "_queue", "_terminated", "subscription")

    def __init__(self, signals: queue.Queue[Any], prefetch: int) -> None:
        self._queue = signals
        self._prefetch = prefetch
        self.subscription: Subscription | None = None
        self._terminated = False

    def on_subscribe(self, subscription: Subscription) -> None:
        if not validate_subscription(self.subscription, subscription):
            return
        self.subscription = subscription
        subscription.request(self._prefetch)

    def on_next(self, item: Any) -> None:
        check_signal_argument(item, "on_next")
        if self._terminated:
            return  # rule 2.8: late items after we cancelled
        if self._queue.qsize() >= self._prefetch:
            self.subscription.cancel()  # type: ignore[union-attr]  # set by on_subscribe first
            self._terminate(_Failed(MissingBackpressureError("rule 1.1: more items than requested")))
            return
        self._queue.put_nowait(item)

    def on_error(self, error: BaseException) -> None:
        check_signal_argument(error, "on_error")
        self._terminate(_Failed(error))

    def on_complete(self) -> None:
        self._terminate(_COMPLETE)

    def _terminate(self, marker: Any) -> None:
        if not self._terminated:
            self._terminated = True
            self._queue.put_nowait(marker)  # the one slot beyond prefetch is kept for this


def blocking_iterate(
    publisher: Publisher[Any], trio_token: trio.lowlevel.TrioToken, *, prefetch: int = 256
) -> Generator[Any]:
    """Iterate a publisher's items from a worker thread, blocking while none is ready.

    Demand is replenished in batches of ``prefetch - prefetch // 4``; an ``on_error`` is
    raised from the iterator; closing the generator early cancels the subscription.
    """
    if prefetch < 1:
        raise ValueError(f"prefetch must be >= 1, got {prefetch}")
    signals: queue.Queue[Any] = queue.Queue(maxsize=prefetch + 1)
    subscriber = _QueueSubscriber(signals, prefetch)
    trio_token.run_sync_soon(publisher.subscribe, subscriber)
    limit = prefetch - (prefetch >> 2)
    consumed = 0
    finished = False
    try:
        while True:
            signal = signals.get()
            if signal is _COMPLETE:
                finished = True
                return
            if type(signal) is _Failed:
                finished = True
                raise signal.error
            yield signal
            consumed += 1
            if consumed == limit:
                consumed = 0
                trio_token.run_sync_soon(_request, subscriber, limit)
    finally:
        if not finished:
            try:
                trio_token.run_sync_soon(_cancel, subscriber)
            except trio.RunFinishedError:
                pass


def _request(subscriber: _QueueSubscriber, n: int) -> None:
    subscriber.subscription.request(n)  # type: ignore[union-attr]  # set by on_subscribe first


def _cancel(subscriber: _QueueSubscriber) -> None:
    if subscriber.subscription is not None:
        subscriber.subscription.cancel()
