"""Accepting connections within a bound on the sockets held, whatever peers do: the accept
loop of the server's listeners and of the broker's HTTP endpoint.

Each accepted socket is a file descriptor until its handler returns. The loop takes one of
``slots`` before it accepts, so at the bound further connections wait in the listen backlog,
in the kernel, not in the process; and when accepting fails (``EMFILE``: the process is out
of descriptors) it backs off for :data:`ACCEPT_BACKOFF` instead of spinning, with a line in a
rate-limited log. (``trio.serve_tcp`` accepts without a bound, and logs a traceback at each
``EMFILE`` retry.)

Waiting in the backlog is not enough on its own: sockets that never send a byte would hold
every slot until their handlers' timeouts, and a newcomer would wait behind them, however
little it asks (a ``/health`` probe, a client's HELLO). So a loop given an :class:`Evictable`
accepts the next connection even when every slot is taken, and makes room for it by closing
the oldest connection that has not yet shown itself a client (the slowloris defence of
nginx's and HAProxy's "close the oldest idle connection"): holding the slots then takes an
attacker as many connections a second as there are slots, not one per slot per timeout.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import trio

from .failures import RateLimitedLog

ACCEPT_BACKOFF = 0.1
"""Seconds the loop waits after a failed accept before it tries again."""


class Evictable:
    """Connections that may be closed to make room for a new one when every slot is taken,
    oldest first: each is the task serving it, from :meth:`hold` until it calls :meth:`settle`
    (a server's connection once its handshake is done; the HTTP endpoint's connections when
    their handler ends).

    Evicting closes the connection's socket, which ends whatever its task waits for on it
    (``trio.ClosedResourceError``), shielded steps included (a WebSocket's lingering close
    after a violation, a second long, would otherwise hold its slot, and the accept loop with
    it). A handler that may also wait for something else (the HTTP endpoint, for a page being
    rendered) gives a cancel scope around that wait, which eviction cancels too; a server's
    handshake waits for nothing but its socket, so it needs none (a scope per connection was
    about 1% of the server's CPU for a short connection)."""

    def __init__(self) -> None:
        self._held: dict[trio.lowlevel.Task, tuple[trio.SocketStream, trio.CancelScope | None]] = {}  # oldest first

    def __len__(self) -> int:
        return len(self._held)

    def hold(self, stream: trio.SocketStream, scope: trio.CancelScope | None = None) -> None:
        """The current task's connection, on ``stream``, may be evicted until it settles
        (and ``scope``, if given, is then cancelled too)."""
        self._held[trio.lowlevel.current_task()] = (stream, scope)

    def settle(self) -> None:
        """The current task's connection is no longer evicted (it has shown itself a client,
        or its handler is done). Idempotent."""
        self._held.pop(trio.lowlevel.current_task(), None)

    def evict_oldest(self) -> bool:
        """Close the oldest connection's socket; False if there is none."""
        for task in self._held:
            stream, scope = self._held.pop(task)
            if scope is not None:
                scope.cancel()
            stream.socket.close()  # its waits end with ClosedResourceError
            return True
        return False


async def accept_within(
    listener: trio.SocketListener,
    slots: trio.Semaphore,
    handle: Callable[[trio.SocketStream], Awaitable[object]],
    connections: trio.Nursery,
    log: RateLimitedLog,
    evictable: Evictable | None = None,
) -> None:
    """Accept connections on ``listener`` for ever, each served by ``handle(stream)`` in a task
    of ``connections`` that holds one of ``slots`` until ``handle`` returns. ``handle`` owns
    the stream (it closes it) and must not raise but to end the task.

    With ``evictable``, a connection that comes when every slot is taken is accepted all the
    same, and the oldest evictable connection is closed to make room for it: the loop then holds
    one socket beyond ``slots`` until that connection's handler has returned its slot."""
    while True:
        making_room = evictable is not None and slots.value == 0 and len(evictable) > 0
        if not making_room:
            await slots.acquire()  # at the bound, connections wait in the listen backlog
        try:
            stream = await listener.accept()
        except BaseException as error:
            if not making_room:
                slots.release()
            if not isinstance(error, OSError):
                raise
            log.log(logging.WARNING, "accept failed: %s", error)
            await trio.sleep(ACCEPT_BACKOFF)
            continue
        if making_room:
            assert evictable is not None
            if slots.value == 0 and evictable.evict_oldest():
                log.log(logging.INFO, "every slot was taken: closed the oldest waiting connection to make room")
            try:
                await slots.acquire()
            except BaseException:
                stream.socket.close()
                raise
        connections.start_soon(_holding, slots, handle, stream)


async def _holding(
    slots: trio.Semaphore, handle: Callable[[trio.SocketStream], Awaitable[object]], stream: trio.SocketStream
) -> None:
    try:
        await handle(stream)
    finally:
        slots.release()
