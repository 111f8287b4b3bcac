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
