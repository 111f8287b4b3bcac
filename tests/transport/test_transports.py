"""TCP and WebSocket transports over real loopback sockets."""

from __future__ import annotations

import ssl
import tracemalloc
from functools import partial

import pytest
import trio
import trio.testing
import trustme

from rsnet.transport import (
    TcpTransport,
    Transport,
    TransportClosed,
    accept_websocket,
    connect_tcp,
    connect_websocket,
)
from rsnet.transport.tcp import describe_peer


async def _echo(transport):
    try:
        while data := await transport.receive():
            await transport.send([data])
    finally:
        await transport.aclose()


async def _serve(nursery, handler):
    listeners = await nursery.start(partial(trio.serve_tcp, handler, 0, host="127.0.0.1"))
    return listeners[0].socket.getsockname()[1]


async def test_tcp_round_trip():
    async with trio.open_nursery() as nursery:

        async def handler(stream):
            await _echo(TcpTransport(stream, describe_peer(stream)))

        port = await _serve(nursery, handler)
        client = await connect_tcp("127.0.0.1", port)
        await client.send([b"hello ", b"world"])
        received = b""
        while len(received) < 11:
            received += await client.receive()
        assert received == b"hello world"
        await client.aclose()
        nursery.cancel_scope.cancel()


async def test_websocket_carries_the_bytes_of_binary_messages_and_closes_cleanly():
    """Each chunk sent is one binary message; the receiver gets their payload as a byte
    stream (the protocol's decoder reads frames from a stream, SPEC 2.2)."""
    async with trio.open_nursery() as nursery:

        async def handler(stream):
            transport = await accept_websocket(stream, max_message_size=1 << 20, path="/rsnet")
            assert transport is not None
            await _echo(transport)

        port = await _serve(nursery, handler)
        client = await connect_websocket(f"ws://127.0.0.1:{port}/rsnet", max_message_size=1 << 20)
        await client.send([b"one", b"two", b"x" * 100_000])
        received = b""
        while len(received) < 100_006:
            received += await client.receive()
        assert received == b"onetwo" + b"x" * 100_000
        await client.aclose()
        nursery.cancel_scope.cancel()


async def test_websocket_wrong_path_is_refused():
    async with trio.open_nursery() as nursery:

        async def handler(stream):
            assert await accept_websocket(stream, max_message_size=1 << 20, path="/rsnet") is None
            await stream.aclose()

        port = await _serve(nursery, handler)
        with pytest.raises(TransportClosed):
            await connect_websocket(f"ws://127.0.0.1:{port}/elsewhere", max_message_size=1 << 20)
        nursery.cancel_scope.cancel()


async def test_connecting_to_a_closed_port_fails_clearly():
    with pytest.raises(TransportClosed, match="cannot connect"):
        await connect_tcp("127.0.0.1", 1)


def _fill(transport, piece: bytes) -> list[bytes]:
    """``send_nowait`` pieces until the socket takes no more (the peer is not reading)."""
    sent = []
    while True:
        sent.append(piece + len(sent).to_bytes(4, "big"))
        if not transport.send_nowait([sent[-1]]):
            return sent


async def test_tcp_send_nowait_writes_at_once_and_send_finishes_what_it_left():
    received = bytearray()
    reading = trio.Event()
    done = trio.Event()
    async with trio.open_nursery() as nursery:

        async def handler(stream):
            await reading.wait()
            while data := await stream.receive_some(65536):
                received.extend(data)
            done.set()

        port = await _serve(nursery, handler)
        client = await connect_tcp("127.0.0.1", port)
        # nothing is pending: the bytes go straight to the socket, no send needed
        assert client.send_nowait([b"first"])
        # the peer reads nothing: the socket fills and the rest is kept, in order
        sent = _fill(client, b"x" * 65536)
        assert not client.send_nowait([b"queued behind the rest"])
        reading.set()
        await client.send([b"last"])  # writes what send_nowait left first
        await client.aclose()
        await done.wait()
        nursery.cancel_scope.cancel()
    assert bytes(received) == b"first" + b"".join(sent) + b"queued behind the rest" + b"last"


@pytest.mark.parametrize("kind", ["tcp", "tls", "wss"])
async def test_a_write_the_peer_does_not_take_holds_no_copy_of_what_it_sends(kind):
    """A server's write that waits for a peer that reads nothing holds what it was given, and
    nothing more: the TCP transport joined what send_nowait had left with the next chunks,
    and TLS encrypted all of a write into a buffer of its own, so a broker holding a
    connection's window for such a peer held it twice (8 connections of 16 MiB windows: 252
    MiB RSS, now 142). (A WebSocket client masks what it sends, a copy by nature: not here.)"""
    client_context = server_context = None
    if kind != "tcp":
        authority = trustme.CA()
        server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        authority.issue_cert("127.0.0.1").configure_cert(server_context)
        client_context = ssl.create_default_context()
        authority.configure_trust(client_context)
    accepted: list[Transport] = []
    async with trio.open_nursery() as nursery:

        async def handler(stream):
            if server_context is not None:
                stream = trio.SSLStream(stream, server_context, server_side=True)
                await stream.do_handshake()
            if kind == "wss":
                accepted.append(await accept_websocket(stream, max_message_size=16 << 20))
            else:
                accepted.append(TcpTransport(stream))
            await trio.sleep_forever()

        port = await _serve(nursery, handler)
        if kind == "wss":
            url = f"wss://127.0.0.1:{port}/"
            client = await connect_websocket(url, max_message_size=16 << 20, ssl_context=client_context)
        else:
            client = await connect_tcp("127.0.0.1", port, ssl_context=client_context)
        await trio.testing.wait_all_tasks_blocked()
        (server,) = accepted
        _fill(server, b"x" * 65536)  # the client reads nothing: the socket fills, send_nowait keeps a rest
        chunk = bytearray(4 << 20)
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            nursery.start_soon(server.send, [chunk])
            await trio.testing.wait_all_tasks_blocked()
            held = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
        assert held < 512 * 1024  # (a copy: 4 MiB and more)
        nursery.cancel_scope.cancel()
    await client.aclose()


async def test_websocket_send_nowait_keeps_frames_whole_when_the_socket_fills():
    reading = trio.Event()
    done = trio.Event()
    received = []
    async with trio.open_nursery() as nursery:

        async def handler(stream):
            transport = await accept_websocket(stream, max_message_size=1 << 20)
            assert transport is not None
            await reading.wait()
            while data := await transport.receive():
                received.append(bytes(data))
            done.set()

        port = await _serve(nursery, handler)
        client = await connect_websocket(f"ws://127.0.0.1:{port}/", max_message_size=1 << 20)
        assert client.send_nowait([b"first", b"second"])
        sent = _fill(client, b"y" * 50_000)  # a message is cut somewhere in its frame
        reading.set()
        await client.send([b"last"])
        await client.aclose()
        await done.wait()
        nursery.cancel_scope.cancel()
    assert b"".join(received) == b"".join([b"first", b"second", *sent, b"last"])


@pytest.mark.parametrize("mask", [False, True])
def test_binary_frames_are_what_websockets_parses(mask):
    """The transport frames data messages itself (no copies through websockets' serializer):
    websockets' own parser reads them back, at every length encoding (7, 16 and 64 bits)."""
    from websockets.frames import Frame, Opcode
    from websockets.streams import StreamReader

    from rsnet.transport.websocket import binary_frames

    messages = [b"", b"a" * 125, b"b" * 126, bytearray(b"c" * 65535), memoryview(b"d" * 65536)]
    reader = StreamReader()
    reader.feed_data(b"".join(binary_frames(messages, mask=mask)))
    reader.feed_eof()
    for message in messages:
        parser = Frame.parse(reader.read_exact, mask=mask)
        try:
            next(parser)
        except StopIteration as done:
            frame = done.value
        assert (frame.opcode, frame.fin, frame.rsv1, bytes(frame.data)) == (Opcode.BINARY, True, False, bytes(message))
