"""Errors that cross the network, as the application sees them: one tree.

::

    RsnetError                    the root: ``except rsnet.RsnetError`` catches every one below
    ├── StreamError               one stream ended with a code: a remote on_error, a rejection
    │                             (UNKNOWN_PUBLISHER, UNAUTHORIZED, ...) or a violation;
    │                             ``.code``, ``.code_name``, ``.message``, ``.data``
    ├── ConnectionLost            the connection is gone; every stream on it ended. ``.code``: the
    │   │                         CONN_ERROR code it was closed with, if any
    │   ├── HandshakeError        refused (``.code`` says why: UNAUTHORIZED, UNSUPPORTED_VERSION,
    │   │                         GOING_AWAY), timed out (TIMEOUT), or cut off during the handshake
    │   └── TransportClosed       the transport could not be opened, broke, or was closed under
    │                             us (refused, reset, TLS or WebSocket failure)
    └── ProtocolError             a violation of the wire protocol (``rsnet.protocol``), with the
        ├── RemoteProtocolError   code the spec assigns: by the peer (never escapes a connection:
        └── LocalProtocolError    it is answered with CONN_ERROR) or asked of us locally

A remote ``on_error`` arrives as a :class:`StreamError` carrying the protocol's error code
(``protocol/SPEC.md`` section 11), message and structured data, whatever the code: unknown
codes are delivered unchanged, never dropped. Both clients, the trio one and the blocking one,
raise exactly these types. These classes import no I/O library.

To choose the code a local publisher's failure is sent with, fail it with a
:class:`StreamError` (``code`` >= 4096 for application codes); any other exception is sent as
``APPLICATION_ERROR`` (4096) with its type and message.
"""

from __future__ import annotations

import contextlib
import os
import socket
import ssl
from collections.abc import Iterator, Mapping
from typing import Any

from .protocol import ErrorCode, LocalProtocolError, ProtocolError, RemoteProtocolError, RsnetError


class StreamError(RsnetError):
    """A stream ended with an error code: a remote ``on_error``, a rejection, or a violation."""

    def __init__(self, code: int, message: str = "", data: Any = None) -> None:
        super().__init__(code, message, data)
        self.code = code
        self.message = message
        self.data = data

    @property
    def code_name(self) -> str:
        """The code's name: the protocol's (SPEC 11), an application code's a library registered
        with :func:`register_code_names` (the broker's are, once ``rsnet.broker`` is imported),
        or ``application error N``."""
        try:
            return ErrorCode(self.code).name
        except ValueError:
            return _APPLICATION_CODE_NAMES.get(self.code, f"application error {self.code}")

    def __str__(self) -> str:
        return f"{self.code_name}: {self.message}" if self.message else self.code_name


class ConnectionLost(RsnetError):
    """The connection ended (closed, reset, timed out, or closed with an error) mid-stream.

    ``code`` is the CONN_ERROR code if the connection was closed with one, else ``None``.
    """

    def __init__(self, message: str, code: int | None = None, data: Any = None) -> None:
        super().__init__(message)
        self.code = code
        self.data = data


class HandshakeError(ConnectionLost):
    """The handshake failed: refused by the peer (``code`` says why), timed out, or cut off."""


class TransportClosed(ConnectionLost):
    """The transport failed or was closed under us (reset, TLS failure, WebSocket close), or
    could not be opened at all."""


def cannot_connect(peer: str, error: BaseException) -> TransportClosed:
    """What a failed attempt to reach ``peer`` raises, saying why as the system does ("cannot
    connect to HOST:PORT: Connection refused"), the same from the trio client (whose
    "all attempts to connect ... failed" holds the reasons) and the blocking one."""
    reason: BaseException = error
    if isinstance(error.__cause__, BaseExceptionGroup):  # trio: one failure per address tried
        reason = next((e for e in error.__cause__.exceptions if isinstance(e, OSError)), error)
    if isinstance(reason, OSError) and not isinstance(reason, ssl.SSLError) and reason.errno:
        # (trio's own text repeats the address.) A name lookup's error has an EAI code as its
        # errno, which os.strerror does not know ("Unknown error -2"): its own text says it.
        text = reason.strerror if isinstance(reason, socket.gaierror) else os.strerror(reason.errno)
    else:
        text = str(reason) or type(reason).__name__
    return TransportClosed(f"cannot connect to {peer}: {text}")


_APPLICATION_CODE_NAMES: dict[int, str] = {}


def register_code_names(names: Mapping[int, str]) -> None:
    """Name application codes (4096 and up) in messages, as a library with codes of its own
    documents them (``rsnet.broker.codes`` registers the broker's, BROKER.md). A code keeps the
    first name it was given; protocol codes cannot be renamed."""
    for code, name in names.items():
        if code < ErrorCode.APPLICATION_ERROR:
            raise ValueError(f"{code} is a protocol code, not an application code")
        _APPLICATION_CODE_NAMES.setdefault(code, name)


def error_frame_fields(error: BaseException) -> tuple[int, str, Any]:
    """``(code, message, data)`` to send for a local publisher's ``on_error``."""
    if isinstance(error, StreamError):
        return error.code, error.message, error.data
    return ErrorCode.APPLICATION_ERROR, f"{type(error).__name__}: {error}", {"type": type(error).__name__}


@contextlib.contextmanager
def single_errors() -> Iterator[None]:
    """Re-raise a lone exception out of the group a nursery wrapped it in.

    For APIs whose caller's code runs inside a nursery of theirs (``async with connect()``):
    ``except ConnectionLost`` around them should work. One exception that several tasks
    raised (a connection's end, which every stream on it reports with the same error) is one
    too. Several errors stay a group.
    """
    try:
        yield
    except BaseExceptionGroup as group:
        first = group.exceptions[0]
        if all(error is first for error in group.exceptions):
            raise first from None
        raise


__all__ = [
    "ConnectionLost",
    "HandshakeError",
    "LocalProtocolError",
    "ProtocolError",
    "RemoteProtocolError",
    "RsnetError",
    "StreamError",
    "TransportClosed",
    "error_frame_fields",
    "register_code_names",
    "single_errors",
]
