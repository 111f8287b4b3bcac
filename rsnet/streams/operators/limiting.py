"""Operators that bound a stream or its demand: take, skip, take_while, limit_rate."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..interfaces import Subscriber, Subscription
from ..rules import MAX_DEMAND, add_demand, check_signal_argument
from ..subscriptions import ForwardingSubscriber
from ._base import Operator, stage


def _check_count(name: str, count: int) -> None:
    if count < 0:
        raise ValueError(f"{name}() needs a count >= 0, got {count}")


class _TakeSubscriber(ForwardingSubscriber):
    """Requests at most ``count`` items upstream in total, then completes and cancels."""

    __slots__ = ("_remaining", "_unrequested")

    def __init__(self, downstream: Subscriber[Any], count: int) -> None:
        super().__init__(downstream)
        self._remaining = count
        self._unrequested = count

    def on_subscribe(self, subscription: Subscription) -> None:
        super().on_subscribe(subscription)
        if self._remaining == 0 and not self.done:
            self.complete_early()

    def on_next(self, item: Any) -> None:
        check_signal_argument(item, "on_next")
        if self.done:
            return
        self._remaining -= 1
        self.downstream.on_next(item)
        if self._remaining == 0:
            self.complete_early()

    def request(self, n: int) -> None:
        if n <= 0:
            self.upstream.request(n)  # type: ignore[union-attr]  # set by on_subscribe; upstream signals rule 3.9
            return
        amount = min(n, self._unrequested)
        if amount:
            self._unrequested -= amount
            self.upstream.request(amount)  # type: ignore[union-attr]  # set by on_subscribe first


def take(count: int) -> Operator:
    """Emit the first ``count`` items, then cancel upstream and complete."""
    _check_count("take", count)
    return stage(lambda downstream: _TakeSubscriber(downstream, count))


class _SkipSubscriber(ForwardingSubscriber):
    __slots__ = ("_count", "_remaining")

    def __init__(self, downstream: Subscriber[Any], count: int) -> None:
        super().__init__(downstream)
        self._count = count
        self._remaining = count

    def on_subscribe(self, subscription: Subscription) -> None:
        super().on_subscribe(subscription)
        if self._count and not self.done:
            # The skipped items are paid for once, up front, instead of one by one. The
            # full count: some may already have been skipped during on_subscribe.
            subscription.request(self._count)

    def on_next(self, item: Any) -> None:
        if self._remaining:
            check_signal_argument(item, "on_next")
            self._remaining -= 1
        else:
            super().on_next(item)


def skip(count: int) -> Operator:
    """Drop the first ``count`` items."""
    _check_count("skip", count)
    return stage(lambda downstream: _SkipSubscriber(downstream, count))


class _TakeWhileSubscriber(ForwardingSubscriber):
    __slots__ = ("_predicate",)

    def __init__(self, downstream: Subscriber[Any], predicate: Callable[[Any], bool]) -> None:
        super().__init__(downstream)
        self._predicate = predicate

    def on_next(self, item: Any) -> None:
        check_signal_argument(item, "on_next")
        if self.done:
            return
        try:
            keep = self._predicate(item)
        except Exception as error:
            self.fail(error)
            return
        if keep:
            self.downstream.on_next(item)
        else:
            self.complete_early()


def take_while(predicate: Callable[[Any], bool]) -> Operator:
    """Emit items while ``predicate(item)`` holds; complete at the first that fails it."""
    return stage(lambda downstream: _TakeWhileSubscriber(downstream, predicate))


class _LimitRateSubscriber(ForwardingSubscriber):
    """Keeps at most ``rate`` items requested upstream, topped up after ``limit`` arrive.

    ``requested`` is the downstream's outstanding demand and ``outstanding`` the part of it
    already requested upstream; so ``outstanding <= min(rate, requested)`` always holds.
    """

    __slots__ = ("_consumed", "_limit", "_outstanding", "_rate", "_requested")

    def __init__(self, downstream: Subscriber[Any], rate: int) -> None:
        super().__init__(downstream)
        self._rate = rate
        self._limit = rate - (rate >> 2)
        self._requested = 0
        self._outstanding = 0
        self._consumed = 0

    def request(self, n: int) -> None:
        if n <= 0:
            self.upstream.request(n)  # type: ignore[union-attr]  # set by on_subscribe; upstream signals rule 3.9
            return
        self._requested = add_demand(self._requested, n)
        self._top_up()

    def on_next(self, item: Any) -> None:
        check_signal_argument(item, "on_next")
        if self.done:
            return
        self._outstanding -= 1
        if self._requested != MAX_DEMAND:
            self._requested -= 1
        self.downstream.on_next(item)
        self._consumed += 1
        if self._consumed >= self._limit:
            self._consumed = 0
            self._top_up()

    def _top_up(self) -> None:
        amount = min(self._rate, self._requested) - self._outstanding
        if amount > 0 and not self.done:
            self._outstanding += amount
            self.upstream.request(amount)  # type: ignore[union-attr]  # set by on_subscribe first


def limit_rate(rate: int) -> Operator:
    """Never request more than ``rate`` items upstream at once, whatever downstream asks.

    Replenishes in batches of ``rate - rate // 4`` once that many have arrived, so a large
    downstream request turns into a steady series of bounded upstream requests.
    """
    if rate < 1:
        raise ValueError(f"limit_rate() needs a rate >= 1, got {rate}")
    return stage(lambda downstream: _LimitRateSubscriber(downstream, rate))
