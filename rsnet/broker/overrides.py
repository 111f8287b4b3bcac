"""Per-topic settings an administrator sets, over the configuration's (as Kafka's per-topic
config overrides over the broker's defaults, or a JetStream stream's own config).

The keys are those of a ``[[topics]]`` entry (:mod:`rsnet.broker.config`), written dotted::

    storage                   "memory" | "durable" (durable needs the broker's data_dir)
    retention.max_records     whole number >= 1, or null: no limit of that kind
    retention.max_bytes       whole number >= 1, or null
    retention.max_age_s       seconds > 0, or null
    slow_subscriber.policy    "backpressure" | "drop" | "disconnect"
    slow_subscriber.max_lag   whole number >= 1

On the wire and on disk they nest as in the configuration: ``{"retention": {"max_records":
1000}, "slow_subscriber": {"policy": "drop"}}``. Each key given wins over the configuration;
a key left out follows the configuration (and changes with it), one key at a time: unlike a
``[[topics]]`` entry, giving ``retention.max_records`` keeps the configured byte and age
limits. ``null`` removes a retention limit for this topic.

:class:`OverrideStore` keeps every topic's overrides in memory and, when the broker has a
``data_dir``, in ``settings.json`` in the topic's directory
(:mod:`rsnet.broker.storage.settings`): they are loaded before the topic is opened at start,
so they win over the configuration after a restart. A memory topic with settings of its own
gets a directory holding only that file: it comes back after a restart, empty, with its
settings (a JetStream memory stream does the same).

A settings file that cannot be used (damaged, hand-edited into an invalid value, from a newer
version) does not stop the broker: it is logged as an error and left as it is for the
operator, the topic runs with the configuration's settings **except retention, which is held**
(no record is removed by retention) until the file is fixed (the next opening of the topic
reads it again if it changed) or replaced with ``$admin`` ``alter``. The lost settings may have asked to
keep more than the configuration does, and records removed on a guess cannot come back.
``$topics`` shows the problem (``settings_error``) and each held key's source says so.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import pathlib
import reprlib
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from .config import MAX_AGE_S, MAX_COUNT
from .storage import StorageError
from .storage.files import FileOps, unlink_if_present
from .storage.settings import SettingsUnreadable, path_in, read_settings, write_settings
from .topic import SlowPolicy

if TYPE_CHECKING:
    from .broker import TopicSettings

log = logging.getLogger("rsnet.broker")


POLICIES = tuple(policy.value for policy in SlowPolicy)
STORAGES = ("memory", "durable")

SOURCE_TOPIC = "topic"
"""The source of a key set on the topic itself (``create``/``alter``)."""
SOURCE_BROKER = "broker"
"""The source of a key when the embedding code's ``settings_for`` named none."""
SOURCE_HELD = "held: settings.json unusable"
"""The source of the retention keys of a topic whose settings file cannot be used."""


class InvalidSettings(ValueError):
    """Settings that cannot be used; ``problems`` has one line per key, each naming it."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


def _whole(value: Any) -> int:
    if type(value) is not int or not 1 <= value <= MAX_COUNT:
        raise ValueError(f"must be a whole number from 1 to {MAX_COUNT}")
    return value


def _limit(value: Any) -> int | None:
    if value is None:
        return None
    if type(value) is not int or not 1 <= value <= MAX_COUNT:
        raise ValueError(f"must be a whole number from 1 to {MAX_COUNT}, or null for no limit")
    return value


def _age(value: Any) -> float | None:
    if value is None:
        return None
    if type(value) not in (int, float) or not math.isfinite(value) or not 0 < value <= MAX_AGE_S:
        raise ValueError(f"must be a number of seconds above 0 and at most {MAX_AGE_S:.0f}, or null for no limit")
    return max(1, round(value * 1000)) / 1000  # kept to the millisecond, as the storage engine counts


def _choice(*choices: str) -> Callable[[Any], str]:
    def check(value: Any) -> str:
        if value not in choices:
            raise ValueError(f"must be one of {', '.join(choices)}")
        return str(value)

    return check


KEYS: dict[str, Callable[[Any], Any]] = {
    "storage": _choice(*STORAGES),
    "retention.max_records": _limit,
    "retention.max_bytes": _limit,
    "retention.max_age_s": _age,
    "slow_subscriber.policy": _choice(*POLICIES),
    "slow_subscriber.max_lag": _whole,
}
"""Every key a topic may set, dotted, with its check (which returns the value to keep)."""

RETENTION_KEYS = tuple(key for key in KEYS if key.startswith("retention."))


MAX_PROBLEMS = 20
"""Problems one invalid settings map is answered with at most (the rest are counted): a map of
100,000 unknown keys must not become a 25 MB error."""

_SHOWN = reprlib.Repr()  # (keyword arguments only from Python 3.12)
_SHOWN.maxstring = _SHOWN.maxother = 40
_SHOWN.maxlist = _SHOWN.maxdict = 4
_SHOWN.maxlevel = 2


def _shown(value: Any) -> str:
    """``value`` shortened for an error message (never the whole of a large one)."""
    return _SHOWN.repr(value)


def parse(data: Any, where: str = "settings") -> dict[str, Any]:
    """The overrides in ``data`` (nested as in the configuration), as dotted key -> value.

    Raises :class:`InvalidSettings` listing every problem, each naming its key
    (``settings.retention.max_records: must be a whole number ...; got 0``).
    """
    if not isinstance(data, dict):
        raise InvalidSettings([f"{where}: must be a map such as {{'retention': {{'max_records': 1000}}}}"])
    found: dict[str, Any] = {}
    problems: list[str] = []
    more = 0  # problems beyond MAX_PROBLEMS: counted, not described

    def counted_only() -> bool:  # whether the next problem is one too many to describe
        nonlocal more
        more += len(problems) >= MAX_PROBLEMS
        return len(problems) >= MAX_PROBLEMS

    for top, value in data.items():
        if isinstance(top, str) and top in ("retention", "slow_subscriber"):
            if not isinstance(value, dict):
                if not counted_only():
                    problems.append(f"{where}.{top}: must be a map")
                continue
            items = [(f"{top}.{key}", inner) for key, inner in value.items()]
        else:
            items = [(top, value)]
        for key, inner in items:
            if not isinstance(key, str) or key not in KEYS:
                if not counted_only():
                    problems.append(f"{where}: unknown key {_shown(key)} (known: {', '.join(KEYS)})")
                continue
            try:
                found[key] = KEYS[key](inner)
            except ValueError as error:
                if not counted_only():
                    problems.append(f"{where}.{key}: {error}; got {_shown(inner)}")
    if more:
        problems.append(f"and {more} more problems")
    if problems:
        raise InvalidSettings(problems)
    return found


def nest(values: Mapping[str, Any]) -> dict[str, Any]:
    """Dotted keys back into the configuration's nesting (for the wire and the file)."""
    nested: dict[str, Any] = {}
    for key, value in values.items():
        top, _, inner = key.partition(".")
        if inner:
            nested.setdefault(top, {})[inner] = value
        else:
            nested[top] = value
    return nested


def effective(settings: TopicSettings, durable_available: bool) -> dict[str, Any]:
    """The values of :data:`KEYS` that ``settings`` gives a topic, dotted (storage as it is
    really kept: ``memory`` on a broker without ``data_dir``)."""
    retention = settings.retention
    return {
        "storage": "durable" if settings.durable and durable_available else "memory",
        "retention.max_records": retention.max_records,
        "retention.max_bytes": retention.max_bytes,
        "retention.max_age_s": None if retention.max_age_ms is None else retention.max_age_ms / 1000,
        "slow_subscriber.policy": settings.policy.value,
        "slow_subscriber.max_lag": settings.max_lag,
    }


def sources(settings: TopicSettings) -> dict[str, str]:
    """Where each key's value comes from (:data:`SOURCE_TOPIC`, a configuration source such as
    ``[[topics]] sensors.>``, ...)."""
    return {key: settings.sources.get(key, SOURCE_BROKER) for key in KEYS}


def apply(settings: TopicSettings, values: Mapping[str, Any], *, hold_retention: bool = False) -> TopicSettings:
    """``settings`` with ``values`` (dotted overrides) winning; ``hold_retention``: no limit at
    all, whatever either says (see the module docstring)."""
    retention = settings.retention
    limits = {
        "retention.max_records": retention.max_records,
        "retention.max_bytes": retention.max_bytes,
        "retention.max_age_ms": retention.max_age_ms,
    }
    for key in ("retention.max_records", "retention.max_bytes"):
        if key in values:
            limits[key] = values[key]
    if "retention.max_age_s" in values:
        age = values["retention.max_age_s"]
        limits["retention.max_age_ms"] = None if age is None else max(1, round(age * 1000))
    origin = {key: settings.sources.get(key, SOURCE_BROKER) for key in KEYS}
    origin.update((key, SOURCE_TOPIC) for key in values)
    if hold_retention:
        limits = dict.fromkeys(limits)
        origin.update((key, SOURCE_HELD) for key in RETENTION_KEYS)
    return dataclasses.replace(
        settings,
        durable=values["storage"] == "durable" if "storage" in values else settings.durable,
        retention=dataclasses.replace(  # the producer bounds are the configuration's
            retention,
            max_records=limits["retention.max_records"],
            max_bytes=limits["retention.max_bytes"],
            max_age_ms=limits["retention.max_age_ms"],
        ),
        policy=SlowPolicy(values.get("slow_subscriber.policy", settings.policy.value)),
        max_lag=values.get("slow_subscriber.max_lag", settings.max_lag),
        sources=origin,
    )


class OverrideStore:
    """Every topic's overrides: in memory, and in the topic's directory under ``data_dir``
    (None: in memory only, as everything else on such a broker)."""

    def __init__(self, data_dir: pathlib.Path | None) -> None:
        self.data_dir = data_dir
        self._values: dict[str, dict[str, Any]] = {}
        self._unusable: dict[str, tuple[str, tuple[int, int] | None]] = {}  # topic -> (why, the file's stat)

    def load(self, name: str) -> None:
        """Read the topic's settings file, if it has one (at start, before the topic opens).
        An unusable file is logged and remembered (see the module docstring), never raised."""
        self._values.pop(name, None)
        self._unusable.pop(name, None)
        if self.data_dir is None:
            return
        directory = self.data_dir / name
        try:
            data = read_settings(directory)
            if data is None:
                return
            values = parse(data, "settings")
        except (SettingsUnreadable, InvalidSettings) as error:
            problem = str(error) if isinstance(error, SettingsUnreadable) else f"{path_in(directory)}: {error}"
            self._unusable[name] = (problem, _stat(path_in(directory)))
            log.error(
                "topic %s: its settings cannot be used (%s); left as it is: the topic runs with the "
                "configuration's settings and its retention held (nothing removed) until the file is fixed, "
                "or replaced with 'rsnet topics alter'",
                name,
                problem,
            )
            return
        if values:
            self._values[name] = values

    def reload_if_changed(self, name: str) -> None:
        """Read an unusable settings file again if it changed since (fixed by an operator):
        called at every opening of the topic, so a fix applies without a restart."""
        unusable = self._unusable.get(name)
        if unusable is not None and self.data_dir is not None and _stat(path_in(self.data_dir / name)) != unusable[1]:
            self.load(name)

    def get(self, name: str) -> dict[str, Any]:
        """The topic's overrides (dotted; empty if none), a copy."""
        return dict(self._values.get(name, {}))

    def problem(self, name: str) -> str | None:
        """Why the topic's settings file cannot be used, or None."""
        unusable = self._unusable.get(name)
        return None if unusable is None else unusable[0]

    def apply(self, name: str, settings: TopicSettings) -> TopicSettings:
        """The topic's effective settings: ``settings`` (the configuration's) with its overrides."""
        return apply(settings, self._values.get(name, {}), hold_retention=name in self._unusable)

    def save(self, name: str, values: Mapping[str, Any], ops: FileOps) -> None:
        """Make ``values`` the topic's overrides, durably first (with a ``data_dir``); an empty
        mapping removes the file. Raises StorageError (caused by the OSError) if the file
        cannot be written; the old overrides then stay, in the file and here."""
        if self.data_dir is not None:
            directory = self.data_dir / name
            try:
                if values:
                    write_settings(ops, directory, nest(values))
                elif os.path.exists(path_in(directory)):
                    ops.unlink(path_in(directory))
                    ops.sync_directory(str(directory))
            except OSError as error:
                raise StorageError(f"the settings of topic {name!r} cannot be stored: {error}") from error
        self._unusable.pop(name, None)
        if values:
            self._values[name] = dict(values)
        else:
            self._values.pop(name, None)

    def forget(self, name: str, ops: FileOps | None = None) -> None:
        """Drop the topic's overrides (deleted with the topic); with ``ops``, remove its
        settings file too, and its directory if nothing else is in it."""
        self._values.pop(name, None)
        self._unusable.pop(name, None)
        if ops is not None and self.data_dir is not None:
            directory = self.data_dir / name
            unlink_if_present(ops, path_in(directory), quiet=True)
            try:
                directory.rmdir()
            except OSError:
                pass  # not empty (a durable log's files), or gone


def _stat(path: str) -> tuple[int, int] | None:
    """(modification time, size) of ``path``, None if it is gone: enough to notice an edit."""
    try:
        status = os.stat(path)
    except OSError:
        return None
    return status.st_mtime_ns, status.st_size
