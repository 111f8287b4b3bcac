"""Blocking transports for the blocking client: TCP, TLS, and WebSocket over either.

A transport moves protocol bytes over one socket owned by the calling thread; it knows nothing
of frames or streams. Every wait is bounded by the timeout it is given: ``receive`` raises
:class:`TimeoutError` when nothing arrived in time, and a send that makes no progress for
``send_timeout`` seconds ends the connection (a frame cut in half cannot be resumed). A broken
transport raises :class:`~rsnet.errors.TransportClosed` (a ConnectionLost), as the trio
transports do.

WebSocket runs websockets' sans-I/O ``ClientProtocol`` directly on the socket, binary messages
only, subprotocol ``rsnet`` (SPEC.md section 2.2), as the trio transport does.

This module must never import trio or asyncio.
"""

from __future__ import annotations

import socket
import ssl
import time
from collections.abc import Sequence

from websockets.client import ClientProtocol
from websockets.exceptions import InvalidURI
from websockets.frames import Frame, Opcode
from websockets.protocol import State
from websockets.typing import Subprotocol
from websockets.uri import parse_uri

from ..client_rules import parse_endpoint
from ..errors import TransportClosed, cannot_connect

RECEIVE_SIZE = 65536
SUBPROTOCOL = Subprotocol("rsnet")


def _recv(sock: socket.socket, timeout: float | None, peer: str) -> bytes:
    """One ``recv``: the bytes (``b""`` at end of file) or TimeoutError; 0 means do not wait."""
    try:
        sock.settimeout(timeout)
        return sock.recv(RECEIVE_SIZE)
    except (TimeoutError, BlockingIOError, ssl.SSLWantReadError):
        # A zero timeout makes the socket non-blocking: "nothing yet" is then EAGAIN.
        raise TimeoutError from None
    except OSError as error:
        raise TransportClosed(f"receive from {peer} failed: {error!r}") from error


def _send_all(sock: socket.socket, data: bytes | bytearray | memoryview, timeout: float | None, peer: str) -> None:
    """Send everything; give up after ``timeout`` seconds without progress (not in total, so
    that a large write on a slow but live link is not mistaken for a dead peer)."""
    view = memoryview(data)
    try:
        while view:
            sock.settimeout(timeout)
            view = view[sock.send(view) :]
    except TimeoutError as error:
        raise TransportClosed(f"send to {peer} made no progress for {timeout:g} s") from error
    except OSError as error:
        raise TransportClosed(f"send to {peer} failed: {error!r}") from error


def _drain(sock: socket.socket, seconds: float) -> None:
    """Read and discard until the peer closes, for at most ``seconds``: closing a socket with
    unread data makes the kernel send a reset, which can destroy our last frame (a CONN_ERROR
    or GO_AWAY) in the peer's receive buffer before it was read."""
    deadline = time.monotonic() + seconds
    try:
        while (remaining := deadline - time.monotonic()) > 0:
            sock.settimeout(remaining)
            if not sock.recv(RECEIVE_SIZE):
                return
    except OSError:
        return


class BlockingSocketTransport:
    """TCP, or TLS over TCP: the protocol's byte stream as is."""

    message_based = False

    def __init__(self, sock: socket.socket, peer: str, send_timeout: float | None) -> None:
        self.peer = peer
        self.send_timeout = send_timeout
        self._sock = sock

    def send(self, chunks: Sequence[bytes | bytearray | memoryview]) -> None:
        _send_all(self._sock, chunks[0] if len(chunks) == 1 else b"".join(chunks), self.send_timeout, self.peer)

    def receive(self, timeout: float | None) -> bytes | None:
        """Bytes from the peer, or ``None`` at end of file; TimeoutError if none in time."""
        return _recv(self._sock, timeout, self.peer) or None

    def close(self, linger: float = 0.0) -> None:
        """Close; with ``linger``, first half-close and wait that long for the peer to close."""
        if linger:
            try:
                if isinstance(self._sock, ssl.SSLSocket):
                    # TLS's half-close is close_notify; unwrap sends it and waits for the
                    # server's. Without it the server, lingering for our end of file as we
                    # linger for its, would keep both waiting out the whole linger.
                    self._sock.settimeout(linger)
                    self._sock.unwrap()
                else:
                    self._sock.shutdown(socket.SHUT_WR)
            except (OSError, ValueError):
                pass
            _drain(self._sock, linger)
        self._sock.close()


class BlockingWebSocketTransport:
    """A WebSocket: each ``send`` chunk is one binary message; ``receive`` returns the payload
    of the binary frames that arrived, concatenated (frames never span messages, SPEC 2.2,
    so the protocol's byte-stream decoder reads them as one stream)."""

    message_based = True

    def __init__(self, sock: socket.socket, protocol: ClientProtocol, peer: str, send_timeout: float | None) -> None:
        self.peer = peer
        self.send_timeout = send_timeout
        self._sock = sock
        self._protocol = protocol
        self._payload = bytearray()
        self._eof = False

    def send(self, chunks: Sequence[bytes | bytearray | memoryview]) -> None:
        if self._protocol.state is not State.OPEN:
            raise TransportClosed(f"the WebSocket to {self.peer} is closing")
        for chunk in chunks:
            self._protocol.send_binary(chunk)
        self._write()

    def receive(self, timeout: float | None) -> bytes | bytearray | None:
        """Protocol bytes from the peer (``b""`` when only WebSocket-level bytes, such as a
        ping or part of a frame, arrived), or ``None`` once the WebSocket closed; TimeoutError
        if nothing at all arrived in time."""
        if not self._payload and self._eof:
            return None
        if not self._payload:
            self._receive_into_payload(timeout)
        payload, self._payload = self._payload, bytearray()
        return payload if payload or not self._eof else None

    def _receive_into_payload(self, timeout: float | None) -> None:
        protocol = self._protocol
        data = _recv(self._sock, timeout, self.peer)
        if data:
            protocol.receive_data(data)
        else:
            protocol.receive_eof()
        for event in protocol.events_received():
            if not isinstance(event, Frame):
                continue  # the handshake's Response
            if event.opcode is Opcode.TEXT:
                protocol.fail(1003, "rsnet uses binary messages only")
                self._write()
                raise TransportClosed(f"{self.peer} sent a text message")
            if event.opcode in (Opcode.BINARY, Opcode.CONT):
                self._payload += event.data
        self._write()  # pongs and the closing handshake's reply
        if not data or protocol.state not in (State.CONNECTING, State.OPEN):
            self._eof = True

    def _write(self) -> None:
        data = b"".join(self._protocol.data_to_send())
        if data:
            _send_all(self._sock, data, self.send_timeout, self.peer)

    def handshake(self, deadline: float) -> None:
        """Run the opening handshake (the request is already queued) until ``deadline``."""
        protocol = self._protocol
        self._write()
        while protocol.state is State.CONNECTING:
            if self._eof:
                raise TransportClosed(f"{self.peer} closed during the WebSocket handshake")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TransportClosed(f"WebSocket handshake with {self.peer} timed out")
            try:
                self._receive_into_payload(remaining)
            except TimeoutError:
                continue
        if protocol.state is not State.OPEN:
            raise TransportClosed(f"WebSocket handshake with {self.peer} failed: {protocol.handshake_exc}")

    def close(self, linger: float = 0.0) -> None:
        """Close; with ``linger``, first start the closing handshake and wait that long for
        the peer to close the connection."""
        if linger and self._protocol.state is State.OPEN:
            self._protocol.send_close(1000)
            try:
                self._write()
            except TransportClosed:
                pass
            else:
                _drain(self._sock, linger)
        self._sock.close()


BlockingTransport = BlockingSocketTransport | BlockingWebSocketTransport


def open_transport(
    url: str, *, ssl_context: ssl.SSLContext | None, max_frame_size: int, deadline: float
) -> BlockingTransport:
    """Connect to ``url`` (see :func:`rsnet.client_rules.parse_endpoint`) and complete TLS and
    WebSocket handshakes before ``deadline`` (a ``time.monotonic()`` value).

    Raises ValueError for a URL it cannot use, TransportClosed if the server cannot be reached
    or a handshake fails or times out.
    """
    endpoint = parse_endpoint(url)
    host, port, peer, secure = endpoint.host, endpoint.port, endpoint.peer, endpoint.secure
    try:
        sock = socket.create_connection((host, port), timeout=max(deadline - time.monotonic(), 0.001))
    except OSError as error:
        raise cannot_connect(peer, error) from error
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # REQUEST frames are latency
        if secure:
            context = ssl_context if ssl_context is not None else ssl.create_default_context()
            sock.settimeout(max(deadline - time.monotonic(), 0.001))
            sock = context.wrap_socket(sock, server_hostname=host)
    except (OSError, ValueError) as error:
        sock.close()
        raise TransportClosed(f"cannot connect to {peer}: {error}") from error
    send_timeout = max(deadline - time.monotonic(), 0.001)
    if not endpoint.websocket:
        return BlockingSocketTransport(sock, peer, send_timeout)
    try:
        protocol = ClientProtocol(parse_uri(url), subprotocols=[SUBPROTOCOL], max_size=max_frame_size)
    except InvalidURI as error:
        sock.close()
        raise ValueError(f"not a WebSocket URL: {url!r}") from error
    protocol.send_request(protocol.connect())
    transport = BlockingWebSocketTransport(sock, protocol, peer, send_timeout)
    try:
        transport.handshake(deadline)
    except TransportClosed:
        sock.close()
        raise
    return transport
