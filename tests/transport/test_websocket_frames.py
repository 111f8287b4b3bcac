"""WebSocket frames as the transport reads them itself (rsnet.transport.websocket): binary
payloads go straight to the protocol's decoder, whatever the fragmentation and wherever the TCP
writes cut the frames; ping, close and text still reach websockets; a binary frame that breaks
RFC 6455 fails the connection as websockets' own parser did (CONN_ERROR, then close 1002, or
1009 for a message over the size limit). A raw client writes the frames byte by byte here.
"""

from __future__ import annotations

import secrets
import socket
import struct

import pytest
import trio
import trio.testing
from websockets.client import ClientProtocol
from websockets.frames import Close, Frame, Opcode
from websockets.uri import parse_uri

import rsnet
from rsnet.protocol import ConnError, Error, ErrorCode, FrameDecoder, Subscribe, Welcome, encode_frame, parse_frame
from rsnet.transport.websocket import CONTROL_BACKLOG

from .wire import READ_TIMEOUT, demo_server, hello, serving

FIN = 0x80


def frame(opcode: int, payload: bytes, *, fin: bool = True, masked: bool = True, rsv: int = 0) -> bytes:
    """One WebSocket frame, as a client writes it (masked unless told otherwise)."""
    head = bytes([(FIN if fin else 0) | rsv | opcode])
    size = len(payload)
    bit = 0x80 if masked else 0
    if size < 126:
        head += bytes([bit | size])
    elif size < 65536:
        head += bytes([bit | 126]) + struct.pack("!H", size)
    else:
        head += bytes([bit | 127]) + struct.pack("!Q", size)
    if not masked:
        return head + payload
    key = secrets.token_bytes(4)
    return head + key + bytes(b ^ key[i % 4] for i, b in enumerate(payload))


class RawWebSocket:
    """A client that has done the opening handshake and then writes raw bytes."""

    def __init__(self, stream: trio.SocketStream, protocol: ClientProtocol) -> None:
        self.stream = stream
        self.protocol = protocol
        self.frames: list = []
        self.pongs: list[bytes] = []
        self._decoder = FrameDecoder()

    @classmethod
    async def open(cls, port: int, *, receive_buffer: int | None = None) -> RawWebSocket:
        """Connected and upgraded; ``receive_buffer`` sets the socket's SO_RCVBUF (a client
        that takes little)."""
        protocol = ClientProtocol(parse_uri(f"ws://127.0.0.1:{port}/"), subprotocols=["rsnet"])  # type: ignore[list-item]  # Subprotocol is a NewType of str
        sock = trio.socket.socket()
        if receive_buffer is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
        await sock.connect(("127.0.0.1", port))
        stream = trio.SocketStream(sock)
        protocol.send_request(protocol.connect())
        await stream.send_all(b"".join(protocol.data_to_send()))
        while protocol.state.name == "CONNECTING":
            protocol.receive_data(await stream.receive_some(65536))
        raw = cls(stream, protocol)
        raw._take()
        return raw

    async def write(self, *pieces: bytes) -> None:
        """Each piece in its own TCP write (the server may read them apart)."""
        for piece in pieces:
            await self.stream.send_all(piece)
            await trio.sleep(0.01)  # not a race: only makes separate reads likely

    def _take(self) -> None:
        for event in self.protocol.events_received():
            if isinstance(event, Frame) and event.opcode is Opcode.BINARY:
                self.frames += [parse_frame(f) for f in self._decoder.frames(event.data)]
            elif isinstance(event, Frame) and event.opcode is Opcode.PONG:
                self.pongs.append(bytes(event.data))

    async def read_until(self, done) -> None:
        with trio.fail_after(READ_TIMEOUT):
            while not done():
                try:
                    data = await self.stream.receive_some(65536)
                except trio.BrokenResourceError:
                    return  # a reset after the server's last frame: what it sent was read
                if not data:
                    self.protocol.receive_eof()
                    self._take()
                    return
                self.protocol.receive_data(data)
                self._take()
                pending = b"".join(self.protocol.data_to_send())
                if pending:
                    try:
                        await self.stream.send_all(pending)
                    except trio.BrokenResourceError:
                        pass

    async def closed(self) -> Close | None:
        """Read until the server closes; its close frame (None if it sent none)."""
        await self.read_until(lambda: False)
        return self.protocol.close_rcvd


async def test_a_hello_in_fragments_cut_anywhere_with_a_ping_between_gets_welcome_and_pong() -> None:
    data = hello()
    first = frame(Opcode.BINARY.value, data[:5], fin=False)
    ping = frame(Opcode.PING.value, b"are you there")
    rest = frame(Opcode.CONT.value, data[5:])
    async with serving() as ports:
        raw = await RawWebSocket.open(ports["ws"])
        # the header of the first fragment cut after one byte, the ping inside the message
        await raw.write(first[:1], first[1:3], first[3:] + ping[:4], ping[4:] + rest[:2], rest[2:])
        await raw.read_until(lambda: raw.frames and raw.pongs)
        assert isinstance(raw.frames[0], Welcome)
        assert raw.pongs == [b"are you there"]
        await raw.stream.aclose()


async def test_a_large_message_in_one_frame_arrives_whole_however_the_reads_cut_it() -> None:
    """A 64-bit length header, a payload over many reads: the server decodes all of it (here
    a SUBSCRIBE whose params the demo's range refuses, answered on its stream)."""
    subscribe = encode_frame(Subscribe(1, "range", {"count": 3, "pad": "p" * 70_000}, 3, {}))
    whole = frame(Opcode.BINARY.value, subscribe)
    async with serving() as ports:
        raw = await RawWebSocket.open(ports["ws"])
        await raw.write(frame(Opcode.BINARY.value, hello()))
        await raw.read_until(lambda: raw.frames)
        await raw.write(*[whole[i : i + 9000] for i in range(0, len(whole), 9000)])
        await raw.read_until(lambda: any(isinstance(f, Error) for f in raw.frames))
        (error,) = [f for f in raw.frames if isinstance(f, Error)]
        assert (error.stream_id, error.code) == (1, ErrorCode.REJECTED)
        await raw.stream.aclose()


HUGE_NEXT = b"\x93\x15\x01\xdb" + (1_400_000).to_bytes(4, "big") + b"x" * 1_400_000

BROKEN = {
    "a continuation with no message begun": (frame(Opcode.CONT.value, b"\x90"), 1002, ErrorCode.PROTOCOL_ERROR),
    "a new message while one awaits its continuation": (
        frame(Opcode.BINARY.value, b"\x90", fin=False) + frame(Opcode.BINARY.value, b"\x90"),
        1002,
        ErrorCode.PROTOCOL_ERROR,
    ),
    "an unmasked frame from a client": (
        frame(Opcode.BINARY.value, b"\x90", masked=False),
        1002,
        ErrorCode.PROTOCOL_ERROR,
    ),
    "a reserved bit set": (frame(Opcode.BINARY.value, b"\x90", rsv=0x40), 1002, ErrorCode.PROTOCOL_ERROR),
    # Nothing after the header in its read: the refusal must go out without waiting for more.
    "a reserved bit set on an empty frame": (frame(Opcode.BINARY.value, b"", rsv=0x40), 1002, ErrorCode.PROTOCOL_ERROR),
    "an unmasked empty frame from a client": (
        frame(Opcode.BINARY.value, b"", masked=False),
        1002,
        ErrorCode.PROTOCOL_ERROR,
    ),
    "a message over the size limit": (
        # the start of one huge NEXT (an unfinished protocol frame, within its limit so far),
        # then a continuation that takes the message over the server's 1 MiB
        frame(Opcode.BINARY.value, HUGE_NEXT[:700_000], fin=False) + frame(Opcode.CONT.value, HUGE_NEXT[700_000:]),
        1009,
        ErrorCode.FRAME_TOO_LARGE,
    ),
    "a text fragment, then a continuation over the size limit": (
        # websockets fails the connection over the continuation as it reports the text frame:
        # the refusal is the size's (it was a traceback and a reset)
        frame(Opcode.TEXT.value, b"x", fin=False) + frame(Opcode.CONT.value, b"x" * (1 << 20)),
        1009,
        ErrorCode.FRAME_TOO_LARGE,
    ),
}


@pytest.mark.parametrize(("data", "close_code", "code"), BROKEN.values(), ids=BROKEN.keys())
async def test_a_binary_frame_that_breaks_rfc_6455_fails_the_connection(
    data: bytes, close_code: int, code: int
) -> None:
    async with serving() as ports:
        raw = await RawWebSocket.open(ports["ws"])
        await raw.write(frame(Opcode.BINARY.value, hello()))
        await raw.read_until(lambda: raw.frames)
        try:
            await raw.stream.send_all(data)
        except trio.BrokenResourceError:
            pass  # the server may close before it has read it all
        close = await raw.closed()
        assert close is not None and close.code == close_code
        errors = [f for f in raw.frames if isinstance(f, ConnError)]
        assert [e.code for e in errors] == [code] and raw.frames[-1] is errors[0]


async def test_a_client_still_sending_its_oversized_message_finishes_and_reads_the_refusal() -> None:
    # The server refuses a message at 1 MiB while the client is still writing the rest of it.
    # Closing with those bytes unread would reset the connection under the client's write
    # (a WebSocket library then reports the broken write and drops the refusal it had
    # received); the server reads and drops them for a while (LINGER_S) instead, so the
    # write completes and the CONN_ERROR and close frame are there to read.
    async with serving() as ports:
        raw = await RawWebSocket.open(ports["ws"])
        await raw.write(frame(Opcode.BINARY.value, hello()))
        await raw.read_until(lambda: raw.frames)
        await raw.stream.send_all(frame(Opcode.BINARY.value, b"\x90" * 4_000_000))  # no reset
        await raw.closed()
        close = raw.protocol.close_rcvd
        assert close is not None and close.code == 1009
        errors = [f for f in raw.frames if isinstance(f, ConnError)]
        assert [e.code for e in errors] == [ErrorCode.FRAME_TOO_LARGE]
        await raw.stream.aclose()


async def test_a_hello_sent_with_the_opening_handshake_is_answered() -> None:
    # RFC 6455 has a client wait for the 101 before it sends frames; one that does not (its
    # HELLO in the same write as its request) is still answered, not timed out: the frames
    # read with the request were lost to websockets' parser.
    async with serving() as ports:
        protocol = ClientProtocol(parse_uri(f"ws://127.0.0.1:{ports['ws']}/"), subprotocols=["rsnet"])  # type: ignore[list-item]  # Subprotocol is a NewType of str
        stream = await trio.open_tcp_stream("127.0.0.1", ports["ws"])
        protocol.send_request(protocol.connect())
        await stream.send_all(b"".join(protocol.data_to_send()) + frame(Opcode.BINARY.value, hello()))
        raw = RawWebSocket(stream, protocol)
        await raw.read_until(lambda: raw.frames)
        assert isinstance(raw.frames[0], Welcome)
        await stream.aclose()


async def test_pings_from_a_peer_that_reads_nothing_queue_a_bounded_amount_of_pongs() -> None:
    """Attack round of session 22: a client sending pings and reading nothing had the server
    queue a pong for each, without bound (41 -> 269 MB in 18 s; server/README promises at most
    64 KiB of answers to a peer that does not read them). Past CONTROL_BACKLOG queued, pings go
    unanswered (RFC 6455 5.5.3)."""
    server = demo_server()
    async with serving(server) as ports:
        raw = await RawWebSocket.open(ports["ws"], receive_buffer=4096)  # and reads nothing
        await raw.stream.send_all(frame(Opcode.BINARY.value, hello()))
        ping = frame(Opcode.PING.value, b"p" * 125)
        for _ in range(16):
            await raw.stream.send_all(ping * 1000)  # 2 MB of pings in all
        await trio.testing.wait_all_tasks_blocked()
        (session,) = server.sessions
        queued = sum(map(len, session.transport._rest))
        assert 0 < queued <= CONTROL_BACKLOG + 65536  # (and the pongs to one read)
        async with rsnet.connect(f"tcp://127.0.0.1:{ports['tcp']}") as conn:  # others are served meanwhile
            assert [x async for x in conn.subscribe("range", {"count": 2})] == [0, 1]
        await raw.stream.aclose()
