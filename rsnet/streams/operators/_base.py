"""What every operator module shares: turning a Subscriber class into a Publisher stage."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..interfaces import Publisher, Subscriber
from ..rules import check_subscriber

Operator = Callable[[Publisher[Any]], Publisher[Any]]


class StagePublisher(Publisher[Any]):
    """Subscribes ``make_subscriber(downstream)`` to ``source`` for each downstream subscriber."""

    __slots__ = ("_make_subscriber", "_source")

    def __init__(
        self,
        source: Publisher[Any],
        make_subscriber: Callable[[Subscriber[Any]], Subscriber[Any]],
    ) -> None:
        self._source = source
        self._make_subscriber = make_subscriber

    def subscribe(self, subscriber: Subscriber[Any]) -> None:
        check_subscriber(subscriber)
        self._source.subscribe(self._make_subscriber(subscriber))


def stage(make_subscriber: Callable[[Subscriber[Any]], Subscriber[Any]]) -> Operator:
    """An operator that wraps each downstream subscriber with ``make_subscriber``."""
    return lambda source: StagePublisher(source, make_subscriber)
