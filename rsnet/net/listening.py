"""Accepting connections within a bound on the sockets held, whatever peers do: the accept
loop of the server's listeners and of the broker's HTTP endpoint.

Each accepted socket is a file descriptor until its handler returns. The loop takes one of
``slots`` before it accepts, so at the bound further connections wait in the listen backlog,
in the kernel, not in the process; and when accepting fails (``EMFILE``: the process is out
of descriptors) it backs off for :data:`ACCEPT_BACKOFF` instead of spinning, with a line in a
rate-limited log. (``trio.serve_tcp`` accepts without a bound, and logs a traceback at each
``EMFILE`` retry.)
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import trio

from .failures import RateLimitedLog

ACCEPT_BACKOFF = 0.1
"""Seconds the loop waits after a failed accept before it tries again."""


async def accept_within(
    listener: trio.SocketListener,
    slots: trio.Semaphore,
    handle: Callable[[trio.SocketStream], Awaitable[object]],
    connections: trio.Nursery,
    log: RateLimitedLog,
) -> None:
    """Accept connections on ``listener`` for ever, each served by ``handle(stream)`` in a task
    of ``connections`` that holds one of ``slots`` until ``handle`` returns. ``handle`` owns
    the stream (it closes it) and must not raise but to end the task."""
    while True:
        await slots.acquire()  # at the bound, connections wait in the listen backlog
        try:
            stream = await listener.accept()
        except BaseException as error:
            slots.release()
            if not isinstance(error, OSError):
                raise
            log.log(logging.WARNING, "accept failed: %s", error)
            await trio.sleep(ACCEPT_BACKOFF)
            continue
        connections.start_soon(_holding, slots, handle, stream)


async def _holding(
    slots: trio.Semaphore, handle: Callable[[trio.SocketStream], Awaitable[object]], stream: trio.SocketStream
) -> None:
    try:
        await handle(stream)
    finally:
        slots.release()
