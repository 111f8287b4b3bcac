"""Demand arithmetic and the checks every stage shares, each tied to its specification rule.

Python integers never overflow, so the saturation the specification asks for (rule 3.17) is
explicit here: demand is clamped at ``MAX_DEMAND`` (2**63-1), which means "unbounded" and is
never decremented again.

Errors that cannot be signalled to anyone (a second terminal signal, a subscriber raising from
``on_next``) go to :func:`report_undeliverable`, as RxJava's ``RxJavaPlugins.onError`` does.

This module imports nothing but the standard library.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # for annotations only: at run time this module needs no other
    from .interfaces import Subscription

MAX_DEMAND = 2**63 - 1
"""Demand at or above this is unbounded (rule 3.17)."""

_log = logging.getLogger("rsnet.streams")


def add_demand(current: int, n: int) -> int:
    """Saturating addition of demand: capped at ``MAX_DEMAND`` (rule 3.17)."""
    total = current + n
    return MAX_DEMAND if total >= MAX_DEMAND else total


class MissingBackpressureError(RuntimeError):
    """A publisher signalled more ``on_next`` than was requested (rule 1.1)."""


def invalid_request(n: int) -> ValueError:
    """The error a subscription signals for ``request(n)`` with ``n <= 0`` (rule 3.9)."""
    return ValueError(f"rule 3.9: non-positive subscription request: request({n})")


def check_subscriber(subscriber: Any) -> None:
    """``subscribe(None)`` must raise synchronously (rule 1.9)."""
    if subscriber is None:
        raise TypeError("rule 1.9: subscribe() requires a Subscriber, got None")


def check_signal_argument(value: Any, signal: str) -> None:
    """A ``None`` subscription, item or error must raise (rule 2.13)."""
    if value is None:
        raise TypeError(f"rule 2.13: {signal}(None) is not allowed")


def validate_subscription(current: Subscription | None, new: Subscription, *, wanted: bool = True) -> bool:
    """Whether a subscriber that holds ``current`` may keep ``new``, given to its ``on_subscribe``.

    Every ``on_subscribe`` starts with it (RxJava's ``SubscriptionHelper.validate``):

        if not validate_subscription(self.upstream, subscription):
            return
        self.upstream = subscription

    Raises ``TypeError`` for a ``None`` subscription (rule 2.13). A subscriber that already has
    a subscription (``current`` is not None) cancels the new one and answers False (rule 2.5);
    so does one that no longer wants any (``wanted`` false: its stream already ended or its
    downstream cancelled), since nobody would ever request from or cancel it otherwise.
    """
    check_signal_argument(new, "on_subscribe")
    if current is not None or not wanted:
        new.cancel()
        return False
    return True


_undeliverable_handler: Callable[[BaseException], None] | None = None


def report_undeliverable(error: BaseException) -> None:
    """Report an error that the Reactive Streams rules forbid delivering to a subscriber.

    Examples: ``on_error`` after the stream already terminated (rule 1.7), or an exception a
    subscriber raised from a signal method (rule 2.13). The default handler logs it at ERROR
    level on the ``rsnet.streams`` logger; :func:`set_undeliverable_handler` replaces it.
    """
    handler = _undeliverable_handler
    if handler is None:
        _log.error("undeliverable error", exc_info=error)
    else:
        handler(error)


def set_undeliverable_handler(
    handler: Callable[[BaseException], None] | None,
) -> Callable[[BaseException], None] | None:
    """Install ``handler`` for undeliverable errors (``None`` restores logging); returns the old one."""
    global _undeliverable_handler
    previous, _undeliverable_handler = _undeliverable_handler, handler
    return previous
