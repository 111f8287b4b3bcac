"""flat_map and merge: many inner publishers, interleaved into one stream.

The queue-drain design of RxJava's ``flatMap`` (seed 004), single-threaded: each inner
subscriber buffers at most ``prefetch`` items (and requests that many, replenishing in
batches), and one drain loop moves items to the downstream as its demand allows, visiting the
inners round-robin so a fast inner cannot starve a slow one. The outer source is asked for
``max_concurrency`` publishers up front and for one more each time an inner finishes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..interfaces import Publisher, Subscriber, Subscription
from ..rules import (
    MAX_DEMAND,
    add_demand,
    check_signal_argument,
    check_subscriber,
    invalid_request,
    report_undeliverable,
    validate_subscription,
)
from ..sources import from_iterable
from ..subscriptions import DISCARD, CoordinatingLoop, PrefetchingInner
from ._base import Operator

DEFAULT_INNER_PREFETCH = 128


class _FlatMapSubscriber(CoordinatingLoop, Subscriber[Any], Subscription):
    __slots__ = (
        "_mapper",
        "_max_concurrency",
        "_next_inner",
        "_outer_done",
        "cancelled",
        "downstream",
        "inners",
        "limit",
        "prefetch",
        "requested",
        "upstream",
    )

    def __init__(
        self,
        downstream: Subscriber[Any],
        mapper: Callable[[Any], Publisher[Any]],
        max_concurrency: int,
        prefetch: int,
    ) -> None:
        self.downstream = downstream
        self._mapper = mapper
        self._max_concurrency = max_concurrency
        self.prefetch = prefetch
        self.limit = prefetch - (prefetch >> 2)
        self.upstream: Subscription | None = None
        self.inners: list[PrefetchingInner] = []
        self.requested = 0
        self.cancelled = False
        self._outer_done = False
        self._error: BaseException | None = None
        self._draining = False
        self._missed = False
        self._next_inner = 0

    # -- the outer source ---------------------------------------------------------------

    def on_subscribe(self, subscription: Subscription) -> None:
        if not validate_subscription(self.upstream, subscription):
            return
        self.upstream = subscription
        self.downstream.on_subscribe(self)
        if not self.cancelled:
            subscription.request(self._max_concurrency)

    def on_next(self, item: Any) -> None:
        check_signal_argument(item, "on_next")
        if self._outer_done or self.cancelled:
            return
        try:
            publisher = self._mapper(item)
            check_signal_argument(publisher, "flat_map mapper result")
        except Exception as error:
            self.upstream.cancel()  # type: ignore[union-attr]  # set by on_subscribe first
            self._outer_done = True
            self.inner_error(error)
            return
        inner = PrefetchingInner(self)
        self.inners.append(inner)
        publisher.subscribe(inner)

    def on_error(self, error: BaseException) -> None:
        check_signal_argument(error, "on_error")
        if self._outer_done:
            report_undeliverable(error)
            return
        self._outer_done = True
        self.inner_error(error)

    def on_complete(self) -> None:
        if not self._outer_done:
            self._outer_done = True
            self.drain()

    # -- the downstream's Subscription --------------------------------------------------

    def request(self, n: int) -> None:
        if self.cancelled:
            return
        if n <= 0:
            self.inner_error(invalid_request(n))  # rule 3.9, through the drain loop
            return
        self.requested = add_demand(self.requested, n)
        self.drain()

    def cancel(self) -> None:
        if self.cancelled:
            return
        self.cancelled = True
        self.downstream = DISCARD  # rule 3.13
        self._cancel_sources()

    # -- the drain loop -------------------------------------------------------------------

    def _cancel_sources(self) -> None:
        if self.upstream is not None:
            self.upstream.cancel()
        inners, self.inners = self.inners, []
        for inner in inners:
            inner.cancel()

    def _drain_step(self) -> bool:
        if self.cancelled:
            return True
        if self._error is not None:
            self.cancelled = True
            self._cancel_sources()
            downstream, self.downstream = self.downstream, DISCARD
            downstream.on_error(self._error)
            return True
        self._drain_inners()
        if self.cancelled:
            return True
        if self._outer_done and not self.inners and self._error is None:
            self.cancelled = True
            downstream, self.downstream = self.downstream, DISCARD
            downstream.on_complete()
            return True
        return False

    def _drain_inners(self) -> None:
        inners = self.inners
        count = len(inners)
        start = self._next_inner % count if count else 0
        finished: list[PrefetchingInner] = []
        for offset in range(count):
            inner = inners[(start + offset) % count]
            queue = inner.queue
            emitted = 0
            while queue and self.requested and not self.cancelled and self._error is None:
                item = queue.popleft()
                if self.requested != MAX_DEMAND:
                    self.requested -= 1
                emitted += 1
                self.downstream.on_next(item)
            if self.cancelled or self._error is not None:
                return
            if emitted:
                inner.taken(emitted)
            if inner.done and not queue:
                finished.append(inner)
        self._next_inner = start + 1
        if finished:
            for inner in finished:
                self.inners.remove(inner)
            if not self._outer_done:
                # each finished inner frees a concurrency slot: ask for one more publisher
                self.upstream.request(len(finished))  # type: ignore[union-attr]  # set by on_subscribe first
            self._missed = True


class FlatMapPublisher(Publisher[Any]):
    __slots__ = ("_mapper", "_max_concurrency", "_prefetch", "_source")

    def __init__(
        self,
        source: Publisher[Any],
        mapper: Callable[[Any], Publisher[Any]],
        max_concurrency: int,
        prefetch: int,
    ) -> None:
        self._source = source
        self._mapper = mapper
        self._max_concurrency = max_concurrency
        self._prefetch = prefetch

    def subscribe(self, subscriber: Subscriber[Any]) -> None:
        check_subscriber(subscriber)
        self._source.subscribe(_FlatMapSubscriber(subscriber, self._mapper, self._max_concurrency, self._prefetch))


def flat_map(
    mapper: Callable[[Any], Publisher[Any]],
    *,
    max_concurrency: int = 256,
    prefetch: int = DEFAULT_INNER_PREFETCH,
) -> Operator:
    """Subscribe to ``mapper(item)`` for each item and merge their items.

    At most ``max_concurrency`` inner publishers are active at once (``1`` is concat_map;
    ``MAX_DEMAND`` is unbounded); each buffers at most ``prefetch`` items. The first error
    from the outer or any inner cancels everything and is signalled.
    """
    if max_concurrency < 1 or prefetch < 1:
        raise ValueError("flat_map() needs max_concurrency >= 1 and prefetch >= 1")
    return lambda source: FlatMapPublisher(source, mapper, max_concurrency, prefetch)


def _identity(publisher: Publisher[Any]) -> Publisher[Any]:
    return publisher


def merge(*sources: Publisher[Any], prefetch: int = DEFAULT_INNER_PREFETCH) -> Publisher[Any]:
    """Subscribe to all ``sources`` at once and interleave their items as they arrive."""
    return FlatMapPublisher(from_iterable(sources), _identity, max(1, len(sources)), prefetch)
