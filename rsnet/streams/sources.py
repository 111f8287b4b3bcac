"""Synchronous sources: publishers of values that are already at hand.

They emit from inside ``request`` (rule 3.10 allows it), up to the demand and no further
(rule 1.1), through the one drain loop of :class:`EmittingSubscription` so that ``request``
from ``on_next`` does not recurse (rule 3.3). Each subscription gets a fresh iterator, so a
re-iterable source (a list, a ``range``) supports any number of subscribers (rule 1.11).
An iterable's first item is fetched in ``subscribe``, so one that is empty or fails at once
completes or fails without waiting for a request: a terminal signal needs no demand (rules
1.4, 1.5, 1.9).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from itertools import islice, repeat
from operator import is_
from typing import Any

from .interfaces import Publisher, Subscriber
from .rules import check_signal_argument, check_subscriber
from .subscriptions import NOOP_SUBSCRIPTION, EmittingSubscription, subscribe_failed

_UNFETCHED: Any = object()


def _produced_none() -> TypeError:
    return TypeError("rule 2.13: the iterable produced None")


def _before_none(items: list[Any]) -> list[Any] | None:
    """The items before the first None among ``items`` (checked by identity: an item's ``==``
    may raise), or None if there is none."""
    if any(map(is_, items, repeat(None))):
        return items[: next(i for i, item in enumerate(items) if item is None)]
    return None


MANY_AT_ONCE = 1024
"""The most items handed to an ``on_next_many`` subscriber in one call."""


class _IteratorSubscription(EmittingSubscription):
    """Emits from an iterator, looking one item ahead once demand runs out.

    The look-ahead lets the last item be followed by on_complete without further demand
    (as RxJava's ``hasNext`` check does), at the price of fetching one item early.

    A subscriber with ``on_next_many`` (rsnet's iterator and network session) gets the items
    in runs of up to ``MANY_AT_ONCE``, fetched with ``islice`` up to the demand: the same
    items in the same order, without a Python call per item.
    """

    __slots__ = ("_ahead", "_iterator", "_many")

    def __init__(self, subscriber: Subscriber[Any], iterator: Iterator[Any], first: Any = _UNFETCHED) -> None:
        super().__init__(subscriber)
        self._iterator = iterator
        self._ahead = first  # an item already fetched from the iterator, or _UNFETCHED
        self._many = getattr(subscriber, "on_next_many", None) is not None

    def _emit_many(self) -> bool:
        """Emit a run of items; return False once the stream has terminated."""
        items: list[Any] = []
        wanted = min(self.requested, MANY_AT_ONCE)
        failure: BaseException | None = None
        try:
            items.extend(islice(self._iterator, wanted))
        except Exception as error:
            failure = error  # the items fetched before it are still delivered
        cut = _before_none(items)
        if cut is not None:
            items, failure = cut, _produced_none()
        if items:
            self._signal_many(items)
            if self.cancelled or self._bad_request is not None:
                return True  # the drain loop sees it (a per-item emitter would stop here too)
        if failure is not None:
            self._signal_error(failure)
            return False
        if len(items) < wanted:
            self._signal_complete()  # islice stopped early: the iterator is exhausted
            return False
        return True

    def _emit(self) -> bool:
        while not self.cancelled and self._bad_request is None:
            if self._many and self.requested > 1 and self._ahead is _UNFETCHED:
                if not self._emit_many():
                    return False
                continue
            if self._ahead is _UNFETCHED:
                try:
                    # A default rather than StopIteration: an exhausted iterator then raises
                    # nothing (a raised and caught StopIteration cost every stream's end 0.15 us).
                    item = next(self._iterator, _UNFETCHED)
                except Exception as error:
                    self._signal_error(error)
                    return False
                if item is _UNFETCHED:
                    self._signal_complete()
                    return False
                if item is None:
                    self._signal_error(_produced_none())
                    return False
            else:
                item, self._ahead = self._ahead, _UNFETCHED
            if not self.requested:
                self._ahead = item  # demand ran out: keep it for the next request
                return False
            self._signal_next(item)
        # Loop again only if something besides demand changed (a bad request).
        return self._bad_request is not None

    def poll_sync(self, n: int) -> tuple[list[Any], BaseException | bool]:
        """Up to ``n`` items at once, without signals (the fast path of
        :class:`~rsnet.streams.interfaces.Subscription`): the same items, look-ahead and end
        as ``request(n)`` would signal."""
        if self.cancelled or self._draining or self._bad_request is not None:
            return [], False
        ahead, self._ahead = self._ahead, _UNFETCHED
        items = [] if ahead is _UNFETCHED else [ahead]  # (fetched before: never None)
        fetched = len(items)
        end: BaseException | bool = True  # unless n items and one more come
        try:
            if len(items) < n:
                items.extend(islice(self._iterator, n - len(items)))
            if len(items) == n:
                ahead = next(self._iterator, _UNFETCHED)  # an end needs no more demand
                if ahead is None:
                    raise _produced_none()
                if ahead is not _UNFETCHED:
                    self._ahead = ahead
                    end = False
        except Exception as error:
            end = error  # the items fetched before it are still delivered
        cut = _before_none(items) if len(items) > fetched else None
        if cut is not None:  # (what came after a None never counts)
            items, end = cut, _produced_none()
        if end is not False:
            self._terminate()
        return items, end

    def _on_cancel(self) -> None:
        self._iterator = iter(())  # drop the source's references (rule 3.13)
        self._ahead = _UNFETCHED


class IterablePublisher(Publisher[Any]):
    """Publishes the items of an iterable, then completes; errors from iteration become on_error."""

    __slots__ = ("_iterable",)

    def __init__(self, iterable: Iterable[Any]) -> None:
        self._iterable = iterable

    def subscribe(self, subscriber: Subscriber[Any]) -> None:
        check_subscriber(subscriber)
        # The first item is fetched now, as RxJava's fromIterable asks hasNext() first: an
        # empty or failing iterable terminates without any request (rules 1.4, 1.5, 1.9; the
        # TCK's createFailedPublisher, e.g. concat(range_(0, 0), error(...))).
        try:
            iterator = iter(self._iterable)
            first = next(iterator)
        except StopIteration:
            subscriber.on_subscribe(NOOP_SUBSCRIPTION)
            subscriber.on_complete()
            return
        except Exception as error:
            subscribe_failed(subscriber, error)
            return
        if first is None:
            subscribe_failed(subscriber, _produced_none())
            return
        subscriber.on_subscribe(_IteratorSubscription(subscriber, iterator, first))


def from_iterable(iterable: Iterable[Any]) -> Publisher[Any]:
    """A publisher of the items of ``iterable`` (a fresh ``iter()`` per subscriber)."""
    return IterablePublisher(iterable)


def just(*items: Any) -> Publisher[Any]:
    """A publisher of exactly ``items``, then on_complete."""
    for item in items:
        check_signal_argument(item, "just")
    return IterablePublisher(items)


def range_(start: int, count: int) -> Publisher[int]:
    """A publisher of ``count`` consecutive integers from ``start``."""
    if count < 0:
        raise ValueError(f"count must be >= 0, got {count}")
    return IterablePublisher(range(start, start + count))


def empty() -> Publisher[Any]:
    """A publisher that completes at once without items (rule 1.5: no request needed)."""
    return _Terminated(None)


def error(exception: BaseException | Callable[[], BaseException]) -> Publisher[Any]:
    """A publisher that signals ``on_subscribe`` and then ``on_error`` (rule 1.4).

    Pass a callable to create a fresh exception per subscriber, so tracebacks don't pile up.
    """
    check_signal_argument(exception, "error")
    return _Terminated(exception)


class _Terminated(Publisher[Any]):
    """Terminates each subscriber right after on_subscribe: completes, or fails with an error."""

    __slots__ = ("_error",)

    def __init__(self, error: BaseException | Callable[[], BaseException] | None) -> None:
        self._error = error

    def subscribe(self, subscriber: Subscriber[Any]) -> None:
        check_subscriber(subscriber)
        failure = self._error
        if failure is None:
            subscriber.on_subscribe(NOOP_SUBSCRIPTION)
            subscriber.on_complete()
            return
        subscribe_failed(subscriber, failure if isinstance(failure, BaseException) else failure())


def defer(factory: Callable[[], Publisher[Any]]) -> Publisher[Any]:
    """A publisher that calls ``factory`` for each subscriber and subscribes to its result."""
    return _Deferred(factory)


class _Deferred(Publisher[Any]):
    __slots__ = ("_factory",)

    def __init__(self, factory: Callable[[], Publisher[Any]]) -> None:
        self._factory = factory

    def subscribe(self, subscriber: Subscriber[Any]) -> None:
        check_subscriber(subscriber)
        try:
            publisher = self._factory()
        except Exception as failure:
            subscribe_failed(subscriber, failure)
            return
        publisher.subscribe(subscriber)
