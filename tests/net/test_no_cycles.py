"""A closed connection's objects are freed by reference counting alone, on both sides.

Python frees an object the moment its last reference goes, unless it is part of a reference
cycle: then only the cyclic garbage collector frees it, and a full collection (which walks
every live object, 10,000 connections' worth on a busy server) may be minutes away. So
per-connection objects must not form cycles, or every closed connection's protocol state and
buffers wait for such a collection (issue 13, target 4). These tests switch the collector off
and check that the sessions and protocol connections of closed connections are gone anyway.
"""

from __future__ import annotations

import socket
import struct
import weakref

import trio

import rsnet
from rsnet.protocol import MAX_INT, Connection, Role, State

from .support import demo_server, running

CONNECTIONS = 20


async def test_closed_connections_are_freed_without_the_garbage_collector(collector_off):
    """20 connections (TCP and WebSocket), each streams a few items and closes: afterwards no
    Session or protocol Connection of either side is alive, with the collector off."""
    server = demo_server()
    alive: list[tuple[str, weakref.ref[object]]] = []
    async with running(server) as urls:
        for i in range(CONNECTIONS):
            async with rsnet.connect(urls["tcp" if i % 2 else "ws"]) as client:
                items = [item async for item in client.subscribe("range", {"count": 5})]
                assert items == [0, 1, 2, 3, 4]
                (served,) = server.sessions
                ours = client._session
                alive += [
                    ("server session", weakref.ref(served)),
                    ("server connection", weakref.ref(served.conn)),
                    ("client session", weakref.ref(ours)),
                    ("client connection", weakref.ref(ours.conn)),
                ]
                del served, ours
            del client
        with trio.fail_after(10):
            while server.sessions:  # the server's handlers finish after the client closed
                await trio.sleep(0.01)
        await trio.sleep(0.05)  # their last steps (closing the sockets)
    left = [what for what, ref in alive if ref() is not None]
    assert len(alive) == 4 * CONNECTIONS
    assert not left, f"kept alive by a reference cycle: {len(left)} objects, e.g. {left[:4]}"


async def _subscribe_then_reset(port: int) -> None:
    """A peer that opens an endless stream with all the demand there is, reads a little of
    it, then resets the connection (RST, not FIN) while the server is still writing."""
    sock = trio.socket.socket()
    await sock.connect(("127.0.0.1", port))
    conn = Connection(Role.CLIENT)
    await sock.send(conn.data_to_send())
    while conn.state is not State.OPEN:
        conn.receive_data(await sock.recv(65536))
    conn.send_subscribe("range", {"count": 10**12}, initial_demand=MAX_INT)
    await sock.send(conn.data_to_send())
    received = 0
    while received < 256 * 1024:
        received += len(await sock.recv(65536))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


async def test_connections_reset_mid_stream_are_freed_without_the_garbage_collector(collector_off):
    """20 peers reset their connection while the server streams to them: the server's sessions
    and protocol connections are gone afterwards, with the collector off. (A stream waiting for
    the writer when the connection broke used to keep its session in a cycle.)"""
    server = demo_server()
    alive: list[weakref.ref[object]] = []
    async with running(server) as urls:
        port = int(urls["tcp"].rsplit(":", 1)[1])
        for _ in range(CONNECTIONS):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_subscribe_then_reset, port)
                with trio.fail_after(10):
                    while not server.sessions:
                        await trio.sleep(0.001)
                (served,) = server.sessions
                alive += [weakref.ref(served), weakref.ref(served.conn)]
                del served
            with trio.fail_after(10):
                while server.sessions:
                    await trio.sleep(0.01)
        await trio.sleep(0.05)
    left = [ref for ref in alive if ref() is not None]
    assert not left, f"kept alive by a reference cycle: {len(left)} of {len(alive)} objects"
