"""zip: combine the n-th items of several publishers into one item.

Each source is prefetched into a bounded queue (replenished in batches); one drain loop emits
a combined item whenever every queue has one and the downstream has demand. The stream
completes as soon as any source has completed and its queue is empty, since no further
combination can be formed; the other sources are then cancelled.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..interfaces import Publisher, Subscriber, Subscription
from ..rules import (
    MAX_DEMAND,
    add_demand,
    check_subscriber,
    invalid_request,
)
from ..subscriptions import DISCARD, CoordinatingLoop, PrefetchingInner

DEFAULT_ZIP_PREFETCH = 128


class _ZipCoordinator(CoordinatingLoop, Subscription):
    __slots__ = (
        "_combine",
        "cancelled",
        "downstream",
        "inners",
        "limit",
        "prefetch",
        "requested",
    )

    def __init__(self, downstream: Subscriber[Any], combine: Callable[..., Any], count: int, prefetch: int) -> None:
        self.downstream = downstream
        self._combine = combine
        self.prefetch = prefetch
        self.limit = prefetch - (prefetch >> 2)
        self.inners = [PrefetchingInner(self) for _ in range(count)]
        self.requested = 0
        self.cancelled = False
        self._error: BaseException | None = None
        self._draining = False
        self._missed = False

    def request(self, n: int) -> None:
        if self.cancelled:
            return
        if n <= 0:
            self.inner_error(invalid_request(n))  # rule 3.9
            return
        self.requested = add_demand(self.requested, n)
        self.drain()

    def cancel(self) -> None:
        if not self.cancelled:
            self.cancelled = True
            self.downstream = DISCARD  # rule 3.13
            self._cancel_all()

    def _cancel_all(self) -> None:
        for inner in self.inners:
            inner.cancel()

    def _terminate(self, error: BaseException | None) -> None:
        self.cancelled = True
        self._cancel_all()
        downstream, self.downstream = self.downstream, DISCARD
        if error is None:
            downstream.on_complete()
        else:
            downstream.on_error(error)

    def _drain_step(self) -> bool:
        if self.cancelled:
            return True
        if self._error is not None:
            self._terminate(self._error)
            return True
        inners = self.inners
        while self.requested and all(inner.queue for inner in inners):
            values = [inner.queue.popleft() for inner in inners]
            try:
                combined = self._combine(*values)
            except Exception as error:
                self._terminate(error)
                return True
            if combined is None:
                self._terminate(TypeError("rule 2.13: the zip function returned None"))
                return True
            if self.requested != MAX_DEMAND:
                self.requested -= 1
            self.downstream.on_next(combined)
            if self.cancelled or self._error is not None:
                return self.cancelled
            for inner in inners:
                inner.taken(1)
        if any(inner.done and not inner.queue for inner in inners):
            self._terminate(None)  # no further combination can be formed
            return True
        return False


class ZipPublisher(Publisher[Any]):
    __slots__ = ("_combine", "_prefetch", "_sources")

    def __init__(self, sources: tuple[Publisher[Any], ...], combine: Callable[..., Any], prefetch: int) -> None:
        self._sources = sources
        self._combine = combine
        self._prefetch = prefetch

    def subscribe(self, subscriber: Subscriber[Any]) -> None:
        check_subscriber(subscriber)
        coordinator = _ZipCoordinator(subscriber, self._combine, len(self._sources), self._prefetch)
        subscriber.on_subscribe(coordinator)
        for index, source in enumerate(self._sources):
            if coordinator.cancelled:
                break
            source.subscribe(coordinator.inners[index])


def _as_tuple(*values: Any) -> tuple[Any, ...]:
    return values


def zip(
    *sources: Publisher[Any],
    combine: Callable[..., Any] = _as_tuple,
    prefetch: int = DEFAULT_ZIP_PREFETCH,
) -> Publisher[Any]:
    """Emit ``combine(a, b, ...)`` of the n-th item of every source (default: a tuple)."""
    if not sources:
        raise ValueError("zip() needs at least one source")
    return ZipPublisher(sources, combine, prefetch)
