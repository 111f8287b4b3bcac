"""The streams core: Reactive Streams in Python on trio.

Layering: this package imports only the standard library and trio. Everything networked
(``rsnet.protocol``, the transports, server and client) builds on it, never the reverse.
"""

from . import operators as ops
from .async_sources import ProducerCancelledError, from_async_iterable, from_channel
from .interfaces import Processor, Publisher, Subscriber, Subscription
from .iterate import iterate
from .processors import MulticastProcessor, ProcessorCancelledError
from .rules import (
    MAX_DEMAND,
    MissingBackpressureError,
    report_undeliverable,
    set_undeliverable_handler,
)
from .sources import defer, empty, error, from_iterable, just, range_
from .threads import ThreadSafeSubscription, blocking_iterate, subscribe_from_thread

__all__ = [
    "MAX_DEMAND",
    "MissingBackpressureError",
    "MulticastProcessor",
    "Processor",
    "ProcessorCancelledError",
    "ProducerCancelledError",
    "Publisher",
    "Subscriber",
    "Subscription",
    "ThreadSafeSubscription",
    "blocking_iterate",
    "defer",
    "empty",
    "error",
    "from_async_iterable",
    "from_channel",
    "from_iterable",
    "iterate",
    "just",
    "ops",
    "range_",
    "report_undeliverable",
    "set_undeliverable_handler",
    "subscribe_from_thread",
]
