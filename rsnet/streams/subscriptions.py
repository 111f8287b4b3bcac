"""The shared machinery every rsnet stage is built from, so each rule is written once.

- :class:`EmittingSubscription`: the subscription side of a source. It owns the demand counter
  (rules 3.8, 3.17), turns ``request(n <= 0)`` into ``on_error`` (rule 3.9), serialises all
  signals through one drain loop so ``request`` from inside ``on_next`` never recurses (rules
  1.3, 3.3), guarantees one terminal signal (rule 1.7) and forgets the subscriber on cancel or
  termination (rules 1.6, 3.13).
- :class:`ForwardingSubscriber`: the base of one-upstream, one-downstream operators.
- :class:`SubscriptionArbiter`: deferred request and subscription switching, for operators that
  subscribe to one upstream after another (concat, retry), as RxJava's ``SubscriptionArbiter``.
- :class:`DrainLoop`: the queue-drain serialization of the multi-source stages (flat_map, zip,
  the backpressure strategies, the multicast processor).
- :class:`CoordinatingLoop`: a drain loop with the one "first error wins" slot of the stages
  that coordinate several upstreams (flat_map, zip).
- :class:`PrefetchingInner`: one of several upstreams of a coordinating operator (flat_map,
  zip), buffering a bounded prefetch for the operator's drain loop.
- :func:`subscribe_failed`: ``on_subscribe`` then ``on_error``, for publishers that reject.

Single-threaded by design: every method runs on the trio thread that owns the stream, and no
method awaits, so a plain boolean is a sufficient work-in-progress guard. Imports only the
standard library and the rest of the streams core.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Protocol

from .interfaces import Subscriber, Subscription
from .rules import (
    MAX_DEMAND,
    MissingBackpressureError,
    add_demand,
    check_signal_argument,
    invalid_request,
    report_undeliverable,
    validate_subscription,
)


class _NoopSubscription(Subscription):
    """A subscription with nothing behind it: for publishers that terminate immediately."""

    __slots__ = ()

    def request(self, n: int) -> None:
        pass  # the stream already ended, so this is a no-op (rule 3.6 by analogy, 1.6)

    def cancel(self) -> None:
        pass


NOOP_SUBSCRIPTION: Subscription = _NoopSubscription()


def subscribe_failed(subscriber: Subscriber[Any], error: BaseException) -> None:
    """Reject a subscription: ``on_subscribe`` first, then ``on_error`` (rule 1.9)."""
    subscriber.on_subscribe(NOOP_SUBSCRIPTION)
    subscriber.on_error(error)


def deliver_safely(signal: Any, *args: Any) -> bool:
    """Call a subscriber's signal method; an exception from it is a rule 2.13 violation.

    The exception cannot go back to the subscriber, so it is reported as undeliverable and
    ``False`` is returned; the caller must then treat the subscription as cancelled.
    """
    try:
        signal(*args)
    except Exception as error:
        report_undeliverable(error)
        return False
    return True


class EmittingSubscription(Subscription):
    """The subscription of a source that emits to one subscriber.

    Subclasses implement :meth:`_emit`, which emits what the current demand allows and
    returns whether the drain loop should run again, and may override :meth:`_on_cancel`
    to release what feeds them. They signal only through ``_signal_next`` (or
    ``_signal_many``, for a subscriber that has ``on_next_many``),
    ``_signal_error`` and ``_signal_complete``.

    ``requested`` is the outstanding demand; ``MAX_DEMAND`` means unbounded and is never
    decremented (rule 3.17). ``cancelled`` is also true after a terminal signal (rule 1.6).
    """

    __slots__ = ("_bad_request", "_draining", "_subscriber", "cancelled", "requested")

    def __init__(self, subscriber: Subscriber[Any]) -> None:
        self._subscriber: Subscriber[Any] | None = subscriber
        self.requested = 0
        self.cancelled = False
        self._draining = False
        self._bad_request: BaseException | None = None

    # -- Subscription ---------------------------------------------------------------

    def request(self, n: int) -> None:
        if self.cancelled:
            return  # rule 3.6
        if n <= 0:
            # rule 3.9: signalled, not raised, and through the drain loop so it never
            # overlaps an on_next in progress (rule 1.3).
            self._bad_request = invalid_request(n)
        else:
            self.requested = add_demand(self.requested, n)
        self._drain()

    def cancel(self) -> None:
        if self.cancelled:
            return  # rule 3.7
        self.cancelled = True
        self._subscriber = None  # rule 3.13
        self._on_cancel()

    # -- for subclasses ---------------------------------------------------------------

    def _emit(self) -> bool:
        """Emit as much as demand allows now; return True to run the drain loop again."""
        raise NotImplementedError

    def _on_cancel(self) -> None:
        """Release whatever feeds this subscription; called once, on cancel or termination."""

    def _drain(self) -> None:
        if self._draining:
            return  # the loop already running on this stack sees the new state (rule 3.3)
        self._draining = True
        try:
            while not self.cancelled:
                if self._bad_request is not None:
                    self._signal_error(self._bad_request)
                    return
                if not self._emit():
                    return
        finally:
            self._draining = False

    def _signal_next(self, item: Any) -> None:
        """Deliver one item; the caller has checked ``requested > 0`` (rule 1.1)."""
        if self.requested != MAX_DEMAND:
            self.requested -= 1
        if not deliver_safely(self._subscriber.on_next, item):  # type: ignore[union-attr]  # None only once cancelled, and the drain loop stops then
            self.cancel()

    def _signal_many(self, items: list[Any]) -> None:
        """Deliver several items in one ``on_next_many`` call; the caller has checked that
        the subscriber has it, that ``requested >= len(items)`` and that no item is None."""
        if self.requested != MAX_DEMAND:
            self.requested -= len(items)
        if not deliver_safely(self._subscriber.on_next_many, items):  # type: ignore[union-attr]  # None only once cancelled, and the drain loop stops then
            self.cancel()

    def _signal_error(self, error: BaseException) -> None:
        subscriber = self._terminate()
        if subscriber is None:
            report_undeliverable(error)  # rule 1.7: the stream already ended
        else:
            deliver_safely(subscriber.on_error, error)

    def _signal_complete(self) -> None:
        subscriber = self._terminate()
        if subscriber is not None:
            deliver_safely(subscriber.on_complete)

    def _terminate(self) -> Subscriber[Any] | None:
        if self.cancelled:
            return None
        subscriber = self._subscriber
        self.cancelled = True  # rule 1.6: terminated means cancelled
        self._subscriber = None
        self._on_cancel()
        return subscriber


class _DiscardingSubscriber(Subscriber[Any]):
    """Swallows the signals that may still arrive after a downstream cancelled (rule 2.8)."""

    __slots__ = ()

    def on_subscribe(self, subscription: Subscription) -> None:
        subscription.cancel()

    def on_next(self, item: Any) -> None:
        pass

    def on_error(self, error: BaseException) -> None:
        pass

    def on_complete(self) -> None:
        pass


DISCARD: Subscriber[Any] = _DiscardingSubscriber()


class ForwardingSubscriber(Subscriber[Any], Subscription):
    """Base of an operator with one upstream and one downstream.

    It is the upstream's Subscriber and the downstream's Subscription. It cancels a second
    ``on_subscribe`` (rule 2.5), rejects ``None`` signals (rule 2.13), passes at most one
    terminal signal on (rule 1.7) and forgets the downstream on cancel (rule 3.13).
    Subclasses override ``on_next`` (and whichever else they change) and call
    :meth:`fail` when a user function raises.
    """

    __slots__ = ("done", "downstream", "upstream")

    def __init__(self, downstream: Subscriber[Any]) -> None:
        self.downstream = downstream
        self.upstream: Subscription | None = None
        self.done = False

    def on_subscribe(self, subscription: Subscription) -> None:
        if not validate_subscription(self.upstream, subscription):
            return
        self.upstream = subscription
        self.downstream.on_subscribe(self)

    def on_next(self, item: Any) -> None:
        check_signal_argument(item, "on_next")
        if not self.done:
            self.downstream.on_next(item)

    def on_error(self, error: BaseException) -> None:
        check_signal_argument(error, "on_error")
        if self.done:
            report_undeliverable(error)
            return
        self.done = True
        downstream, self.downstream = self.downstream, DISCARD
        downstream.on_error(error)

    def on_complete(self) -> None:
        if self.done:
            return
        self.done = True
        downstream, self.downstream = self.downstream, DISCARD
        downstream.on_complete()

    def request(self, n: int) -> None:
        self.upstream.request(n)  # type: ignore[union-attr]  # set by on_subscribe first

    def cancel(self) -> None:
        self.downstream = DISCARD  # rule 3.13
        self.upstream.cancel()  # type: ignore[union-attr]  # set by on_subscribe first

    def fail(self, error: BaseException) -> None:
        """Cancel upstream and signal ``error`` downstream (e.g. a user function raised)."""
        self.upstream.cancel()  # type: ignore[union-attr]  # set by on_subscribe first
        self.on_error(error)

    def complete_early(self) -> None:
        """Cancel upstream and complete downstream (e.g. ``take`` has all it wanted)."""
        self.upstream.cancel()  # type: ignore[union-attr]  # set by on_subscribe first
        self.on_complete()


class SubscriptionArbiter(Subscription):
    """A downstream Subscription whose upstream is replaced over time.

    Demand requested before any upstream arrived, or not yet satisfied by the previous one,
    is requested from the next (deferred requesting, seed 004). Callers report what was
    delivered with :meth:`produced` before switching. ``request(n <= 0)`` is routed to
    ``on_bad_request`` so the owning operator can signal it (rule 3.9).
    """

    __slots__ = ("_current", "_on_bad_request", "cancelled", "requested")

    def __init__(self, on_bad_request: Any) -> None:
        self._current: Subscription | None = None
        self.requested = 0
        self.cancelled = False
        self._on_bad_request = on_bad_request

    def request(self, n: int) -> None:
        if self.cancelled:
            return
        if n <= 0:
            self._on_bad_request(invalid_request(n))
            return
        self.requested = add_demand(self.requested, n)
        if self._current is not None:
            self._current.request(n)

    def cancel(self) -> None:
        if self.cancelled:
            return
        self.cancelled = True
        current, self._current = self._current, None
        if current is not None:
            current.cancel()

    def produced(self, n: int) -> None:
        if self.requested != MAX_DEMAND:
            self.requested -= n

    def set_subscription(self, subscription: Subscription) -> None:
        """Switch to ``subscription`` and request from it what is still outstanding."""
        if self.cancelled:
            subscription.cancel()
            return
        self._current = subscription
        if self.requested > 0:
            subscription.request(self.requested)


class DrainLoop:
    """Queue-drain serialization (seed 004), one loop per stage.

    Whoever calls :meth:`drain` while the loop is running only marks it as missed, and the
    running loop goes round once more: so however requests and upstream signals interleave,
    and from whatever stack, the stage's signals never overlap or nest (rules 1.3, 3.3).
    Subclasses set ``_draining`` and ``_missed`` to False in their ``__init__`` and define
    :meth:`_drain_step`.
    """

    __slots__ = ("_draining", "_missed")
    _draining: bool
    _missed: bool

    def drain(self) -> None:
        if self._draining:
            self._missed = True  # the loop running further up this stack goes round again
            return
        self._draining = True
        try:
            while True:
                self._missed = False
                if self._drain_step() or not self._missed:
                    return
        finally:
            self._draining = False

    def _drain_step(self) -> bool:
        """Emit what can be emitted now; return True once the stage has terminated."""
        raise NotImplementedError


class CoordinatingLoop(DrainLoop):
    """The drain loop of an operator fed by several upstreams (flat_map, zip): the first error wins.

    Any upstream's error, and the operator's own (rule 3.9), goes through :meth:`inner_error`:
    the first is kept in ``_error`` for the drain loop to signal downstream; every later one
    is undeliverable (rule 1.7), however the upstreams interleave. Subclasses set ``_error``
    to None in their ``__init__`` and end the stream in ``_drain_step`` once it is set.
    """

    __slots__ = ("_error",)
    _error: BaseException | None

    def inner_error(self, error: BaseException) -> None:
        if self._error is None:
            self._error = error
        else:
            report_undeliverable(error)
        self.drain()


class Coordinator(Protocol):
    """What a :class:`PrefetchingInner` needs from the operator that owns it."""

    prefetch: int
    limit: int
    cancelled: bool

    def drain(self) -> None: ...

    def inner_error(self, error: BaseException) -> None: ...


class PrefetchingInner(Subscriber[Any]):
    """One upstream of a coordinating operator: requests ``prefetch`` up front, queues what
    arrives for the operator's drain loop, and replenishes in batches of ``limit`` as the
    operator takes items (:meth:`taken`). More items than requested is a rule 1.1 violation,
    reported to the operator rather than queued."""

    __slots__ = ("_consumed", "_parent", "done", "queue", "subscription")

    def __init__(self, parent: Coordinator) -> None:
        self._parent = parent
        self.subscription: Subscription | None = None
        self.queue: deque[Any] = deque()
        self.done = False
        self._consumed = 0

    def on_subscribe(self, subscription: Subscription) -> None:
        if not validate_subscription(self.subscription, subscription, wanted=not self._parent.cancelled):
            return
        self.subscription = subscription
        subscription.request(self._parent.prefetch)

    def on_next(self, item: Any) -> None:
        check_signal_argument(item, "on_next")
        if self.done:
            return
        if len(self.queue) >= self._parent.prefetch:
            self.cancel()
            self._parent.inner_error(MissingBackpressureError("rule 1.1: an upstream exceeded its demand"))
            return
        self.queue.append(item)
        self._parent.drain()

    def on_error(self, error: BaseException) -> None:
        check_signal_argument(error, "on_error")
        if self.done:
            report_undeliverable(error)
            return
        self.done = True
        self._parent.inner_error(error)

    def on_complete(self) -> None:
        if not self.done:
            self.done = True
            self._parent.drain()

    def taken(self, count: int) -> None:
        """``count`` items left the queue: replenish once a batch of ``limit`` has gone."""
        self._consumed += count
        if self._consumed >= self._parent.limit and not self.done:
            amount, self._consumed = self._consumed, 0
            self.subscription.request(amount)  # type: ignore[union-attr]  # set by on_subscribe first

    def cancel(self) -> None:
        self.done = True
        self.queue.clear()
        if self.subscription is not None:
            self.subscription.cancel()
