"""Transports: how protocol bytes travel. TCP (optionally TLS) and WebSocket, on trio.

A :class:`Transport` moves opaque chunks; it knows nothing of frames or streams. Byte-stream
transports carry any chunking; message transports (WebSocket) carry one protocol chunk per
message, so the caller hands them whole frames grouped into messages (SPEC.md section 2.2).

Layering: imports trio and websockets' sans-I/O core; never rsnet.net, rsnet.broker or the CLI.
"""

from .base import Transport, TransportClosed
from .tcp import TcpTransport, connect_tcp
from .websocket import ConnErrorEncoder, WebSocketProtocolError, WebSocketTransport, accept_websocket, connect_websocket

__all__ = [
    "ConnErrorEncoder",
    "TcpTransport",
    "Transport",
    "TransportClosed",
    "WebSocketProtocolError",
    "WebSocketTransport",
    "accept_websocket",
    "connect_tcp",
    "connect_websocket",
]
