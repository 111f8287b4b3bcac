"""Topic administration over the wire: subscribe to ``$admin`` with ``{"action", "topic"}``.

- ``create``: open the topic with the settings the broker's configuration gives its name
  (``[[topics]]`` patterns, ``[topic_defaults]``); settings cannot be chosen at runtime, so
  that a restart never changes them. Creating a topic that exists changes nothing.
- ``delete``: remove the topic and everything stored of it (records, cursors, its directory);
  its producers and readers end with ``UNKNOWN_PUBLISHER``.
- ``purge``: delete, then create again, empty: offsets start at 0 again, and a reader that
  resumes at an older position gets ``OFFSET_OUT_OF_RANGE`` (never records it did not ask for).

The answer is one item, ``{"action", "topic", "created"|"removed", "next_offset"}``, then
complete. Allowed to holders of an ``admin`` grant covering the topic (``[[auth.tokens]]``
``admin = ["sensors.>"]``); with auth off, to everyone, like everything else.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..errors import StreamError
from ..protocol import ErrorCode

if TYPE_CHECKING:
    from .broker import Broker

ACTIONS = ("create", "delete", "purge")


def administer(broker: Broker, action: Any, name: str) -> dict[str, Any]:
    """Carry out ``action`` on topic ``name`` (already validated and authorized)."""
    if action not in ACTIONS:
        raise StreamError(ErrorCode.REJECTED, f"$admin action must be one of {', '.join(ACTIONS)}, got {action!r}")
    existed = broker.exists(name)
    if action == "create":
        topic = broker.topic(name, create=True)
        assert topic is not None
        return {"action": action, "topic": name, "created": not existed, "next_offset": topic.log.next_offset}
    existing = broker.topic(name, create=False)  # opened if it is stored and closed
    if existing is None:
        raise StreamError(ErrorCode.UNKNOWN_PUBLISHER, f"no topic named {name!r}", {"topic": name})
    removed = existing.log.next_offset - existing.log.first_offset
    broker.delete_topic(existing)
    next_offset = 0
    if action == "purge":
        topic = broker.topic(name, create=True)
        assert topic is not None
        next_offset = topic.log.next_offset
    return {"action": action, "topic": name, "removed": removed, "next_offset": next_offset}
