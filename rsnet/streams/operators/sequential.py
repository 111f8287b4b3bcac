"""Operators that subscribe to one upstream after another: concat and retry.

Both hand the downstream a :class:`SubscriptionArbiter`, so demand not yet met by one
upstream carries over to the next (deferred requesting), and both subscribe in a trampoline
loop, so a thousand sources that complete synchronously do not nest a thousand stack frames
(the reasoning of rule 3.3).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from ..interfaces import Publisher, Subscriber, Subscription
from ..rules import check_signal_argument, check_subscriber, report_undeliverable, validate_subscription
from ..subscriptions import DISCARD, SubscriptionArbiter


class _SerialSubscriber(Subscriber[Any]):
    """Relays items from a succession of upstreams to one downstream.

    Subclasses decide in ``_next_source`` which upstream comes next (None: none), and in
    ``on_complete``/``on_error`` whether a terminal signal ends the stream or moves on.
    """

    __slots__ = (
        "_again",
        "_emitting",
        "_pending_error",
        "_produced",
        "_subscribing",
        "_upstream",
        "arbiter",
        "done",
        "downstream",
    )

    def __init__(self, downstream: Subscriber[Any]) -> None:
        self.downstream = downstream
        self.arbiter = SubscriptionArbiter(self._bad_request)
        self._produced = 0
        self._subscribing = False
        self._again = False
        self._emitting = False
        self._pending_error: BaseException | None = None
        self._upstream: Subscription | None = None  # until it terminates
        self.done = False

    def start(self) -> None:
        self.downstream.on_subscribe(_ArbiterHandle(self))
        self._subscribe_next()

    def _next_source(self) -> Publisher[Any] | None:
        raise NotImplementedError

    def on_subscribe(self, subscription: Subscription) -> None:
        if not validate_subscription(self._upstream, subscription):  # the current one has not terminated
            return
        self._upstream = subscription
        self.arbiter.set_subscription(subscription)

    def on_next(self, item: Any) -> None:
        check_signal_argument(item, "on_next")
        if self.done:
            return
        self._produced += 1
        self._emitting = True
        try:
            self.downstream.on_next(item)
        finally:
            self._emitting = False
        if self._pending_error is not None:
            self._finish(self._pending_error)

    def _subscribe_next(self) -> None:
        """Account for the finished upstream and subscribe to the next, iteratively."""
        self._upstream = None
        if self._produced:
            self.arbiter.produced(self._produced)
            self._produced = 0
        if self._subscribing:
            self._again = True  # the loop below, further up this stack, takes it
            return
        self._subscribing = True
        try:
            while True:
                self._again = False
                if self.arbiter.cancelled or self.done:
                    return
                try:
                    source = self._next_source()
                except Exception as error:
                    self._finish(error)
                    return
                if source is None:
                    self._finish(None)
                    return
                source.subscribe(self)
                if not self._again:
                    return
        finally:
            self._subscribing = False

    def _finish(self, error: BaseException | None) -> None:
        if self.done:
            if error is not None:
                report_undeliverable(error)
            return
        self.done = True
        self.arbiter.cancel()
        downstream, self.downstream = self.downstream, DISCARD
        if error is None:
            downstream.on_complete()
        else:
            downstream.on_error(error)

    def _bad_request(self, error: BaseException) -> None:
        # rule 3.9, signalled by this stage (an upstream's error might be retried); if the
        # request came from inside on_next, after on_next returns (rule 1.3).
        if self._emitting:
            self._pending_error = error
        else:
            self._finish(error)


class _ArbiterHandle(Subscription):
    """The downstream's Subscription: the arbiter, plus forgetting the downstream (rule 3.13)."""

    __slots__ = ("_owner",)

    def __init__(self, owner: _SerialSubscriber) -> None:
        self._owner = owner

    def request(self, n: int) -> None:
        self._owner.arbiter.request(n)

    def cancel(self) -> None:
        owner = self._owner
        owner.downstream = DISCARD
        owner.arbiter.cancel()


class _ConcatSubscriber(_SerialSubscriber):
    __slots__ = ("_sources",)

    def __init__(self, downstream: Subscriber[Any], sources: Iterator[Publisher[Any]]) -> None:
        super().__init__(downstream)
        self._sources = sources

    def _next_source(self) -> Publisher[Any] | None:
        return next(self._sources, None)

    def on_error(self, error: BaseException) -> None:
        check_signal_argument(error, "on_error")
        self._finish(error)

    def on_complete(self) -> None:
        self._subscribe_next()


class ConcatPublisher(Publisher[Any]):
    __slots__ = ("_sources",)

    def __init__(self, sources: tuple[Publisher[Any], ...]) -> None:
        self._sources = sources

    def subscribe(self, subscriber: Subscriber[Any]) -> None:
        check_subscriber(subscriber)
        _ConcatSubscriber(subscriber, iter(self._sources)).start()


def concat(*sources: Publisher[Any]) -> Publisher[Any]:
    """All items of the first source, then all of the second, and so on."""
    return ConcatPublisher(sources)


class _RetrySubscriber(_SerialSubscriber):
    __slots__ = ("_origin", "_retries_left", "_should_retry", "_source")

    def __init__(
        self,
        downstream: Subscriber[Any],
        source: Publisher[Any],
        retries: int | None,
        should_retry: Callable[[BaseException], bool] | None,
    ) -> None:
        super().__init__(downstream)
        self._origin = source
        self._source: Publisher[Any] | None = source
        self._retries_left = retries
        self._should_retry = should_retry

    def _next_source(self) -> Publisher[Any] | None:
        source, self._source = self._source, None
        return source

    def on_error(self, error: BaseException) -> None:
        check_signal_argument(error, "on_error")
        if self.done:
            report_undeliverable(error)
            return
        if self._retries_left == 0:
            self._finish(error)
            return
        try:
            again = self._should_retry is None or self._should_retry(error)
        except Exception as failure:
            failure.__context__ = error
            self._finish(failure)
            return
        if not again:
            self._finish(error)
            return
        if self._retries_left is not None:
            self._retries_left -= 1
        self._source = self._origin
        self._subscribe_next()

    def on_complete(self) -> None:
        self._finish(None)


class RetryPublisher(Publisher[Any]):
    __slots__ = ("_retries", "_should_retry", "_source")

    def __init__(
        self,
        source: Publisher[Any],
        retries: int | None,
        should_retry: Callable[[BaseException], bool] | None,
    ) -> None:
        self._source = source
        self._retries = retries
        self._should_retry = should_retry

    def subscribe(self, subscriber: Subscriber[Any]) -> None:
        check_subscriber(subscriber)
        _RetrySubscriber(subscriber, self._source, self._retries, self._should_retry).start()


def retry(
    retries: int | None = None, *, should_retry: Callable[[BaseException], bool] | None = None
) -> Callable[[Publisher[Any]], Publisher[Any]]:
    """On on_error, subscribe to the source again, up to ``retries`` times (None: forever).

    ``should_retry(error)`` may veto a retry; its veto passes the error on. Items delivered
    before a failure are not delivered again by the operator itself: a source that replays
    them on resubscription will replay them, and demand already met is not asked again.
    """
    if retries is not None and retries < 0:
        raise ValueError(f"retry() needs retries >= 0 or None, got {retries}")
    return lambda source: RetryPublisher(source, retries, should_retry)
