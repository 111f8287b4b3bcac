"""Error codes of wire protocol v1 and the exceptions that carry them.

The numbers are the contract (protocol/SPEC.md, "Error codes"); the names are Python's.
Codes 1-4095 belong to the protocol, 4096 and above to applications. A receiver delivers every
code it gets, known or not, so an application code is never dropped.

This module imports nothing but the standard library.
"""

from __future__ import annotations

import enum


class ErrorCode(enum.IntEnum):
    """The protocol's error codes; any int from ``APPLICATION_ERROR`` up is an application code."""

    PROTOCOL_ERROR = 1
    FLOW_CONTROL = 2
    INVALID_REQUEST = 3
    FRAME_TOO_LARGE = 4
    UNSUPPORTED_VERSION = 5
    UNAUTHORIZED = 6
    UNKNOWN_PUBLISHER = 7
    REJECTED = 8
    TOO_MANY_STREAMS = 9
    GOING_AWAY = 10
    TIMEOUT = 11
    INTERNAL = 12
    APPLICATION_ERROR = 4096


class RsnetError(Exception):
    """The root of every error rsnet raises about the network: the protocol's, the
    connection's and the streams'. Defined here, at the bottom of the layers, so that the
    sans-I/O protocol's errors belong to the same tree; :mod:`rsnet.errors` documents the tree."""


class ProtocolError(RsnetError):
    """A violation of the wire protocol, with the error code the spec assigns to it.

    ``code`` is an ``int`` (an :class:`ErrorCode` for the protocol's own codes).
    """

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    def __repr__(self) -> str:
        return f"{type(self).__name__}({_code_name(self.code)}, {self.message!r})"


class RemoteProtocolError(ProtocolError):
    """The peer broke the protocol: raised by the decoder and frame parser on bad input.

    :class:`~rsnet.protocol.Connection` never lets it escape ``receive_data``: it answers the
    peer with the code and reports a :class:`~rsnet.protocol.ConnectionClosed` event instead.
    """


class LocalProtocolError(ProtocolError):
    """We asked the connection to do something the protocol forbids; nothing was sent.

    Examples: a NEXT beyond the demand the peer granted (code ``FLOW_CONTROL``), a frame larger
    than the peer accepts (``FRAME_TOO_LARGE``), a ``None`` item (``PROTOCOL_ERROR``). The
    connection's state is unchanged, so the caller can recover, e.g. by sending an ERROR.
    """


def _code_name(code: int) -> str:
    try:
        return ErrorCode(code).name
    except ValueError:
        return str(code)
