"""Operators that look at one item at a time: map, filter, distinct_until_changed.

An item that filter or distinct_until_changed drops was paid for by downstream demand, so
each drop requests one replacement from upstream (rule 1.1 still holds downstream).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..interfaces import Subscriber
from ..rules import check_signal_argument
from ..subscriptions import ForwardingSubscriber
from ._base import Operator, stage


class _MapSubscriber(ForwardingSubscriber):
    __slots__ = ("_fn",)

    def __init__(self, downstream: Subscriber[Any], fn: Callable[[Any], Any]) -> None:
        super().__init__(downstream)
        self._fn = fn

    def on_next(self, item: Any) -> None:
        check_signal_argument(item, "on_next")
        if self.done:
            return
        try:
            result = self._fn(item)
        except Exception as error:
            self.fail(error)
            return
        if result is None:
            self.fail(TypeError("rule 2.13: the map function returned None"))
            return
        self.downstream.on_next(result)


def map(fn: Callable[[Any], Any]) -> Operator:
    """Emit ``fn(item)`` for each item; an exception from ``fn`` becomes on_error."""
    return stage(lambda downstream: _MapSubscriber(downstream, fn))


class _FilterSubscriber(ForwardingSubscriber):
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
            self.upstream.request(1)  # type: ignore[union-attr]  # set by on_subscribe first


def filter(predicate: Callable[[Any], bool]) -> Operator:
    """Emit only the items for which ``predicate(item)`` is true."""
    return stage(lambda downstream: _FilterSubscriber(downstream, predicate))


_NOTHING = object()


class _DistinctUntilChangedSubscriber(ForwardingSubscriber):
    __slots__ = ("_key", "_last")

    def __init__(self, downstream: Subscriber[Any], key: Callable[[Any], Any] | None) -> None:
        super().__init__(downstream)
        self._key = key
        self._last: Any = _NOTHING

    def on_next(self, item: Any) -> None:
        check_signal_argument(item, "on_next")
        if self.done:
            return
        try:
            key = item if self._key is None else self._key(item)
            same = key == self._last
        except Exception as error:
            self.fail(error)
            return
        self._last = key
        if same:
            self.upstream.request(1)  # type: ignore[union-attr]  # set by on_subscribe first
        else:
            self.downstream.on_next(item)


def distinct_until_changed(key: Callable[[Any], Any] | None = None) -> Operator:
    """Drop an item whose ``key(item)`` (default: the item) equals the previous item's."""
    return stage(lambda downstream: _DistinctUntilChangedSubscriber(downstream, key))
