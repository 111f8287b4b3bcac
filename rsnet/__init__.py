"""rsnet: Reactive Streams across the network, on trio.

The streams core is re-exported here (``rsnet.from_iterable(...)``, ``rsnet.iterate(...)``,
``rsnet.ops.map(...)``), and the network entry points: ``rsnet.connect``, ``rsnet.Server``.
The re-exports load on first use, so ``import rsnet.protocol`` alone stays free of trio (the
sans-I/O protocol must not depend on an event loop).
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "connect": "rsnet.net.client",
    "Client": "rsnet.net.client",
    "Server": "rsnet.net.server",
    "StreamContext": "rsnet.net.session",
    "RemotePublisher": "rsnet.net.session",
    "ConnectionLost": "rsnet.errors",
    "StreamError": "rsnet.errors",
    "HandshakeError": "rsnet.errors",
    "TransportClosed": "rsnet.errors",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        streams = importlib.import_module("rsnet.streams")
        if name in streams.__all__:
            return getattr(streams, name)
        raise AttributeError(f"module 'rsnet' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    streams = importlib.import_module("rsnet.streams")
    return sorted({*globals(), *_EXPORTS, *streams.__all__})
