"""Operators that combine items: scan, reduce, buffer."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..interfaces import Subscriber, Subscription
from ..rules import MAX_DEMAND, check_signal_argument, invalid_request
from ..subscriptions import DISCARD, ForwardingSubscriber
from ._base import Operator, stage

_NO_VALUE: Any = object()


class _ScanSubscriber(ForwardingSubscriber):
    __slots__ = ("_accumulator", "_state")

    def __init__(self, downstream: Subscriber[Any], accumulator: Callable[[Any, Any], Any], seed: Any) -> None:
        super().__init__(downstream)
        self._accumulator = accumulator
        self._state = seed

    def on_next(self, item: Any) -> None:
        check_signal_argument(item, "on_next")
        if self.done:
            return
        if self._state is _NO_VALUE:
            self._state = item
        else:
            try:
                state = self._accumulator(self._state, item)
            except Exception as error:
                self.fail(error)
                return
            if state is None:
                self.fail(TypeError("rule 2.13: the scan accumulator returned None"))
                return
            self._state = state
        self.downstream.on_next(self._state)


def scan(accumulator: Callable[[Any, Any], Any], seed: Any = _NO_VALUE) -> Operator:
    """Emit the running ``accumulator(state, item)`` after each item, one out per item in.

    Without ``seed`` the first item is the first state. Unlike RxJava's ``scan(seed, f)``
    the seed itself is not emitted, so demand maps one to one, as in
    ``itertools.accumulate``.
    """
    return stage(lambda downstream: _ScanSubscriber(downstream, accumulator, seed))


class _ReduceSubscriber(ForwardingSubscriber):
    """Consumes the whole upstream, then emits one value once downstream has asked for it."""

    __slots__ = ("_accumulator", "_finished", "_state", "_wanted")

    def __init__(self, downstream: Subscriber[Any], accumulator: Callable[[Any, Any], Any], seed: Any) -> None:
        super().__init__(downstream)
        self._accumulator = accumulator
        self._state = seed
        self._wanted = False
        self._finished = False

    def on_subscribe(self, subscription: Subscription) -> None:
        super().on_subscribe(subscription)
        subscription.request(MAX_DEMAND)  # one value out needs every value in

    def on_next(self, item: Any) -> None:
        check_signal_argument(item, "on_next")
        if self.done:
            return
        if self._state is _NO_VALUE:
            self._state = item
            return
        try:
            state = self._accumulator(self._state, item)
        except Exception as error:
            self.fail(error)
            return
        if state is None:
            self.fail(TypeError("rule 2.13: the reduce accumulator returned None"))
            return
        self._state = state

    def on_complete(self) -> None:
        if self.done or self._finished:
            return
        if self._state is _NO_VALUE:
            super().on_complete()  # nothing to reduce: complete empty
            return
        self._finished = True
        if self._wanted:
            self._emit()

    def request(self, n: int) -> None:
        if self.done:
            return
        if n <= 0:
            self.upstream.cancel()  # type: ignore[union-attr]  # set by on_subscribe first
            self.on_error(invalid_request(n))  # rule 3.9
            return
        self._wanted = True
        if self._finished:
            self._emit()

    def cancel(self) -> None:
        self._state = _NO_VALUE
        super().cancel()

    def _emit(self) -> None:
        self.done = True
        downstream, self.downstream = self.downstream, DISCARD
        value, self._state = self._state, _NO_VALUE
        downstream.on_next(value)
        downstream.on_complete()


def reduce(accumulator: Callable[[Any, Any], Any], seed: Any = _NO_VALUE) -> Operator:
    """Emit ``accumulator`` folded over all items, once upstream completes.

    Without ``seed`` an empty upstream completes empty; with it, the seed is the result.
    """
    return stage(lambda downstream: _ReduceSubscriber(downstream, accumulator, seed))


class _BufferSubscriber(ForwardingSubscriber):
    __slots__ = ("_buffer", "_count")

    def __init__(self, downstream: Subscriber[Any], count: int) -> None:
        super().__init__(downstream)
        self._count = count
        self._buffer: list[Any] = []

    def on_next(self, item: Any) -> None:
        check_signal_argument(item, "on_next")
        if self.done:
            return
        buffer = self._buffer
        buffer.append(item)
        if len(buffer) == self._count:
            self._buffer = []
            self.downstream.on_next(buffer)

    def on_complete(self) -> None:
        # A partial last buffer always has demand: upstream stopped short of the
        # count * n items that n requested buffers asked for.
        buffer, self._buffer = self._buffer, []
        if buffer and not self.done:
            self.downstream.on_next(buffer)
        super().on_complete()

    def on_error(self, error: BaseException) -> None:
        self._buffer = []
        super().on_error(error)

    def request(self, n: int) -> None:
        # n buffers need n * count items; saturates like any demand (rule 3.17).
        self.upstream.request(n if n <= 0 else min(n * self._count, MAX_DEMAND))  # type: ignore[union-attr]  # set by on_subscribe first


def buffer(count: int) -> Operator:
    """Emit lists of ``count`` consecutive items; the last list may be shorter."""
    if count < 1:
        raise ValueError(f"buffer() needs a count >= 1, got {count}")
    return stage(lambda downstream: _BufferSubscriber(downstream, count))
