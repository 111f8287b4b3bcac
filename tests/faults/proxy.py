"""A fault-injecting TCP proxy on 127.0.0.1, for tests that need a bad network between real peers.

    async with FaultyProxy(upstream_port) as proxy:      # clients dial proxy.url
        proxy.latency = 0.005                            # each forwarded chunk waits this long
        proxy.reset_after_bytes = 40_000                 # each connection is reset (RST) mid-stream
        proxy.partition()                                # nothing crosses, either way, until heal()
        proxy.heal()

Bytes are forwarded as they are read, so a reset can land in the middle of a frame. A partition
stops forwarding in both directions without closing anything, as a cable pulled out would: the
peers see silence, and what was sent meanwhile is delivered when the partition heals (TCP
retransmits), unless a peer gave up first. Everything runs in the proxy's own nursery.
"""

from __future__ import annotations

import functools
import socket
import struct
from types import TracebackType

import trio

CHUNK = 16384


class FaultyProxy:
    def __init__(self, upstream_port: int) -> None:
        self._upstream_port = upstream_port
        self.latency = 0.0
        self.reset_after_bytes: int | None = None
        self.connections = 0
        self.resets = 0
        self._healed = trio.Event()
        self._healed.set()
        self._nursery: trio.Nursery | None = None
        self._pairs: set[trio.CancelScope] = set()
        self.port = 0

    @property
    def url(self) -> str:
        return f"tcp://127.0.0.1:{self.port}"

    def partition(self) -> None:
        self._healed = trio.Event()

    def heal(self) -> None:
        self._healed.set()

    def reset_all(self) -> None:
        """Reset every connection through the proxy now (new ones are accepted as usual)."""
        for scope in list(self._pairs):
            self.resets += 1
            scope.cancel()

    async def __aenter__(self) -> FaultyProxy:
        self._manager = trio.open_nursery()
        self._nursery = await self._manager.__aenter__()
        listeners = await self._nursery.start(functools.partial(trio.serve_tcp, self._accepted, 0, host="127.0.0.1"))
        self.port = listeners[0].socket.getsockname()[1]
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> bool | None:
        assert self._nursery is not None
        self._nursery.cancel_scope.cancel()
        return await self._manager.__aexit__(kind, error, trace)

    async def _accepted(self, downstream: trio.SocketStream) -> None:
        self.connections += 1
        try:
            upstream = await trio.open_tcp_stream("127.0.0.1", self._upstream_port)
        except OSError:
            await _reset(downstream)
            return
        budget = [self.reset_after_bytes]  # shared by both directions of this connection
        async with trio.open_nursery() as pair:
            self._pairs.add(pair.cancel_scope)
            pair.start_soon(self._pump, downstream, upstream, budget, pair.cancel_scope)
            pair.start_soon(self._pump, upstream, downstream, budget, pair.cancel_scope)
        self._pairs.discard(pair.cancel_scope)
        await _reset(downstream)
        await _reset(upstream)

    async def _pump(
        self, source: trio.SocketStream, sink: trio.SocketStream, budget: list[int | None], pair: trio.CancelScope
    ) -> None:
        try:
            while True:
                await self._healed.wait()
                data = await source.receive_some(CHUNK)
                if not data:
                    break
                await self._healed.wait()  # read during a partition: held until it heals
                if self.latency:
                    await trio.sleep(self.latency)
                left = budget[0]
                if left is not None and len(data) >= left:
                    if left:
                        await sink.send_all(data[:left])  # the reset lands inside whatever this was
                    self.resets += 1
                    break
                if left is not None:
                    budget[0] = left - len(data)
                await sink.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        pair.cancel()


async def _reset(stream: trio.SocketStream) -> None:
    """Close with an RST, not a FIN: linger on, timeout 0."""
    try:
        stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    await trio.aclose_forcefully(stream)
