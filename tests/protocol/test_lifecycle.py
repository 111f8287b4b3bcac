"""Every stream frame from every end of a stream in every state, sent and received (SPEC 7.3).

The expectation below is SPEC section 7.3's table written out by hand, not read from
``rsnet.protocol.lifecycle``: the connection must refuse to send (``LocalProtocolError``,
nothing written) and answer with a connection ``PROTOCOL_ERROR`` on receipt exactly the frames
the table forbids, and allow all the others.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from rsnet.protocol import (
    Accept,
    Cancel,
    Complete,
    Connection,
    ConnectionClosed,
    ConnError,
    Error,
    ErrorCode,
    LocalProtocolError,
    Next,
    Request,
    encode_frame,
)
from rsnet.protocol.lifecycle import Side, StreamEvent, StreamState

from .support import decode, open_pair, transfer

OPENING, OPEN = StreamState.OPENING, StreamState.OPEN
SUB_OPENER, PUB_ACCEPTOR = Side.SUBSCRIBER_OPENER, Side.PUBLISHER_ACCEPTOR
PUB_OPENER, SUB_ACCEPTOR = Side.PUBLISHER_OPENER, Side.SUBSCRIBER_ACCEPTOR

# SPEC 7.3, from the sender's point of view: which frames it may send, and whether the frame
# ends the stream. ERROR is allowed to everyone at any time; CANCEL to the subscriber side at
# any time; ACCEPT once, by the acceptor; REQUEST by a SUBSCRIBE opener at any time, by an
# OFFER acceptor after its ACCEPT; items and COMPLETE by the publisher side after ACCEPT.
ALLOWED: dict[tuple[Side, StreamState], set[StreamEvent]] = {
    (SUB_OPENER, OPENING): {StreamEvent.REQUEST, StreamEvent.CANCEL, StreamEvent.ERROR},
    (SUB_ACCEPTOR, OPENING): {StreamEvent.ACCEPT, StreamEvent.CANCEL, StreamEvent.ERROR},
    (PUB_OPENER, OPENING): {StreamEvent.ERROR},
    (PUB_ACCEPTOR, OPENING): {StreamEvent.ACCEPT, StreamEvent.ERROR},
    (SUB_OPENER, OPEN): {StreamEvent.REQUEST, StreamEvent.CANCEL, StreamEvent.ERROR},
    (SUB_ACCEPTOR, OPEN): {StreamEvent.REQUEST, StreamEvent.CANCEL, StreamEvent.ERROR},
    (PUB_OPENER, OPEN): {StreamEvent.ITEMS, StreamEvent.COMPLETE, StreamEvent.ERROR},
    (PUB_ACCEPTOR, OPEN): {StreamEvent.ITEMS, StreamEvent.COMPLETE, StreamEvent.ERROR},
}
TERMINAL = {StreamEvent.CANCEL, StreamEvent.COMPLETE, StreamEvent.ERROR}


def stream_in(side: Side, state: StreamState) -> tuple[Connection, Connection, int]:
    """(the end ``side``, its peer, the stream id), the stream in ``state``, demand outstanding."""
    client, server = open_pair()
    if side in (SUB_OPENER, PUB_ACCEPTOR):
        stream_id = client.send_subscribe("ticks", initial_demand=5)
    else:
        stream_id = client.send_offer("sink")
    transfer(client, server)
    if state is OPEN:
        server.send_accept(stream_id)
        if side in (PUB_OPENER, SUB_ACCEPTOR):
            server.send_request(stream_id, 5)
        transfer(server, client)
    return (client, server, stream_id) if side.opened else (server, client, stream_id)


SENDS: dict[StreamEvent, Callable[[Connection, int], None]] = {
    StreamEvent.ACCEPT: lambda conn, sid: conn.send_accept(sid),
    StreamEvent.REQUEST: lambda conn, sid: conn.send_request(sid, 1),
    StreamEvent.ITEMS: lambda conn, sid: conn.send_next(sid, "item"),
    StreamEvent.COMPLETE: lambda conn, sid: conn.send_complete(sid),
    StreamEvent.ERROR: lambda conn, sid: conn.send_error(sid, ErrorCode.APPLICATION_ERROR, "failed"),
    StreamEvent.CANCEL: lambda conn, sid: conn.send_cancel(sid),
}
FRAMES: dict[StreamEvent, Callable[[int], Any]] = {
    StreamEvent.ACCEPT: lambda sid: Accept(sid, {}),
    StreamEvent.REQUEST: lambda sid: Request(sid, 1),
    StreamEvent.ITEMS: lambda sid: Next(sid, "item"),
    StreamEvent.COMPLETE: lambda sid: Complete(sid),
    StreamEvent.ERROR: lambda sid: Error(sid, ErrorCode.APPLICATION_ERROR, "failed", None),
    StreamEvent.CANCEL: lambda sid: Cancel(sid),
}
CASES = [
    pytest.param(side, state, event, id=f"{side.name}-{state.name}-{event.name}")
    for (side, state) in ALLOWED
    for event in StreamEvent
]


@pytest.mark.parametrize(("side", "state", "event"), CASES)
def test_sending(side: Side, state: StreamState, event: StreamEvent) -> None:
    conn, _, stream_id = stream_in(side, state)
    if event in ALLOWED[side, state]:
        SENDS[event](conn, stream_id)
        assert len(decode(bytes(conn.data_to_send()))) == 1
        assert conn.stream_count == (0 if event in TERMINAL else 1)
    else:
        with pytest.raises(LocalProtocolError) as caught:
            SENDS[event](conn, stream_id)
        assert caught.value.code == ErrorCode.PROTOCOL_ERROR
        assert not conn.data_to_send() and conn.stream_count == 1


@pytest.mark.parametrize(("side", "state", "event"), CASES)
def test_receiving(side: Side, state: StreamState, event: StreamEvent) -> None:
    """The peer (the other end, ``side.peer``) sends ``event``: checked from its point of view."""
    receiver, _, stream_id = stream_in(side.peer, state)
    receiver.receive_data(encode_frame(FRAMES[event](stream_id)))
    events = receiver.events_received()
    if event in ALLOWED[side, state]:
        assert not any(isinstance(e, ConnectionClosed) for e in events)
        assert receiver.stream_count == (0 if event in TERMINAL else 1)
    else:
        assert events == [events[-1]] and isinstance(events[-1], ConnectionClosed)
        assert events[-1].code == ErrorCode.PROTOCOL_ERROR and not events[-1].by_peer
        (conn_error,) = decode(bytes(receiver.data_to_send()))
        assert isinstance(conn_error, ConnError) and conn_error.code == ErrorCode.PROTOCOL_ERROR
