"""The broker's error codes: application codes in the protocol's sense (SPEC 11.2, >= 4096).

They travel in ERROR frames with a message and structured ``data``; clients receive them as
:class:`rsnet.StreamError` with ``code`` set to one of these. Where the protocol has a code for
the case it is used instead: ``UNAUTHORIZED`` (not allowed), ``UNKNOWN_PUBLISHER`` (no such
topic), ``REJECTED`` (invalid parameters).
"""

from __future__ import annotations

import enum

from ..errors import register_code_names


class BrokerCode(enum.IntEnum):
    OFFSET_TRIMMED = 4100
    """The requested offset was removed by retention or a purge; ``data.first_available`` says where the log starts."""
    OFFSET_OUT_OF_RANGE = 4101
    """The requested offset is beyond the end of the topic."""
    SLOW_SUBSCRIBER = 4102
    """The subscriber fell more than ``max_lag`` records behind on a ``disconnect`` topic."""
    TOO_MANY_TOPICS = 4103
    """Publishing would create a topic beyond the broker's ``max_topics`` (``data.max_topics``)."""
    OFFSET_DAMAGED = 4110
    """The offset's record was found damaged on disk; ``data`` has the damaged range and the next
    intact offset (subscribe from there to go on)."""
    STORAGE_FULL = 4111
    """The topic's records could not be stored: no space left on the broker's disk (or quota).
    Nothing after the last acknowledged sequence was stored; retry from there later."""
    STORAGE_ERROR = 4112
    """The topic's records could not be stored: the disk failed the write or the sync (EIO, a
    read-only file system...). Nothing after the last acknowledged sequence was stored."""


register_code_names({code.value: code.name for code in BrokerCode})
