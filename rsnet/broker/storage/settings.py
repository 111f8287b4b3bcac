"""A topic's own settings, kept in ``settings.json`` in the topic's directory.

An administrator sets them (``$admin`` ``create`` or ``alter``, see :mod:`rsnet.broker.admin`);
they live with the topic's records so that a restart, a copied directory or a backup keeps
them, and they are deleted with the topic. The file is JSON, so an operator can read it::

    {"format": "rsnet-topic-settings", "version": 1,
     "settings": {"retention": {"max_records": 1000}, "slow_subscriber": {"policy": "drop"}}}

It is written the safe way (:func:`rsnet.broker.storage.files.replace_atomically`: a synced
temporary file renamed over the old one, then the directory synced), so a crash leaves the old
file or the new one, never a mix. What ``settings`` may hold is checked by the broker
(:mod:`rsnet.broker.overrides`); this module checks the envelope: JSON, the format name, a
version it knows. A file that fails is reported with :class:`SettingsUnreadable`, never guessed.

This module imports the standard library only.
"""

from __future__ import annotations

import json
import os
from typing import Any

from .files import FileOps, replace_atomically
from .log import StorageError

FILE_NAME = "settings.json"
FORMAT = "rsnet-topic-settings"
VERSION = 1
MAX_BYTES = 64 * 1024
"""A settings file is a few hundred bytes; a larger one is not read (it is not ours)."""


class SettingsUnreadable(StorageError):
    """``path`` cannot be used: ``problem`` says why (damaged, not JSON, an unknown version)."""

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(f"{path}: {problem}")
        self.path = path
        self.problem = problem


def path_in(directory: str | os.PathLike[str]) -> str:
    return os.path.join(os.fspath(directory), FILE_NAME)


def read_settings(directory: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The ``settings`` mapping stored in ``directory``, or None if it has no settings file.

    Raises :class:`SettingsUnreadable` if the file cannot be read or is not a settings file
    of a version this code knows; the file is left as it is.
    """
    path = path_in(directory)
    try:
        with open(path, "rb") as file:
            data = file.read(MAX_BYTES + 1)
    except FileNotFoundError:
        return None
    except OSError as error:
        raise SettingsUnreadable(path, f"cannot be read ({error.strerror or error})") from error
    if len(data) > MAX_BYTES:
        raise SettingsUnreadable(path, f"larger than {MAX_BYTES} bytes: not a settings file")
    try:
        document = json.loads(data)
    except ValueError as error:  # not UTF-8, not JSON, or an integer of more digits than int() takes
        raise SettingsUnreadable(path, f"not valid JSON ({error})") from None
    except RecursionError:  # nested deeper than the parser's stack: no settings file is
        raise SettingsUnreadable(path, "not a settings file (JSON nested too deep)") from None
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise SettingsUnreadable(path, f'not a settings file (expected a JSON object with "format": "{FORMAT}")')
    version = document.get("version")
    if version != VERSION:
        raise SettingsUnreadable(path, f"version {version!r} is not one this broker reads (it reads {VERSION})")
    settings = document.get("settings")
    if not isinstance(settings, dict):
        raise SettingsUnreadable(path, '"settings" is missing or not a JSON object')
    return settings


def write_settings(ops: FileOps, directory: str | os.PathLike[str], settings: dict[str, Any]) -> None:
    """Store ``settings`` (JSON-able) in ``directory`` (created if needed), durably: when this
    returns, the file and its directory entry are synced. Raises OSError as the file
    operations do; the previous file, if any, is then unchanged."""
    directory = os.fspath(directory)
    document = {"format": FORMAT, "version": VERSION, "settings": settings}
    ops.makedirs(directory)
    replace_atomically(ops, path_in(directory), json.dumps(document, indent=1).encode() + b"\n", durable=True)
    ops.sync_directory(directory)
