"""Connection-level violations over real sockets: CONN_ERROR first, then a clean close (issue 10, finding 6).

SPEC 10.3 and 11.1: a connection error is answered with CONN_ERROR where the transport is still
writable, and then the transport closes cleanly: a FIN on TCP, a closing handshake with a code
on WebSocket (never 1006, "closed without a close frame"). The server logs one line per such
connection, never a traceback a peer could amplify. And one stream's huge error never costs
the connection (finding 4).
"""

from __future__ import annotations

import logging
from functools import partial

import msgpack
import pytest
import trio

import rsnet
from rsnet.protocol import (
    MAX_ERROR_DATA,
    MAX_ERROR_MESSAGE,
    Complete,
    Connection,
    ConnError,
    Error,
    ErrorCode,
    Items,
    Role,
    Welcome,
    encode_frame,
)
from rsnet.protocol.frames import Request, Subscribe

from .wire import WAIT, hello, serving, tcp_exchange, ws_exchange

# A NEXT whose item claims 2 MiB, followed by just over the server's 1 MiB max_frame_size.
OVERSIZED = b"\x93\x15\x01\xdb" + (2 << 20).to_bytes(4, "big") + b"x" * (1 << 20)

# The bytes a client writes after its HELLO, in the same write, and the code the server answers.
AFTER_HELLO = {
    "a byte msgpack never uses": (b"\xc1", ErrorCode.PROTOCOL_ERROR),
    "a frame that is not an array": (msgpack.packb("hi"), ErrorCode.PROTOCOL_ERROR),
    "a SUBSCRIBE before WELCOME": (encode_frame(Subscribe(1, "range", {"count": 1}, 1, {})), ErrorCode.PROTOCOL_ERROR),
    "a second HELLO": (hello(), ErrorCode.PROTOCOL_ERROR),
    "a frame over max_frame_size": (OVERSIZED, ErrorCode.FRAME_TOO_LARGE),
}
# What a client writes once the handshake is over.
AFTER_HANDSHAKE = {
    "a byte msgpack never uses": (b"\xc1", ErrorCode.PROTOCOL_ERROR),
    "a frame that is not an array": (msgpack.packb("hi"), ErrorCode.PROTOCOL_ERROR),
    "a second HELLO": (hello(), ErrorCode.PROTOCOL_ERROR),
    "a REQUEST for a stream never opened": (encode_frame(Request(7, 1)), ErrorCode.PROTOCOL_ERROR),
    "a SUBSCRIBE with the wrong stream id": (
        encode_frame(Subscribe(3, "range", None, 0, {})),
        ErrorCode.PROTOCOL_ERROR,
    ),
    "a frame over max_frame_size": (OVERSIZED, ErrorCode.FRAME_TOO_LARGE),
}


def no_tracebacks(caplog: pytest.LogCaptureFixture) -> None:
    tracebacks = [r for r in caplog.records if r.exc_info and r.name.startswith("rsnet")]
    assert not tracebacks, [r.getMessage() for r in tracebacks]


def assert_conn_error_then_closed(frames: list, code: ErrorCode) -> None:
    assert frames, "the server sent nothing"
    assert isinstance(frames[-1], ConnError), frames
    assert frames[-1].code == code, frames[-1]
    assert not any(isinstance(f, ConnError) for f in frames[:-1])


@pytest.mark.parametrize(("after", "code"), AFTER_HELLO.values(), ids=AFTER_HELLO.keys())
async def test_tcp_bad_bytes_in_the_same_write_as_hello(caplog, after: bytes, code: ErrorCode) -> None:
    caplog.set_level(logging.INFO)
    async with serving() as ports:
        received = await tcp_exchange(ports["tcp"], hello() + after)
    assert_conn_error_then_closed(received.frames, code)
    assert received.clean_eof
    no_tracebacks(caplog)


@pytest.mark.parametrize(("after", "code"), AFTER_HELLO.values(), ids=AFTER_HELLO.keys())
async def test_websocket_bad_bytes_in_the_same_message_as_hello(caplog, after: bytes, code: ErrorCode) -> None:
    caplog.set_level(logging.INFO)
    async with serving() as ports:
        received = await ws_exchange(ports["ws"], hello() + after)
    assert_conn_error_then_closed(received.frames, code)
    assert received.close_code is not None and received.close_code != 1006
    no_tracebacks(caplog)


@pytest.mark.parametrize(("after", "code"), AFTER_HANDSHAKE.values(), ids=AFTER_HANDSHAKE.keys())
async def test_tcp_bad_bytes_after_the_handshake(caplog, after: bytes, code: ErrorCode) -> None:
    caplog.set_level(logging.INFO)
    async with serving() as ports:
        received = await tcp_exchange(ports["tcp"], hello(), WAIT, after)
    assert isinstance(received.frames[0], Welcome)
    assert_conn_error_then_closed(received.frames, code)
    assert received.clean_eof
    no_tracebacks(caplog)


async def test_tcp_a_peer_that_does_not_speak_rsnet_gets_conn_error(caplog) -> None:
    caplog.set_level(logging.INFO)
    async with serving() as ports:
        received = await tcp_exchange(ports["tcp"], b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    assert_conn_error_then_closed(received.frames, ErrorCode.PROTOCOL_ERROR)
    assert received.clean_eof
    no_tracebacks(caplog)


async def test_a_client_at_the_wrong_port_is_told_which_port_it_reached_at_once() -> None:
    """An rsnet client given the WebSocket port (tcp://) is answered with a CONN_ERROR at its
    first byte, not left waiting for the HTTP request line until its handshake timed out; a
    WebSocket client or browser at the TCP port is told that it sent an HTTP request."""
    async with serving() as ports:
        with trio.fail_after(5):  # the handshake timeout is 10 s
            with pytest.raises(rsnet.HandshakeError) as caught:
                async with rsnet.connect(f"tcp://127.0.0.1:{ports['ws']}"):
                    pass
        assert caught.value.code == ErrorCode.PROTOCOL_ERROR
        assert "this is an rsnet WebSocket port: connect with ws://" in str(caught.value)
        received = await tcp_exchange(ports["tcp"], b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        assert received.frames[-1].message == (
            "an HTTP request, not the rsnet protocol: WebSocket clients connect to the WebSocket port (ws://)"
        )
        # rsnet's own WebSocket client at the TCP port is told in its terms (it said "the peer
        # closed during the WebSocket handshake": an outside check).
        with trio.fail_after(5), pytest.raises(rsnet.ConnectionLost) as wrong_port:
            async with rsnet.connect(f"ws://127.0.0.1:{ports['tcp']}/"):
                pass
        assert str(wrong_port.value) == (
            f"WebSocket handshake with ws://127.0.0.1:{ports['tcp']}/ failed: "
            "the server answered in the rsnet protocol, not HTTP: connect with tcp://"
        )


def test_a_tls_handshake_at_a_plain_port_is_named() -> None:
    server = Connection(Role.SERVER)
    server.receive_data(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03")  # a TLS ClientHello's start
    (closed,) = server.events_received()
    assert closed.code == ErrorCode.PROTOCOL_ERROR
    assert closed.message == "a TLS handshake on a plain rsnet port: connect with tcp://, or turn TLS on ([listen.tls])"


async def test_websocket_text_message_gets_conn_error_and_a_closing_handshake(caplog) -> None:
    """SPEC 2.2: a text message is a PROTOCOL_ERROR; the close code says "unsupported data"."""
    caplog.set_level(logging.INFO)
    async with serving() as ports:
        received = await ws_exchange(ports["ws"], hello(), WAIT, "[1, 2, 3]")
    assert isinstance(received.frames[0], Welcome)
    assert_conn_error_then_closed(received.frames, ErrorCode.PROTOCOL_ERROR)
    assert received.close_code == 1003
    no_tracebacks(caplog)


@pytest.mark.parametrize("offered", [None, ["chat"], ["chat", "rsnet"]])
async def test_websocket_clients_offering_no_rsnet_subprotocol_are_served(offered, caplog) -> None:
    """SPEC 2.2: clients SHOULD offer rsnet (then it is selected); one that offers nothing, or
    only others, still speaks the protocol and is served (websockets alone answers HTTP 400).
    And no line per connection in the log: websockets' INFO "connection open/closed" lines
    would be a log line a peer makes us write as fast as it connects."""
    caplog.set_level(logging.INFO)
    async with serving() as ports:
        received = await ws_exchange(ports["ws"], hello(), WAIT, close=True, subprotocols=offered)
    assert isinstance(received.frames[0], Welcome)
    assert received.close_code == 1000
    assert [r.getMessage() for r in caplog.records if r.name.startswith(("websockets", "rsnet.transport"))] == []
    no_tracebacks(caplog)


async def test_websocket_text_message_before_hello(caplog) -> None:
    caplog.set_level(logging.INFO)
    async with serving() as ports:
        received = await ws_exchange(ports["ws"], "hello?")
    assert_conn_error_then_closed(received.frames, ErrorCode.PROTOCOL_ERROR)
    assert received.close_code == 1003
    no_tracebacks(caplog)


async def test_websocket_bad_bytes_after_the_handshake_close_with_a_code(caplog) -> None:
    caplog.set_level(logging.INFO)
    async with serving() as ports:
        received = await ws_exchange(ports["ws"], hello(), WAIT, b"\xc1")
    assert isinstance(received.frames[0], Welcome)
    assert_conn_error_then_closed(received.frames, ErrorCode.PROTOCOL_ERROR)
    assert received.close_code is not None and received.close_code != 1006
    no_tracebacks(caplog)


async def test_a_huge_invalid_params_map_is_rejected_on_its_stream_and_the_connection_lives(caplog) -> None:
    """Issue 10 finding 4: a 0.9 MB params map with 100,000 unknown keys made a 9 MB error
    message; sending it failed and the connection died with a healthy stream on it."""
    caplog.set_level(logging.INFO)
    client = Connection(Role.CLIENT)
    events: list = []
    async with serving() as ports:
        with trio.fail_after(10):
            stream = await trio.open_tcp_stream("127.0.0.1", ports["tcp"])
            async with stream:

                async def exchange(until) -> None:
                    while not until():
                        await stream.send_all(bytes(client.data_to_send()))
                        data = await stream.receive_some(65536)
                        assert data, f"the server closed the connection: {events}"
                        client.receive_data(data)
                        events.extend(client.events_received())

                await exchange(lambda: client.state.name == "OPEN")
                healthy = client.send_subscribe("range", {"count": 3}, initial_demand=10)
                bad = client.send_subscribe("range", {f"k{i}": i for i in range(90_000)}, initial_demand=10)
                await exchange(
                    lambda: any(isinstance(e, Error) for e in events) and any(isinstance(e, Complete) for e in events)
                )
    (error,) = [e for e in events if isinstance(e, Error)]
    assert error.code == ErrorCode.REJECTED and error.stream_id == bad
    # The server summarises the first fields (rsnet.net); the protocol's bound is the backstop.
    assert len(error.message.encode()) <= MAX_ERROR_MESSAGE and error.message.startswith("invalid params for 'range'")
    assert len(msgpack.packb(error.data)) <= MAX_ERROR_DATA
    assert [i for e in events if isinstance(e, Items) and e.stream_id == healthy for i in e.items] == [0, 1, 2]
    assert client.state.name == "OPEN"
    no_tracebacks(caplog)


async def test_the_client_answers_a_text_message_with_conn_error_and_1003() -> None:
    """The same rule the other way round: a server that sends text gets CONN_ERROR and close 1003."""
    from websockets.frames import Frame, Opcode
    from websockets.http11 import Request as HttpRequest
    from websockets.server import ServerProtocol

    from rsnet.protocol import FrameDecoder, parse_frame

    seen: dict = {}

    async def raw_server(stream: trio.SocketStream) -> None:
        protocol = ServerProtocol(subprotocols=["rsnet"])  # type: ignore[list-item]  # Subprotocol is a NewType of str
        conn = Connection(Role.SERVER)
        decoder = FrameDecoder()
        frames: list = []
        async with stream:
            while True:
                data = await stream.receive_some(65536)
                if not data:
                    break
                protocol.receive_data(data)
                for event in protocol.events_received():
                    if isinstance(event, HttpRequest):
                        protocol.send_response(protocol.accept(event))
                    elif isinstance(event, Frame) and event.opcode is Opcode.BINARY:
                        if conn.state.name == "AWAIT_HELLO":
                            conn.receive_data(event.data)
                            conn.events_received()
                            conn.send_welcome()
                            protocol.send_binary(bytes(conn.data_to_send()))
                            protocol.send_text(b"[2, 1, {}]")
                        else:
                            frames.extend(parse_frame(f) for f in decoder.frames(event.data))
                await stream.send_all(b"".join(protocol.data_to_send()))
                if protocol.close_rcvd is not None:
                    break
        seen["frames"], seen["close"] = frames, protocol.close_rcvd

    async with trio.open_nursery() as nursery:
        (listener,) = await nursery.start(partial(trio.serve_tcp, raw_server, 0, host="127.0.0.1"))
        port = listener.socket.getsockname()[1]
        with trio.fail_after(5):
            try:
                async with rsnet.connect(f"ws://127.0.0.1:{port}/") as conn:
                    while not conn.closed:
                        await trio.sleep(0.01)
            except rsnet.RsnetError:
                pass  # the connection ended: what the client sent is what is checked
            while "close" not in seen:
                await trio.sleep(0.01)
        nursery.cancel_scope.cancel()
    assert_conn_error_then_closed(seen["frames"], ErrorCode.PROTOCOL_ERROR)
    assert seen["close"] is not None and seen["close"].code == 1003
