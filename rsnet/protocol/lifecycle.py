"""The lifecycle of one stream as a table: its states, the frames that move it, and who may send them.

SPEC "Streams" written down once, as h11's ``_state.py`` does for HTTP/1.1: the connection
asks :func:`transition` before it writes or accepts any stream frame and never re-tests flags
by hand. A frame the table does not allow is a protocol violation, whoever sent it; what the
connection then does (refuse to write it, or close the connection) is its business.

A stream has two ends, and which frames an end may send depends on two facts about it: does it
publish or subscribe, and did it open the stream (SUBSCRIBE, OFFER) or was it asked to accept
it? That gives four :class:`Side` values; a stream's two ends are always opposite on both.

What the table does not cover, because it depends on values rather than on the frame's kind:
demand (rule 1.1, ``FLOW_CONTROL``), nil items (rule 2.13), ``request(n <= 0)`` (rule 3.9,
``INVALID_REQUEST``), and frames for a stream that has already ended (dropped, rule 2.8).

This module imports nothing but the standard library.
"""

from __future__ import annotations

import enum


class StreamState(enum.Enum):
    """Where a stream is in its life."""

    # The members key the tables below, looked up for every stream frame: object's C hash
    # instead of Enum's Python-level one (members compare by identity either way).
    __hash__ = object.__hash__

    OPENING = "opening"
    """SUBSCRIBE or OFFER was sent; the accepting end has not answered yet."""
    OPEN = "open"
    """ACCEPT was sent: the remote ``on_subscribe`` happened, items may flow."""
    CLOSED = "closed"
    """Ended by CANCEL, COMPLETE or ERROR; nothing more may be sent on it (ids are not reused)."""


class StreamEvent(enum.Enum):
    """A stream frame, by what it does to the lifecycle (NEXT and BATCH are both ITEMS)."""

    __hash__ = object.__hash__  # as StreamState's

    ACCEPT = "ACCEPT"
    REQUEST = "REQUEST"
    ITEMS = "NEXT/BATCH"
    COMPLETE = "COMPLETE"
    ERROR = "ERROR"
    CANCEL = "CANCEL"


class Side(enum.Enum):
    """One end of a stream: whether it publishes, and whether it opened the stream."""

    __hash__ = object.__hash__  # as StreamState's

    SUBSCRIBER_OPENER = "sent SUBSCRIBE"
    PUBLISHER_ACCEPTOR = "received SUBSCRIBE"
    PUBLISHER_OPENER = "sent OFFER"
    SUBSCRIBER_ACCEPTOR = "received OFFER"

    @property
    def publishes(self) -> bool:
        return self in (Side.PUBLISHER_ACCEPTOR, Side.PUBLISHER_OPENER)

    @property
    def opened(self) -> bool:
        return self in (Side.SUBSCRIBER_OPENER, Side.PUBLISHER_OPENER)

    @property
    def peer(self) -> Side:
        """The other end of the same stream."""
        return _PEER[self]


_PEER = {
    Side.SUBSCRIBER_OPENER: Side.PUBLISHER_ACCEPTOR,
    Side.PUBLISHER_ACCEPTOR: Side.SUBSCRIBER_OPENER,
    Side.PUBLISHER_OPENER: Side.SUBSCRIBER_ACCEPTOR,
    Side.SUBSCRIBER_ACCEPTOR: Side.PUBLISHER_OPENER,
}

_O, _A, _C = StreamState.OPENING, StreamState.OPEN, StreamState.CLOSED
_E = StreamEvent

# (the sender's side, the stream's state) -> {frame the sender may send: the state after it}.
# Why each entry is there:
# - Only the accepting end sends ACCEPT, once (it is the remote on_subscribe, rule 1.9).
# - A subscriber that opened with SUBSCRIBE may REQUEST before ACCEPT (demand may even ride on
#   the SUBSCRIBE); one that was offered a publisher requests only after accepting it.
# - A subscriber may CANCEL at any time (rule 3.5), even before the publisher accepted.
# - Items and COMPLETE only after ACCEPT, and only from the publisher (rules 1.1, 1.3, 1.9).
# - ERROR from either end at any time: publisher's on_error, a rejection, or a cancel with a reason.
TRANSITIONS: dict[tuple[Side, StreamState], dict[StreamEvent, StreamState]] = {
    (Side.SUBSCRIBER_OPENER, _O): {_E.REQUEST: _O, _E.CANCEL: _C, _E.ERROR: _C},
    (Side.SUBSCRIBER_ACCEPTOR, _O): {_E.ACCEPT: _A, _E.CANCEL: _C, _E.ERROR: _C},
    (Side.PUBLISHER_OPENER, _O): {_E.ERROR: _C},
    (Side.PUBLISHER_ACCEPTOR, _O): {_E.ACCEPT: _A, _E.ERROR: _C},
    (Side.SUBSCRIBER_OPENER, _A): {_E.REQUEST: _A, _E.CANCEL: _C, _E.ERROR: _C},
    (Side.SUBSCRIBER_ACCEPTOR, _A): {_E.REQUEST: _A, _E.CANCEL: _C, _E.ERROR: _C},
    (Side.PUBLISHER_OPENER, _A): {_E.ITEMS: _A, _E.COMPLETE: _C, _E.ERROR: _C},
    (Side.PUBLISHER_ACCEPTOR, _A): {_E.ITEMS: _A, _E.COMPLETE: _C, _E.ERROR: _C},
}
"""Every allowed transition; a CLOSED stream allows none."""


_NONE: dict[StreamEvent, StreamState] = {}


def allowed(sender: Side, state: StreamState) -> dict[StreamEvent, StreamState]:
    """What ``sender`` may send in ``state``: each frame it may send, and the state after it.

    The connection keeps this row per stream end and looks each frame up in it. Do not
    modify the returned mapping: it is the table's own.
    """
    return TRANSITIONS.get((sender, state), _NONE)


def transition(sender: Side, state: StreamState, event: StreamEvent) -> StreamState | None:
    """The state after ``sender`` sends ``event`` in ``state``, or ``None`` if it may not."""
    return allowed(sender, state).get(event)
