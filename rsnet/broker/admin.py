"""Topic administration over the wire: subscribe to ``$admin`` with ``{"action", "topic", ...}``.

- ``create`` (optional ``settings``, see :mod:`rsnet.broker.overrides`): make the topic, with
  the settings given winning over the configuration's, for good (they are stored with the
  topic and survive restarts). Creating a topic that exists changes nothing and succeeds if
  every setting given already has that value (scripts may create what they need at every
  start, as with JetStream's stream add); a setting with another value is refused
  (``REJECTED``): ``create`` never changes a topic, ``alter`` does.
- ``alter`` (``settings`` and/or ``reset``, a list of dotted keys that go back to following
  the configuration): change an existing topic's settings, stored first, then applied to the
  live topic at once: its producers and subscribers carry on under the new policy, lag bound
  and retention (the broker's next retention sweep applies the new limits). Its storage
  (memory or durable) is fixed when it is created.
- ``delete``: remove the topic and everything stored of it (records, cursors, settings, its
  directory); its producers and readers end with ``UNKNOWN_PUBLISHER``. Its next offset is
  kept: a topic created under its name starts there (:mod:`rsnet.broker.retired`).
- ``purge``: remove every record, keeping the topic, its settings, cursors and offsets: the
  next record gets the offset the next would have had (as JetStream's stream purge keeps its
  sequence numbers, and Kafka's delete-records its offsets), so an offset is never given to
  other data. Producers and readers carry on; a reader (or a cursor, or a Spark checkpoint)
  behind the new start is told ``OFFSET_TRIMMED``, as after retention.

The answer is one item, then complete: ``{"action", "topic", "next_offset"}`` with
``"created": bool`` (create), ``"changed": [keys]`` (alter) or ``"removed": n`` (delete,
purge; ``next_offset`` is then where the topic, or one created under its name, goes on),
and for create and alter the topic's effective ``settings`` and ``settings_from``
(as ``$topics`` shows them). Allowed to holders of an ``admin`` grant covering the topic
(``[[auth.tokens]]`` ``admin = ["sensors.>"]``); with auth off, to everyone, like everything
else. Invalid settings are refused with ``REJECTED`` naming each key and what it accepts.
"""

from __future__ import annotations

import reprlib
from typing import TYPE_CHECKING, Any

from ..errors import StreamError
from ..protocol import ErrorCode
from .overrides import KEYS, InvalidSettings, effective, parse
from .storage import StorageError
from .topic import storage_refusal

if TYPE_CHECKING:
    from .broker import Broker
    from .topic import Topic

ACTIONS = ("create", "alter", "delete", "purge")


def administer(broker: Broker, action: Any, name: str, params: dict[str, Any]) -> dict[str, Any]:
    """Carry out ``action`` on topic ``name`` (already validated and authorized)."""
    if action not in ACTIONS:
        raise StreamError(
            ErrorCode.REJECTED, f"$admin action must be one of {', '.join(ACTIONS)}, got {reprlib.repr(action)}"
        )
    if action == "create":
        return _create(broker, name, _asked(broker, name, params))
    if action == "alter":
        return _alter(broker, name, _asked(broker, name, params), _reset(params))
    for key in ("settings", "reset"):
        if params.get(key) is not None:
            raise StreamError(ErrorCode.REJECTED, f"{action} takes no {key}: only create and alter do")
    existing = broker.topic(name, create=False)  # opened if it is stored and closed
    if existing is None:
        raise StreamError(ErrorCode.UNKNOWN_PUBLISHER, f"no topic named {name!r}", {"topic": name})
    if action == "purge":
        try:
            removed = existing.purge()
        except StorageError as failure:
            raise storage_refusal(name, failure, f"{name!r} could not be purged: {failure}") from None
        return {"action": action, "topic": name, "removed": removed, "next_offset": existing.log.next_offset}
    next_offset = existing.log.next_offset  # where a topic created under its name goes on
    removed = next_offset - existing.log.first_offset
    broker.delete_topic(existing)
    return {"action": action, "topic": name, "removed": removed, "next_offset": next_offset}


def _asked(broker: Broker, name: str, params: dict[str, Any]) -> dict[str, Any]:
    """The ``settings`` param, checked: dotted key -> value."""
    data = params.get("settings")
    if data is None:
        return {}
    try:
        asked = parse(data, "settings")
    except InvalidSettings as invalid:
        raise StreamError(
            ErrorCode.REJECTED, f"invalid settings: {invalid}", {"topic": name, "problems": invalid.problems}
        ) from None
    if asked.get("storage") == "durable" and broker.data_dir is None:
        raise StreamError(
            ErrorCode.REJECTED,
            "settings.storage: 'durable' needs a broker with a data_dir (this one keeps every topic in memory)",
            {"topic": name},
        )
    return asked


def _reset(params: dict[str, Any]) -> list[str]:
    reset = params.get("reset")
    if reset is None:
        return []
    if not isinstance(reset, list) or not all(isinstance(key, str) and key in KEYS for key in reset):
        raise StreamError(ErrorCode.REJECTED, f"reset must be a list of setting names ({', '.join(KEYS)})")
    return reset


def _current(broker: Broker, name: str) -> dict[str, Any]:
    return effective(broker.settings(name), broker.data_dir is not None)


def _save(broker: Broker, name: str, values: dict[str, Any]) -> None:
    try:
        broker.overrides.save(name, values, broker.storage_files)
    except StorageError as failure:
        raise storage_refusal(name, failure, f"the settings of {name!r} cannot be stored: {failure}") from None


def _make(broker: Broker, name: str, values: dict[str, Any]) -> Topic:
    """Create the topic with ``values`` as its own settings: stored before the topic is made
    (a crash in between leaves a topic with its settings, not one without), forgotten again
    if it cannot be made (too many topics, no space)."""
    if values:
        _save(broker, name, values)
    try:
        topic = broker.topic(name, create=True)
    except BaseException:
        if values:
            broker.overrides.forget(name, broker.storage_files)
        raise
    assert topic is not None
    return topic


def _create(broker: Broker, name: str, asked: dict[str, Any]) -> dict[str, Any]:
    existed = broker.exists(name)
    if existed:
        problem = broker.overrides.problem(name)
        if asked and problem is not None:
            raise StreamError(
                ErrorCode.REJECTED,
                f"topic {name!r} exists and its settings cannot be used ({problem}): set them with alter",
                {"topic": name},
            )
        current = _current(broker, name)
        differ = [f"{key} is {current[key]!r}, not {value!r}" for key, value in asked.items() if current[key] != value]
        if differ:
            raise StreamError(
                ErrorCode.REJECTED,
                f"topic {name!r} exists with other settings ({'; '.join(differ)}): create does not change a "
                "topic, alter does",
                {"topic": name},
            )
        topic = broker.topic(name, create=False)
        assert topic is not None
    else:
        topic = _make(broker, name, asked)
    answer = {"action": "create", "topic": name, "created": not existed, "next_offset": topic.log.next_offset}
    return {**answer, **broker.describe_settings(name)}


def _alter(broker: Broker, name: str, asked: dict[str, Any], reset: list[str]) -> dict[str, Any]:
    if not asked and not reset:
        raise StreamError(ErrorCode.REJECTED, "alter needs settings to change, or reset: a list of settings")
    topic = broker.topic(name, create=False)  # opened if it is stored and closed
    if topic is None:
        raise StreamError(ErrorCode.UNKNOWN_PUBLISHER, f"no topic named {name!r}", {"topic": name})
    before = _current(broker, name)
    values = {} if broker.overrides.problem(name) is not None else broker.overrides.get(name)
    values.update(asked)
    for key in reset:
        values.pop(key, None)
    storage = asked.get("storage", before["storage"])  # (a reset keeps it: storage is fixed at creation)
    if storage != before["storage"]:
        raise StreamError(
            ErrorCode.REJECTED,
            f"the storage of {name!r} is {before['storage']}: it is fixed when a topic is created "
            "(delete it and create it again to change it)",
            {"topic": name},
        )
    _save(broker, name, values)
    settings = broker.settings(name)
    # Live: the log's retention is read by every sweep, the policy and lag bound by every
    # delivery; a refill and a look at every reader apply them to what is waiting now.
    topic.log.retention = settings.retention
    topic.policy, topic.max_lag = settings.policy, settings.max_lag
    for sink in list(topic.sinks):
        sink.refill()
    for reader in list(topic.readers):
        reader.appended(topic)
    after = _current(broker, name)
    if not values and after["storage"] == "memory":  # nothing of its own left: no directory to keep either
        broker.overrides.forget(name, broker.storage_files)
    changed = [key for key in KEYS if before[key] != after[key]]
    answer = {"action": "alter", "topic": name, "changed": changed, "next_offset": topic.log.next_offset}
    return {**answer, **broker.describe_settings(name)}
