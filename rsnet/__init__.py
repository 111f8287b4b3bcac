"""rsnet: Reactive Streams across the network, on trio.

The public API, all importable from here:

- the streams core: ``rsnet.Publisher`` and the other interfaces, sources
  (``rsnet.from_iterable(...)``, ``rsnet.range_``...), ``rsnet.iterate(...)``, operators
  (``rsnet.ops.map(...)``), ``MulticastProcessor``, the thread bridges;
- the network: ``rsnet.connect`` (a :class:`Client`), ``rsnet.Server`` with the
  :class:`StreamContext` its publishers get, ``RemotePublisher``, and the :class:`Host`
  protocol a custom registry implements;
- the errors, one tree under :class:`RsnetError` (see :mod:`rsnet.errors`).

The blocking client is ``rsnet.sync``; the broker's client helpers are ``rsnet.broker.client``.
The names load on first use, so ``import rsnet.protocol`` or ``import rsnet.sync`` alone stays
free of trio; type checkers and IDEs see them through the ``TYPE_CHECKING`` imports below.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from .errors import (
        ConnectionLost,
        HandshakeError,
        ProtocolError,
        RsnetError,
        StreamError,
        TransportClosed,
    )
    from .net.client import Client, connect
    from .net.server import Server
    from .net.session import Host, RemotePublisher, StreamContext
    from .streams import (
        MAX_DEMAND,
        MissingBackpressureError,
        MulticastProcessor,
        Processor,
        ProcessorCancelledError,
        ProducerCancelledError,
        Publisher,
        Subscriber,
        Subscription,
        ThreadSafeSubscription,
        blocking_iterate,
        defer,
        empty,
        error,
        from_async_iterable,
        from_channel,
        from_iterable,
        iterate,
        just,
        ops,
        range_,
        report_undeliverable,
        set_undeliverable_handler,
        subscribe_from_thread,
    )

_NETWORK = {
    "connect": "rsnet.net.client",
    "Client": "rsnet.net.client",
    "Server": "rsnet.net.server",
    "Host": "rsnet.net.session",
    "StreamContext": "rsnet.net.session",
    "RemotePublisher": "rsnet.net.session",
    "RsnetError": "rsnet.errors",
    "StreamError": "rsnet.errors",
    "ConnectionLost": "rsnet.errors",
    "HandshakeError": "rsnet.errors",
    "TransportClosed": "rsnet.errors",
    "ProtocolError": "rsnet.errors",
}

__all__ = [
    "MAX_DEMAND",
    "Client",
    "ConnectionLost",
    "HandshakeError",
    "Host",
    "MissingBackpressureError",
    "MulticastProcessor",
    "Processor",
    "ProcessorCancelledError",
    "ProducerCancelledError",
    "ProtocolError",
    "Publisher",
    "RemotePublisher",
    "RsnetError",
    "Server",
    "StreamContext",
    "StreamError",
    "Subscriber",
    "Subscription",
    "ThreadSafeSubscription",
    "TransportClosed",
    "blocking_iterate",
    "connect",
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


def __getattr__(name: str) -> Any:
    module = _NETWORK.get(name) or ("rsnet.streams" if name in __all__ else None)
    if module is None:
        raise AttributeError(f"module 'rsnet' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # loaded once: later uses are plain attribute lookups, not an import call
    return value


def __dir__() -> list[str]:
    """The public names and rsnet's subpackages imported so far, not this module's own imports
    (``Any``, ``importlib``...)."""
    subpackages = {name for name, value in globals().items() if getattr(value, "__name__", "") == f"rsnet.{name}"}
    return sorted({*__all__, *subpackages})
