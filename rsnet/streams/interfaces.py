"""The four Reactive Streams interfaces (specification sections 1-4), in Python.

Every method here is synchronous and non-obstructing, as the specification requires: a
``request`` or ``on_next`` never awaits and never blocks. In rsnet they are called on the trio
thread that owns the stream; from any other thread use :mod:`rsnet.streams.threads`.

Items are any Python value except ``None``: rule 2.13 forbids null elements, so ``None`` can
always mean "no item" inside operators and on the wire.

This module imports nothing but the standard library.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from typing import Any, Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")


class Subscription(abc.ABC):
    """The one-to-one lifecycle of a Subscriber subscribed to a Publisher (section 3).

    Optional fast path, synchronous fusion (RxJava's SYNC fusion mode): the subscription of a
    source whose items are at hand may also define ``poll_sync(n)``, which a subscriber that
    takes items itself calls instead of ``request(n)``. It returns ``(items, end)``: up to
    ``n`` items, in order, that count as requested and delivered (rule 1.1: never more than
    ``n``); ``end`` is False while the source may have more (then there are exactly ``n``),
    True once it completed after them, or the exception it failed with. After an end no
    signal follows (rule 1.6: the caller completes or fails its own subscriber) and the
    subscription has let go of the subscriber (rule 3.13). ``([], False)`` means it cannot
    be polled now: request instead. rsnet's iterable sources define it, and the network
    session calls it (found by that name) as a stream opens with demand.
    """

    __slots__ = ()

    @abc.abstractmethod
    def request(self, n: int) -> None:
        """Add ``n`` to the outstanding demand (rule 3.8).

        ``n <= 0`` is answered with ``on_error(ValueError)`` (rule 3.9), never raised.
        Demand saturates at 2**63-1, which means "unbounded" (rule 3.17).
        After ``cancel`` this is a no-op (rule 3.6).
        """

    @abc.abstractmethod
    def cancel(self) -> None:
        """Ask the publisher to stop signalling and drop its reference to the subscriber.

        Idempotent (rule 3.7), returns normally (rule 3.15); signals may still arrive for a
        while (rule 2.8), but eventually stop (rule 3.12).
        """


class Subscriber(abc.ABC, Generic[T]):
    """Receives the signals of one subscription (section 2).

    Signal order: ``on_subscribe`` exactly once and first (rule 1.9), then at most as many
    ``on_next`` as requested (rule 1.1), then at most one of ``on_error`` / ``on_complete``
    (rule 1.7). A ``None`` argument raises ``TypeError`` (rule 2.13).

    Optional fast path: a subscriber may also define ``on_next_many(items)``, a list of items
    with exactly the meaning of ``on_next`` called for each, in order. rsnet's iterable
    sources and network session call it when present (found by that name) to hand over a
    run of items in one call; everything else keeps calling ``on_next``.
    """

    __slots__ = ()

    @abc.abstractmethod
    def on_subscribe(self, subscription: Subscription) -> None: ...

    @abc.abstractmethod
    def on_next(self, item: T) -> None: ...

    @abc.abstractmethod
    def on_error(self, error: BaseException) -> None: ...

    @abc.abstractmethod
    def on_complete(self) -> None: ...


class Publisher(abc.ABC, Generic[T]):
    """A provider of a potentially unbounded number of sequenced items (section 1)."""

    __slots__ = ()

    @abc.abstractmethod
    def subscribe(self, subscriber: Subscriber[T]) -> None:
        """Start a subscription for ``subscriber``.

        Raises ``TypeError`` for ``None`` (rule 1.9); every other failure is signalled as
        ``on_subscribe`` followed by ``on_error``.
        """

    def pipe(self, *operators: Callable[[Publisher[Any]], Publisher[Any]]) -> Publisher[Any]:
        """Apply operators left to right: ``source.pipe(ops.map(f), ops.take(3))``."""
        result: Publisher[Any] = self
        for operator in operators:
            result = operator(result)
        return result


class Processor(Subscriber[T], Publisher[R]):
    """A processing stage: a Subscriber and a Publisher obeying both contracts (section 4)."""

    __slots__ = ()
