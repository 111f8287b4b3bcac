"""Resource budget: sockets a server accepts and the log lines connections cost (server/README.md).

Peers that open connections and never finish a handshake hold accepted sockets (file
descriptors) until ``handshake_timeout``; they must not be able to take every descriptor of
the process, nor keep other clients out, nor write a log line each without limit.
"""

from __future__ import annotations

import logging
import os
import pathlib

import pytest
import trio
import trio.testing

import rsnet
from rsnet.net import failures, server
from rsnet.protocol import ErrorCode

from .support import demo_server, running


def accepted_sockets(port: int) -> int:
    """Sockets this process holds whose local end is ``port``, the listening one aside: what
    the server accepted (connections still in the listen backlog have no descriptor yet)."""
    inodes = set()
    for row in pathlib.Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = row.split()
        local_port, state, inode = int(fields[1].rsplit(":", 1)[1], 16), fields[3], fields[9]
        if local_port == port and state != "0A":  # 0A: LISTEN
            inodes.add(f"socket:[{inode}]")
    held = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            held += os.readlink(f"/proc/self/fd/{fd}") in inodes
        except OSError:  # closed meanwhile (listdir's own descriptor)
            pass
    return held


async def idle_sockets(port: int, count: int) -> list[trio.SocketStream]:
    """``count`` connections that never send a byte (not even HELLO)."""
    return [await trio.open_tcp_stream("127.0.0.1", port) for _ in range(count)]


async def test_sockets_in_their_handshake_stay_within_max_connections_plus_the_refusal_slots():
    """One server of max_connections 2: at most 2 + REFUSAL_SLOTS silent sockets are held at
    once (before: every one was accepted, a descriptor each, for the whole handshake timeout);
    sockets that go free are taken again, and once the silent peers are gone a client is
    served again."""
    limit = 2 + server.REFUSAL_SLOTS
    app = demo_server(max_connections=2, handshake_timeout=3600)
    async with running(app) as urls:
        port = int(urls["tcp"].rsplit(":", 1)[1])
        silent = await idle_sockets(port, limit + 20)
        await trio.testing.wait_all_tasks_blocked(0.05)  # the server accepted all it will
        # Each listener's accept loop (TCP and WebSocket here) takes its slot before accept().
        assert limit - 2 <= accepted_sockets(port) <= limit
        for stream in silent[:5]:  # ended, or closed by the server already: none held more
            await stream.aclose()
        del silent[:5]
        await trio.testing.wait_all_tasks_blocked(0.05)
        assert limit - 2 <= accepted_sockets(port) <= limit
        for stream in silent:
            await stream.aclose()
        with trio.fail_after(5):
            async with rsnet.connect(urls["tcp"]) as conn:
                assert [x async for x in conn.subscribe("range", {"count": 2})] == [0, 1]
        await trio.testing.wait_all_tasks_blocked(0.05)
        assert accepted_sockets(port) == 0  # nothing left behind


@pytest.mark.parametrize("scheme", ["tcp", "ws"])
async def test_silent_sockets_holding_every_slot_do_not_keep_a_client_out(scheme):
    """Attack round 6's /health finding, on the rsnet listeners: sockets that never send their
    HELLO held every slot until handshake_timeout, and a client waited behind them in the
    backlog (here for an hour). Now the oldest of them is closed to make room for the next
    connection, and the client is served at once, the silent sockets still open."""
    limit = 2 + server.REFUSAL_SLOTS
    app = demo_server(max_connections=2, handshake_timeout=3600)
    async with running(app) as urls:
        port = int(urls[scheme].rstrip("/").rsplit(":", 1)[1])
        silent = await idle_sockets(port, limit + 20)
        await trio.testing.wait_all_tasks_blocked(0.05)
        with trio.fail_after(5):
            async with rsnet.connect(urls[scheme]) as conn:
                assert [x async for x in conn.subscribe("range", {"count": 2})] == [0, 1]
        assert accepted_sockets(port) <= limit
        closed = 0
        for stream in silent:  # the oldest were closed by the server, the client's room among them
            with trio.move_on_after(0.01):
                closed += await stream.receive_some(1) == b""
            await stream.aclose()
        assert closed >= 21


WS_UPGRADE = (
    b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: rsnet\r\n\r\n"
)
TEXT_FRAME = b"\x81\x81\x00\x00\x00\x00x"  # a masked text message "x": a violation (SPEC 2.2)


async def _violate_and_stay(port: int) -> trio.SocketStream:
    """A WebSocket client that upgrades, sends a text message and keeps its socket open:
    the server fails the connection and lingers a second to let it read why."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    await stream.send_all(WS_UPGRADE)
    await stream.receive_some(4096)  # the 101, once the server got round to accepting it
    await stream.send_all(TEXT_FRAME)
    return stream


async def test_connections_lingering_after_a_violation_are_closed_at_once_to_make_room():
    """Attack round 7: a WebSocket connection failed for a violation lingers a second in a
    shielded scope, which eviction's cancel could not cut short: each eviction held the accept
    loop that long, and 50 such connections a second kept WebSocket clients out (p50 2.5 s).
    Evicting closes the socket now. 300 of them ahead of a client in the backlog: it is served
    at once (it used to wait for their lingering, 300 / 34 slots seconds)."""
    app = demo_server(max_connections=2, handshake_timeout=3600)
    async with running(app) as urls:
        port = int(urls["ws"].rstrip("/").rsplit(":", 1)[1])
        violators: list[trio.SocketStream] = []

        async def violate() -> None:
            violators.append(await _violate_and_stay(port))

        with trio.fail_after(3):  # 9 s at least before
            async with trio.open_nursery() as nursery:
                for _ in range(300):
                    nursery.start_soon(violate)
                await trio.testing.wait_all_tasks_blocked(0.05)
                async with rsnet.connect(urls["ws"]) as conn:
                    assert [x async for x in conn.subscribe("range", {"count": 2})] == [0, 1]
                nursery.cancel_scope.cancel()
        for stream in violators:
            await stream.aclose()


async def test_a_websocket_upgrade_and_its_hello_share_one_handshake_timeout(autojump_clock):
    """Attack round 7: the upgrade had handshake_timeout, then the HELLO as long again, so a
    socket could hold its slot twice as long as documented (upgrade at 9.5 s, closed at 19.5)."""
    async with running(demo_server(handshake_timeout=10)) as urls:
        stream = await trio.open_tcp_stream("127.0.0.1", int(urls["ws"].rstrip("/").rsplit(":", 1)[1]))
        start = trio.current_time()
        await trio.sleep(9)
        await stream.send_all(WS_UPGRADE)  # upgraded at 9 s: a second left for the HELLO
        while await stream.receive_some(4096):
            pass
        assert trio.current_time() - start < 12  # (19 before)
        await stream.aclose()


async def test_a_wrong_token_is_refused_as_such_when_every_connection_slot_is_taken():
    """A connection's token is checked before it takes a slot of max_connections: a refused
    client never holds one (attack round 7: its refusal's write, with no timeout, could hold it
    for ever), and hears the real reason, not GOING_AWAY."""
    app = demo_server(max_connections=1, token="right")
    async with running(app) as urls, rsnet.connect(urls["tcp"], token="right") as holder:
        with pytest.raises(rsnet.HandshakeError) as refused:
            async with rsnet.connect(urls["tcp"], token="wrong"):
                raise AssertionError("a wrong token was let in")
        assert refused.value.code == ErrorCode.UNAUTHORIZED
        with pytest.raises(rsnet.HandshakeError) as full:
            async with rsnet.connect(urls["tcp"], token="right"):
                raise AssertionError("one more than max_connections was let in")
        assert full.value.code == ErrorCode.GOING_AWAY
        assert [x async for x in holder.subscribe("range", {"count": 1})] == [0]


async def test_a_connection_that_finished_its_handshake_is_not_closed_to_make_room():
    """Only connections still in their handshake are closed for a newcomer: a client with an
    open stream keeps it through a flood of silent sockets."""
    app = demo_server(max_connections=2, handshake_timeout=3600)
    async with running(app) as urls:
        port = int(urls["tcp"].rsplit(":", 1)[1])
        async with rsnet.connect(urls["tcp"]) as conn:
            items = conn.subscribe("range", {"count": 3})
            assert await anext(items) == 0
            silent = await idle_sockets(port, 2 + server.REFUSAL_SLOTS + 20)
            await trio.testing.wait_all_tasks_blocked(0.05)
            with trio.fail_after(5):
                assert [x async for x in items] == [1, 2]
            for stream in silent:
                await stream.aclose()


async def test_refused_connections_write_a_bounded_number_of_log_lines(caplog, monkeypatch):
    """150 connections with a wrong token inside one minute: at most CONNECTION_LINES_PER_MINUTE
    lines, every one of them refused; the next minute begins with one line counting the rest."""
    now = [1000.0]
    monkeypatch.setattr(failures.time, "monotonic", lambda: now[0])
    app = demo_server(token="right")
    with caplog.at_level(logging.INFO, logger="rsnet.net.server"):
        async with running(app) as urls:
            for _ in range(150):
                try:
                    async with rsnet.connect(urls["tcp"], token="wrong"):
                        raise AssertionError("a wrong token was let in")
                except rsnet.HandshakeError as refused:
                    assert refused.code == ErrorCode.UNAUTHORIZED
            await trio.testing.wait_all_tasks_blocked(0.05)
            lines = [r.getMessage() for r in caplog.records if r.name == "rsnet.net.server"]
            assert len(lines) == failures.CONNECTION_LINES_PER_MINUTE
            assert all("bad token" in line for line in lines)
            async with rsnet.connect(urls["tcp"], token="right") as conn:  # still served
                assert [x async for x in conn.subscribe("range", {"count": 1})] == [0]
            now[0] += 60
            try:
                async with rsnet.connect(urls["tcp"], token="wrong"):
                    raise AssertionError("a wrong token was let in")
            except rsnet.HandshakeError:
                pass
            await trio.testing.wait_all_tasks_blocked(0.05)
    later = [r.getMessage() for r in caplog.records if r.name == "rsnet.net.server"][len(lines) :]
    assert later[0] == "50 more connection reports in the last minute were left out"
    assert len(later) == 2 and "bad token" in later[1]


def test_connection_limit_leaves_half_the_descriptors_to_the_rest_of_the_process():
    assert server.connection_limit(10_000, 1024) == 512 - server.REFUSAL_SLOTS
    assert server.connection_limit(100, 1024) == 100
    assert server.connection_limit(10_000, 65_536) == 10_000
    assert server.connection_limit(10_000, 40) == 1  # always at least one
