"""A blocking rsnet client, for scripts and for frameworks that are not async (Spark workers).

    with rsnet.sync.connect("tcp://127.0.0.1:7600", token=...) as client:
        for item in client.subscribe("range", {"start": 0, "count": 10}):
            ...
        client.offer("uploads", rows)   # sent as fast as the server's demand allows

It drives the same sans-I/O protocol (:mod:`rsnet.protocol`) as the trio client, over a plain
blocking socket in the calling thread: no event loop, no background thread, so the connection
is read only while a call waits; a consumer holding one item for longer than three of the
server's keepalive intervals is dropped (``ConnectionLost``, TIMEOUT, on its next call). Errors are those
of :mod:`rsnet.errors`: :class:`~rsnet.errors.StreamError` and
:class:`~rsnet.errors.ConnectionLost`.

This package must never import trio or asyncio (a test checks it): a Spark executor's worker
pulls a plain iterator, and an event loop cannot be yielded out of.
"""

from .client import BlockingClient, connect

__all__ = ["BlockingClient", "connect"]
