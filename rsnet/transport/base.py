"""The transport contract every I/O flavour implements."""

from __future__ import annotations

import abc
import ssl
from collections.abc import Sequence

import trio

from ..errors import TransportClosed

__all__ = ["STREAM_BROKE", "Bytes", "Transport", "TransportClosed"]

STREAM_BROKE = (trio.BrokenResourceError, trio.ClosedResourceError, ssl.SSLError, OSError)
"""What a trio stream (a socket, TLS over one) raises when the connection under it is gone:
each transport reports it as :class:`TransportClosed`."""

Bytes = bytes | bytearray | memoryview
"""What a transport sends: any bytes-like chunk (the protocol hands over views of its buffer)."""


class Transport(abc.ABC):
    """A bidirectional channel for protocol bytes.

    ``message_based`` tells the connection driver how to hand bytes over: ``False`` (TCP):
    any chunks, concatenated on the wire; ``True`` (WebSocket): each chunk is one message and
    must hold whole frames. One task may receive while another sends; at most one of each.
    """

    message_based: bool = False
    half_closable: bool = True
    """Whether :meth:`send_eof` really half-closes (so lingering for the peer's close is quick)."""
    cancel_safe_receive: bool = False
    """Whether a cancelled :meth:`receive` loses no byte, so that any one task at a time may
    call it (a session lets a waiting consumer read in its reader's place)."""

    @abc.abstractmethod
    async def receive(self) -> Bytes:
        """The next received bytes; empty at end of file. On a message transport, the payload
        of its messages as it arrives, not necessarily message by message: the protocol's
        decoder reads a byte stream, and messages hold whole frames (SPEC 2.2).

        Raises :class:`TransportClosed` if the transport broke.
        """

    def interrupt_receive(self) -> None:
        """Make a :meth:`receive` waiting in another task raise :class:`TransportClosed` now:
        the connection is ending, and the transport is about to be closed. Only where
        :attr:`cancel_safe_receive` (the receive loses nothing); later receives work as before."""
        raise NotImplementedError(f"{type(self).__name__} has no receive that may be interrupted")

    @abc.abstractmethod
    async def send(self, chunks: Sequence[Bytes]) -> None:
        """Send ``chunks`` in order, as one write where possible.

        Raises :class:`TransportClosed` if the transport broke.
        """

    @abc.abstractmethod
    def send_nowait(self, chunks: Sequence[Bytes]) -> bool:
        """Start sending ``chunks`` without waiting; True if they are all written.

        Writes what the connection takes at once and keeps the rest, which the next
        :meth:`send` (with no chunks, if there is nothing new) writes before anything else;
        False says such a rest is waiting. For the caller that must not block (a reader
        answering what it read); only while no :meth:`send` is in progress. Never raises: a
        broken transport is reported by the :meth:`send` that follows.
        """

    @abc.abstractmethod
    async def send_eof(self) -> None:
        """Tell the peer we will send nothing more, keeping the receiving side open.

        Best effort: a no-op where the transport cannot half-close (TLS).
        """

    @abc.abstractmethod
    async def aclose(self) -> None:
        """Close the transport (after flushing what was sent). Idempotent."""

    @property
    @abc.abstractmethod
    def peer(self) -> str:
        """A printable address of the other end, for logs."""
