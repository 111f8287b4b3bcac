"""Backpressure strategies for a source that cannot slow down.

``on_backpressure_buffer``, ``on_backpressure_drop`` and ``on_backpressure_latest`` request
everything from upstream and decide, when the downstream has no demand, what to do with the
surplus: keep it in a bounded buffer (and fail, drop the oldest or drop the newest when the
buffer is full), drop it, or keep only the newest. They are one mechanism with three
settings: a queue of ``maxsize`` items and an overflow policy.

Upstream's terminal signal is delivered after the items already buffered, so accepted items
are not lost; an overflow under ``"error"`` fails the stream at once.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any, Literal

from ..interfaces import Subscriber, Subscription
from ..rules import (
    MAX_DEMAND,
    MissingBackpressureError,
    add_demand,
    check_signal_argument,
    invalid_request,
    report_undeliverable,
    validate_subscription,
)
from ..subscriptions import DISCARD, DrainLoop
from ._base import Operator, stage

Overflow = Literal["error", "drop_oldest", "drop_latest"]


class BufferOverflowError(MissingBackpressureError):
    """``on_backpressure_buffer(overflow="error")`` ran out of room."""


class _BackpressureSubscriber(DrainLoop, Subscriber[Any], Subscription):
    __slots__ = (
        "_done",
        "_error",
        "_maxsize",
        "_on_drop",
        "_overflow",
        "_queue",
        "cancelled",
        "downstream",
        "requested",
        "upstream",
    )

    def __init__(
        self,
        downstream: Subscriber[Any],
        maxsize: int,
        overflow: Overflow,
        on_drop: Callable[[Any], None] | None,
    ) -> None:
        self.downstream = downstream
        self.upstream: Subscription | None = None
        self._maxsize = maxsize
        self._overflow = overflow
        self._on_drop = on_drop
        self._queue: deque[Any] = deque()
        self.requested = 0
        self.cancelled = False
        self._done = False  # upstream terminated; _error says how
        self._error: BaseException | None = None
        self._draining = False
        self._missed = False

    def on_subscribe(self, subscription: Subscription) -> None:
        if not validate_subscription(self.upstream, subscription):
            return
        self.upstream = subscription
        self.downstream.on_subscribe(self)
        if not self.cancelled:
            subscription.request(MAX_DEMAND)

    def on_next(self, item: Any) -> None:
        check_signal_argument(item, "on_next")
        if self._done or self.cancelled:
            return
        queue = self._queue
        if self.requested and not queue and not self._draining:
            # fast path: demand is waiting and nothing is queued ahead of this item; marked
            # as draining so a request() from inside on_next cannot signal on this stack
            if self.requested != MAX_DEMAND:
                self.requested -= 1
            self._draining = True
            try:
                self.downstream.on_next(item)
            finally:
                self._draining = False
            if self._missed:
                self.drain()
            return
        if len(queue) >= self._maxsize:
            if self._overflow == "error":
                self.upstream.cancel()  # type: ignore[union-attr]  # set by on_subscribe first
                self._fail_now(BufferOverflowError(f"buffer of {self._maxsize} items overflowed"))
                return
            if self._overflow == "drop_oldest" and queue:
                self._dropped(queue.popleft())
            else:
                self._dropped(item)
                return
        queue.append(item)
        self.drain()

    def on_error(self, error: BaseException) -> None:
        check_signal_argument(error, "on_error")
        if self._done:
            report_undeliverable(error)
            return
        self._done = True
        self._error = error
        self.drain()

    def on_complete(self) -> None:
        if not self._done:
            self._done = True
            self.drain()

    def request(self, n: int) -> None:
        if self.cancelled:
            return
        if n <= 0:
            self.upstream.cancel()  # type: ignore[union-attr]  # set by on_subscribe first
            self._fail_now(invalid_request(n))  # rule 3.9
            return
        self.requested = add_demand(self.requested, n)
        self.drain()

    def cancel(self) -> None:
        if not self.cancelled:
            self.cancelled = True
            self.downstream = DISCARD  # rule 3.13
            self._queue.clear()
            self.upstream.cancel()  # type: ignore[union-attr]  # set by on_subscribe first

    def _dropped(self, item: Any) -> None:
        if self._on_drop is not None:
            try:
                self._on_drop(item)
            except Exception as error:
                report_undeliverable(error)

    def _fail_now(self, error: BaseException) -> None:
        """Fail ahead of anything buffered; delivered by the drain loop (rule 1.3)."""
        self._queue.clear()
        self._done = True
        self._error = error
        self.drain()

    def _drain_step(self) -> bool:
        queue = self._queue
        while queue and self.requested and not self.cancelled:
            if self.requested != MAX_DEMAND:
                self.requested -= 1
            self.downstream.on_next(queue.popleft())
        if self.cancelled:
            return True
        if self._done and not queue:
            self.cancelled = True
            downstream, self.downstream = self.downstream, DISCARD
            if self._error is None:
                downstream.on_complete()
            else:
                downstream.on_error(self._error)
            return True
        return False


def on_backpressure_buffer(
    maxsize: int,
    overflow: Overflow = "error",
    *,
    on_drop: Callable[[Any], None] | None = None,
) -> Operator:
    """Buffer up to ``maxsize`` items the downstream has not requested yet.

    When full: ``"error"`` cancels upstream and signals :class:`BufferOverflowError`;
    ``"drop_oldest"`` evicts the oldest buffered item; ``"drop_latest"`` drops the new one.
    ``on_drop(item)`` is called for each dropped item.
    """
    if maxsize < 1:
        raise ValueError(f"on_backpressure_buffer() needs maxsize >= 1, got {maxsize}")
    if overflow not in ("error", "drop_oldest", "drop_latest"):
        raise ValueError(f"unknown overflow policy {overflow!r}")
    return stage(lambda downstream: _BackpressureSubscriber(downstream, maxsize, overflow, on_drop))


def on_backpressure_drop(on_drop: Callable[[Any], None] | None = None) -> Operator:
    """Drop every item that arrives while the downstream has no demand."""
    return stage(lambda downstream: _BackpressureSubscriber(downstream, 0, "drop_latest", on_drop))


def on_backpressure_latest(on_drop: Callable[[Any], None] | None = None) -> Operator:
    """Keep only the newest item that arrived while the downstream had no demand."""
    return stage(lambda downstream: _BackpressureSubscriber(downstream, 1, "drop_oldest", on_drop))
