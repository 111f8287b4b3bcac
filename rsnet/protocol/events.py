"""The events a :class:`~rsnet.protocol.Connection` reports that are not frames.

Most events are the received frame itself (``Subscribe``, ``Request``, ``Error``...). Two are
not: received items, which the connection gathers per stream, and the end of the connection.

This module imports nothing but the standard library and the protocol's own modules.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from .frames import (
    Accept,
    Cancel,
    Complete,
    Error,
    GoAway,
    Hello,
    Offer,
    Pong,
    Request,
    Subscribe,
    Welcome,
)


@dataclasses.dataclass(slots=True)
class Items:
    """Items received on a stream, in order: the payloads of consecutive NEXT and BATCH frames.

    Every item is within the demand granted (rule 1.1) and not ``None`` (rule 2.13).
    ``nbytes`` is what their frames took on the wire, for a receiver that sizes its demand
    in bytes (rsnet's clients do): exact for BATCH frames and for a run of NEXT frames that
    ends with the received data; where NEXT frames of one stream are followed by another
    frame in the same data, that frame's bytes count for both (an estimate that can only be
    high: the decoder is not asked for a position per NEXT frame, which would slow every item).
    """

    stream_id: int
    items: list[Any]
    nbytes: int = dataclasses.field(default=0, compare=False)


@dataclasses.dataclass(frozen=True, slots=True)
class ConnectionClosed:
    """The connection is over; every stream on it ended with it.

    ``code`` is the error code of the CONN_ERROR frame that ended it, or ``None`` when the
    transport reached end of file. ``by_peer`` is false when this side detected a violation
    and sent the CONN_ERROR itself (it is already in ``data_to_send()``).
    """

    code: int | None
    message: str
    data: Any = None
    by_peer: bool = True


Event = (
    Hello
    | Welcome
    | Pong
    | GoAway
    | ConnectionClosed
    | Subscribe
    | Offer
    | Accept
    | Request
    | Cancel
    | Items
    | Complete
    | Error
)
