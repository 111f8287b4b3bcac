"""Raw clients for wire tests: bytes over a real TCP socket or WebSocket, no rsnet client code.

They let a test send what no well-behaved client would (a bad byte after HELLO, a text
message) and read back exactly what the server wrote, down to how the transport closed.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import trio
from websockets.client import ClientProtocol
from websockets.frames import Close, Frame, Opcode
from websockets.uri import parse_uri

import rsnet
from rsnet.demo.publishers import add_demo_publishers
from rsnet.protocol import Connection, FrameDecoder, Role, parse_frame

from ..net.support import running

READ_TIMEOUT = 5.0

WAIT = object()
"""In a sequence of writes: wait until the server's first frame (WELCOME) has arrived."""


def hello() -> bytes:
    """A client's HELLO with the default settings."""
    return bytes(Connection(Role.CLIENT).data_to_send())


def demo_server() -> rsnet.Server:
    """A server with the demo publishers (params validated by pydantic models)."""
    return add_demo_publishers(rsnet.Server())


@asynccontextmanager
async def serving(server: rsnet.Server | None = None) -> AsyncIterator[dict[str, int]]:
    """A real server on 127.0.0.1; yields its ports: {"tcp": port, "ws": port}."""
    async with running(server or demo_server()) as urls:
        yield {kind: int(url.rsplit(":", 1)[1].strip("/")) for kind, url in urls.items()}


@dataclass
class Received:
    """Everything the server sent until it closed, and how it closed."""

    frames: list[Any] = field(default_factory=list)
    clean_eof: bool = False
    """TCP: the server closed with FIN (no reset) after its last byte."""
    close_code: int | None = None
    """WebSocket: the code of the server's close frame; None if it sent none (1006 for a browser)."""
    text: list[str] = field(default_factory=list)


async def tcp_exchange(port: int, *writes: Any, half_close: bool = False) -> Received:
    """Send each write in one ``send_all`` (``WAIT``: first wait for a frame), half-close if
    asked (the server then sees the end of the stream), and read until the server closes."""
    received = Received()
    decoder = FrameDecoder()
    with trio.fail_after(READ_TIMEOUT):
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        async with stream:
            for data in writes:
                if data is WAIT:
                    while not received.frames:
                        chunk = await stream.receive_some(65536)
                        assert chunk, "the server closed before its first frame"
                        received.frames += [parse_frame(f) for f in decoder.frames(chunk)]
                else:
                    await stream.send_all(data)
            try:
                if half_close:
                    await stream.send_eof()
                while data := await stream.receive_some(65536):
                    received.frames += [parse_frame(f) for f in decoder.frames(data)]
                received.clean_eof = True
            except trio.BrokenResourceError:
                pass  # a reset: clean_eof stays False
    return received


async def ws_exchange(port: int, *messages: Any, close: bool = False, subprotocols: Any = ("rsnet",)) -> Received:
    """Open a WebSocket (offering ``subprotocols``, by default rsnet) with websockets' sans-I/O
    client over a trio socket, send each message (bytes: binary, str: text; ``WAIT``: first wait for a frame),
    then read until the server closes, answering its close frame as a well-behaved client
    does (with ``close``, it starts the closing handshake itself after its messages). A
    server that resets the connection instead leaves ``close_code`` None."""
    received = Received()
    decoder = FrameDecoder()
    protocol = ClientProtocol(parse_uri(f"ws://127.0.0.1:{port}/"), subprotocols=subprotocols and list(subprotocols))
    with trio.fail_after(READ_TIMEOUT):
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        async with stream:
            protocol.send_request(protocol.connect())
            await stream.send_all(b"".join(protocol.data_to_send()))
            while protocol.handshake_exc is None and protocol.state.name == "CONNECTING":
                protocol.receive_data(await stream.receive_some(65536))
            assert protocol.state.name == "OPEN", protocol.handshake_exc
            for event in protocol.events_received():  # a frame may come with the response
                _take(event, received, decoder)
            for message in messages:
                if message is WAIT:
                    await stream.send_all(b"".join(protocol.data_to_send()))
                    while not received.frames:
                        chunk = await stream.receive_some(65536)
                        assert chunk, "the server closed before its first frame"
                        protocol.receive_data(chunk)
                        for event in protocol.events_received():
                            _take(event, received, decoder)
                elif isinstance(message, str):
                    protocol.send_text(message.encode())
                else:
                    protocol.send_binary(message)
            if close and protocol.state.name == "OPEN":
                protocol.send_close(1000)
            try:
                await stream.send_all(b"".join(protocol.data_to_send()))
            except trio.BrokenResourceError:
                pass  # the server closed while we were still sending: read what it sent
            while True:
                try:
                    data = await stream.receive_some(65536)
                except trio.BrokenResourceError:
                    break
                if data:
                    protocol.receive_data(data)
                else:
                    protocol.receive_eof()
                for event in protocol.events_received():
                    _take(event, received, decoder)
                pending = b"".join(protocol.data_to_send())
                if pending:
                    try:
                        await stream.send_all(pending)
                    except trio.BrokenResourceError:
                        pass
                if not data:
                    break
    close: Close | None = protocol.close_rcvd
    received.close_code = None if close is None else close.code
    return received


def _take(event: Any, received: Received, decoder: FrameDecoder) -> None:
    if isinstance(event, Frame) and event.opcode is Opcode.BINARY:
        received.frames += [parse_frame(f) for f in decoder.frames(event.data)]
    elif isinstance(event, Frame) and event.opcode is Opcode.TEXT:
        received.text.append(bytes(event.data).decode())
