"""TCP and TLS byte streams, as :class:`Transport`."""

from __future__ import annotations

import os
import ssl
from collections.abc import Coroutine, Sequence
from typing import Any

import trio

from ..errors import cannot_connect
from .base import STREAM_BROKE, Bytes, Transport, TransportClosed

RECEIVE_SIZE = 65536


def direct_socket(stream: trio.abc.Stream) -> trio.socket.SocketType | None:
    """The socket under ``stream`` if bytes may be written to it directly (a plain TCP stream
    on a POSIX system), else None (TLS: the bytes must go through the TLS layer)."""
    if os.name == "posix" and isinstance(stream, trio.SocketStream):
        return stream.socket
    return None


GATHER_MAX = 512
"""Pieces per gathering write (within every system's IOV_MAX)."""

TLS_WRITE = 64 * 1024
"""Bytes given to the TLS layer at once: it encrypts them into a buffer of its own before it
writes, so a larger write would hold a copy of everything it sends while the peer is slow."""


def write_nowait(sock: trio.socket.SocketType, pieces: Sequence[Bytes]) -> list[Bytes]:
    """Write what the socket takes of ``pieces`` now, in one gathering write (no join), without
    waiting; returns the rest, empty when all went out.

    The caller must be the only writer at that moment (no send in progress). An error
    returns everything: the send that writes the rest reports it. The file descriptor is
    looked up on each call (-1 once the socket is closed), never kept.
    """
    try:
        sent = os.writev(sock.fileno(), pieces[:GATHER_MAX])  # on a socket: sendmsg(2) without flags
    except OSError:  # BlockingIOError (the buffer is full) or a broken connection
        return list(pieces)
    if len(pieces) == 1 and sent == len(pieces[0]):
        return []  # the usual case, one piece written whole: no need to look for a rest
    return after(pieces, sent)


async def send_all_pieces(sock: trio.socket.SocketType, pieces: Sequence[Bytes]) -> None:
    """``send_all`` of the concatenation of ``pieces``, by gathering writes (no join). Raises
    what the socket raises (OSError, trio.ClosedResourceError)."""
    while pieces:
        pieces = after(pieces, await sock.sendmsg(pieces[:GATHER_MAX]))


async def send_all_tls(stream: trio.abc.Stream, pieces: Sequence[Bytes]) -> None:
    """``send_all`` of the concatenation of ``pieces`` through TLS, which encrypts all that one
    call is given into a buffer of its own before writing it: small pieces joined into one
    call, larger ones a TLS_WRITE slice at a time, so a write waiting for a slow peer never
    holds an encrypted copy of everything it sends."""
    if sum(map(len, pieces)) <= TLS_WRITE:
        await stream.send_all(pieces[0] if len(pieces) == 1 else b"".join(pieces))
        return
    for piece in pieces:
        view = memoryview(piece)
        for start in range(0, len(view), TLS_WRITE):
            await stream.send_all(view[start : start + TLS_WRITE])


def after(pieces: Sequence[Bytes], sent: int) -> list[Bytes]:
    """What is left of ``pieces`` once their first ``sent`` bytes are written."""
    index = 0
    while index < len(pieces) and sent >= len(pieces[index]):
        sent -= len(pieces[index])
        index += 1
    rest = list(pieces[index:])
    if sent:
        rest[0] = memoryview(rest[0])[sent:]
    return rest


class SocketReader:
    """``receive_some`` on a trio stream, minus a failing read per wait.

    trio tries a read first and waits for the socket only when that read fails, which costs a
    system call and an exception on every wait, on the path of every round trip. After a read
    that emptied the socket (it returned less than asked), the next one waits for the socket
    first and then reads; after a full read (more is likely waiting), it reads at once. Only
    on a plain socket (TLS reads go through the TLS layer).
    """

    __slots__ = ("_emptied", "_peer", "_socket", "_stream")

    def __init__(self, stream: trio.abc.Stream, peer: str) -> None:
        self._stream = stream
        self._peer = peer
        self._socket = direct_socket(stream)
        self._emptied = False

    async def read(self) -> bytes | bytearray:
        """Up to RECEIVE_SIZE bytes, b"" at end of file; :class:`TransportClosed` if the
        stream broke. (The transports' ``receive`` is this coroutine itself, not one awaiting
        it: each coroutine a wait is nested in costs every round trip about 0.15 us.)"""
        sock = self._socket
        data: bytes | bytearray
        try:
            if sock is not None and self._emptied:
                await trio.lowlevel.wait_readable(sock)
                try:
                    data = os.read(sock.fileno(), RECEIVE_SIZE)  # a socket's read(2) is recv(2)
                except BlockingIOError:  # readable, yet nothing to read after all
                    data = await self._stream.receive_some(RECEIVE_SIZE)
            else:
                data = await self._stream.receive_some(RECEIVE_SIZE)
        except STREAM_BROKE as error:
            raise TransportClosed(f"receive from {self._peer} failed: {error!r}") from error
        self._emptied = len(data) < RECEIVE_SIZE
        return data


class TcpTransport(Transport):
    """A trio ``Stream`` (a TCP socket, or TLS over one) carrying the protocol's byte stream."""

    message_based = False

    def __init__(self, stream: trio.abc.Stream, peer: str = "?") -> None:
        self._stream = stream
        self._peer = peer
        self.half_closable = isinstance(stream, trio.abc.HalfCloseableStream)  # not TLS
        self._direct = direct_socket(stream)
        self._reader = SocketReader(stream, peer)
        # A plain socket's read either returns bytes or is cancelled before it took any (TLS
        # may have decrypted bytes in hand when a cancel lands).
        self.cancel_safe_receive = self._direct is not None
        self._rest: list[Bytes] = []  # taken by send_nowait, not written yet: send writes it first

    @property
    def peer(self) -> str:
        return self._peer

    def receive(self) -> Coroutine[Any, Any, bytes | bytearray]:
        return self._reader.read()

    def send_nowait(self, chunks: Sequence[Bytes]) -> bool:
        if self._rest or self._direct is None:
            self._rest += chunks
            return False
        self._rest = write_nowait(self._direct, chunks)
        return not self._rest

    def interrupt_receive(self) -> None:
        if self._direct is not None:
            # What closing the socket does to its waiters, without closing it: the session
            # still reads it until the peer's end of file before it closes (its linger).
            trio.lowlevel.notify_closing(self._direct)

    async def send(self, chunks: Sequence[Bytes]) -> None:
        pieces: list[Bytes] = [*self._rest, *chunks]
        self._rest = []
        if not pieces:
            await trio.lowlevel.checkpoint()
            return
        try:
            if self._direct is not None:
                # Gathered by the kernel, not joined: a join copied everything unwritten while
                # the write waited (a peer that reads nothing: twice its connection window).
                await send_all_pieces(self._direct, pieces)
            else:
                await send_all_tls(self._stream, pieces)
        except STREAM_BROKE as error:
            raise TransportClosed(f"send to {self._peer} failed: {error!r}") from error

    async def send_eof(self) -> None:
        if isinstance(self._stream, trio.abc.HalfCloseableStream):
            try:
                await self._stream.send_eof()
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                pass

    async def aclose(self) -> None:
        self._rest = []  # never to be written: not to be held either
        if isinstance(self._stream, trio.SocketStream):
            self._stream.socket.close()  # aclose_forcefully without its cancelled checkpoint (~30 µs)
        else:
            await trio.aclose_forcefully(self._stream)


def describe_peer(stream: trio.abc.Stream) -> str:
    """``host:port`` of the remote end of a socket stream (through any TLS layer)."""
    while isinstance(stream, trio.SSLStream):
        stream = stream.transport_stream
    try:
        host, port, *_ = stream.socket.getpeername()  # type: ignore[attr-defined]  # trio.abc.Stream has no .socket; a SocketStream does (AttributeError caught)
    except (AttributeError, OSError):
        return "?"
    return f"{host}:{port}"


async def open_stream(host: str, port: int, ssl_context: ssl.SSLContext | None = None) -> trio.abc.Stream:
    """A connected TCP stream, wrapped in TLS when ``ssl_context`` is given."""
    try:
        stream: trio.abc.Stream = await trio.open_tcp_stream(host, port)
        if ssl_context is not None:
            tls = trio.SSLStream(stream, ssl_context, server_hostname=host)
            await tls.do_handshake()
            stream = tls
    except (OSError, ssl.SSLError, trio.BrokenResourceError) as error:
        # trio reports a failed TLS handshake as BrokenResourceError caused by the SSLError
        reason = error.__cause__ if isinstance(error, trio.BrokenResourceError) and error.__cause__ else error
        raise cannot_connect(f"{host}:{port}", reason) from error
    return stream


async def connect_tcp(host: str, port: int, ssl_context: ssl.SSLContext | None = None) -> TcpTransport:
    """Connect to ``host:port`` over TCP (TLS with ``ssl_context``)."""
    stream = await open_stream(host, port, ssl_context)
    return TcpTransport(stream, f"{host}:{port}")
