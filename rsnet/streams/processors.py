"""MulticastProcessor: one upstream, many subscribers, each item delivered to all of them.

It requests ``buffer_size`` items upstream and replenishes in batches as items leave its
buffer. An item leaves the buffer when every current subscriber has demand for it, so the
slowest subscriber sets the pace (backpressure, never an unbounded queue), and a subscriber
joining late sees the items from the head of the buffer on. Items that arrive while nobody
is subscribed wait in the buffer.

An upstream ``on_error`` is passed to every subscriber at once, without waiting for demand or
for the buffer (as the TCK's processor tests require); ``on_complete`` follows the buffered
items. When the last subscriber cancels, the upstream is cancelled too (reference counting,
so cancel travels back to the source) and the processor ends with
:class:`ProcessorCancelledError`. A subscriber arriving after the end receives the terminal
signal right after ``on_subscribe``.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from .interfaces import Processor, Subscriber, Subscription
from .rules import (
    MAX_DEMAND,
    MissingBackpressureError,
    add_demand,
    check_signal_argument,
    check_subscriber,
    invalid_request,
    report_undeliverable,
    validate_subscription,
)
from .subscriptions import DrainLoop, deliver_safely


class ProcessorCancelledError(Exception):
    """The processor's upstream was cancelled because its last subscriber cancelled."""


class _MulticastSubscription(Subscription):
    __slots__ = ("_processor", "cancelled", "error", "requested", "subscriber")

    def __init__(self, processor: MulticastProcessor, subscriber: Subscriber[Any]) -> None:
        self._processor = processor
        self.subscriber: Subscriber[Any] | None = subscriber
        self.requested = 0
        self.cancelled = False
        self.error: BaseException | None = None  # a rule 3.9 error waiting for the drain loop

    def request(self, n: int) -> None:
        if self.cancelled:
            return
        if n <= 0:
            self.error = invalid_request(n)
        else:
            self.requested = add_demand(self.requested, n)
        self._processor.drain()

    def cancel(self) -> None:
        if not self.cancelled:
            self.cancelled = True
            self.subscriber = None  # rule 3.13
            self._processor._remove(self)


class MulticastProcessor(DrainLoop, Processor[Any, Any]):
    """A Processor that multicasts to every subscriber, paced by the slowest (see module docs)."""

    def __init__(self, buffer_size: int = 128) -> None:
        if buffer_size < 1:
            raise ValueError(f"buffer_size must be >= 1, got {buffer_size}")
        self._buffer_size = buffer_size
        self._limit = buffer_size - (buffer_size >> 2)
        self._consumed = 0
        self._queue: deque[Any] = deque()
        self._subscriptions: list[_MulticastSubscription] = []
        self._upstream: Subscription | None = None
        self._done = False
        self._error: BaseException | None = None
        self._draining = False
        self._missed = False

    # -- Subscriber side --------------------------------------------------------------------

    def on_subscribe(self, subscription: Subscription) -> None:
        # After the last subscriber left (done), nobody is left to receive anything.
        if not validate_subscription(self._upstream, subscription, wanted=not self._done):
            return
        self._upstream = subscription
        subscription.request(self._buffer_size)

    def on_next(self, item: Any) -> None:
        check_signal_argument(item, "on_next")
        if self._done:
            return
        if len(self._queue) >= self._buffer_size:
            self._upstream.cancel()  # type: ignore[union-attr]  # set by on_subscribe first
            self.on_error(MissingBackpressureError("rule 1.1: upstream exceeded the demand"))
            return
        self._queue.append(item)
        self.drain()

    def on_error(self, error: BaseException) -> None:
        check_signal_argument(error, "on_error")
        if self._done:
            report_undeliverable(error)
            return
        self._done = True
        self._error = error
        self._queue.clear()  # an error overtakes buffered items (see module docs)
        self.drain()

    def on_complete(self) -> None:
        if not self._done:
            self._done = True
            self.drain()

    # -- Publisher side ---------------------------------------------------------------------

    def subscribe(self, subscriber: Subscriber[Any]) -> None:
        check_subscriber(subscriber)
        subscription = _MulticastSubscription(self, subscriber)
        self._subscriptions.append(subscription)
        subscriber.on_subscribe(subscription)
        self.drain()

    def _remove(self, subscription: _MulticastSubscription) -> None:
        try:
            self._subscriptions.remove(subscription)
        except ValueError:
            return
        if not self._subscriptions and not self._done:
            self._done = True
            self._error = ProcessorCancelledError("the last subscriber cancelled")
            self._queue.clear()
            if self._upstream is not None:
                self._upstream.cancel()
        self.drain()  # the slowest may have gone: the others can move on

    # -- the drain loop -----------------------------------------------------------------------

    def _drain_step(self) -> bool:
        self._reject_bad_requests()
        if self._error is not None:
            self._terminate_all()
            return True
        self._emit_in_lockstep()
        if self._done and not self._queue:
            self._terminate_all()
            return True
        return False

    def _reject_bad_requests(self) -> None:
        for subscription in [s for s in self._subscriptions if s.error is not None]:
            subscriber, error = subscription.subscriber, subscription.error
            subscription.cancel()
            if subscriber is not None:  # None: it cancelled after its bad request
                deliver_safely(subscriber.on_error, error)  # rule 3.9

    def _emit_in_lockstep(self) -> None:
        queue = self._queue
        while queue and self._subscriptions:
            subscriptions = tuple(self._subscriptions)
            if min(s.requested for s in subscriptions) == 0:
                return
            item = queue.popleft()
            for subscription in subscriptions:
                if subscription.cancelled:
                    continue
                if subscription.requested != MAX_DEMAND:
                    subscription.requested -= 1
                if not deliver_safely(subscription.subscriber.on_next, item):  # type: ignore[union-attr]  # None only once cancelled, skipped above
                    subscription.cancel()
            self._consumed += 1
            if self._consumed == self._limit and not self._done:
                self._consumed = 0
                self._upstream.request(self._limit)  # type: ignore[union-attr]  # set by on_subscribe first
            if self._missed:
                self._reject_bad_requests()

    def _terminate_all(self) -> None:
        subscriptions, self._subscriptions = self._subscriptions, []
        for subscription in subscriptions:
            subscriber = subscription.subscriber
            subscription.cancelled = True
            subscription.subscriber = None
            if subscriber is None:
                continue
            if self._error is not None:
                deliver_safely(subscriber.on_error, self._error)
            else:
                deliver_safely(subscriber.on_complete)
