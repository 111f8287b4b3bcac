"""rsnet wire protocol v1, without I/O: frames, codec, and the connection state machine.

``protocol/SPEC.md`` is the contract; ``protocol/vectors/`` are its conformance tests. A
transport (TCP, WebSocket, a blocking socket in a Spark worker) drives a :class:`Connection`:

    conn = Connection(Role.CLIENT)
    sock.send(conn.data_to_send())            # the HELLO
    conn.receive_data(sock.recv(65536))
    for event in conn.events_received(): ...  # Welcome, Items, Complete, ...

This package must never import trio, asyncio, sockets, threads or clocks; a test checks it.
"""

from .codec import Encoded, FrameDecoder, encode_frame, text_keys
from .connection import Connection, Role, State
from .errors import ErrorCode, LocalProtocolError, ProtocolError, RemoteProtocolError, RsnetError
from .events import ConnectionClosed, Event, Items
from .frames import (
    DEFAULT_HANDSHAKE_TIMEOUT,
    DEFAULT_KEEPALIVE_INTERVAL,
    DEFAULT_MAX_FRAME_SIZE,
    DEFAULT_MAX_STREAMS,
    MAX_ERROR_DATA,
    MAX_ERROR_MESSAGE,
    MAX_INT,
    MAX_SETTING,
    MIN_MAX_FRAME_SIZE,
    PROTOCOL_VERSION,
    TRUNCATED,
    Accept,
    Batch,
    Cancel,
    Complete,
    ConnError,
    Error,
    Frame,
    FrameType,
    GoAway,
    Hello,
    Next,
    Offer,
    Ping,
    Pong,
    Request,
    Subscribe,
    Welcome,
    frame_fields,
    parse_frame,
)

__all__ = [
    "DEFAULT_HANDSHAKE_TIMEOUT",
    "DEFAULT_KEEPALIVE_INTERVAL",
    "DEFAULT_MAX_FRAME_SIZE",
    "DEFAULT_MAX_STREAMS",
    "MAX_ERROR_DATA",
    "MAX_ERROR_MESSAGE",
    "MAX_INT",
    "MAX_SETTING",
    "MIN_MAX_FRAME_SIZE",
    "PROTOCOL_VERSION",
    "TRUNCATED",
    "Accept",
    "Batch",
    "Cancel",
    "Complete",
    "ConnError",
    "Connection",
    "ConnectionClosed",
    "Encoded",
    "Error",
    "ErrorCode",
    "Event",
    "Frame",
    "FrameDecoder",
    "FrameType",
    "GoAway",
    "Hello",
    "Items",
    "LocalProtocolError",
    "Next",
    "Offer",
    "Ping",
    "Pong",
    "ProtocolError",
    "RemoteProtocolError",
    "Request",
    "Role",
    "RsnetError",
    "State",
    "Subscribe",
    "Welcome",
    "encode_frame",
    "frame_fields",
    "parse_frame",
    "text_keys",
]
