"""The broker's logs: one JSON object per line (``[log] format = "json"``) or plain text.

    configure_logging(json=True, level="info")
    log.info("topic created", extra={"topic": "sensors.kitchen", "storage": "durable"})
    # {"time": "2025-01-02T03:04:05.678Z", "level": "info", "logger": "rsnet.broker",
    #  "message": "topic created", "topic": "sensors.kitchen", "storage": "durable"}

Each JSON line holds ``time`` (UTC, ISO 8601, milliseconds), ``level``, ``logger``, ``message``,
then every ``extra`` field (not JSON-able values as ``str``), then ``exception`` (the
traceback) if any. An extra field whose name contains ``token``, ``secret``, ``password`` or
``authorization`` is written as ``"[redacted]"``: a second line of defence, since the broker
never logs tokens in the first place. The output is ASCII (``\\uXXXX`` escapes), so one record
is one line for any line-splitting tool.

This module imports only the standard library.
"""

from __future__ import annotations

import datetime
import json as jsonlib
import logging
import re
import sys
from typing import IO, Any

_STANDARD_ATTRIBUTES = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime"}
_CORE_FIELDS = ("time", "level", "logger", "message", "exception", "stack")
_SECRET = re.compile(r"token|secret|password|authorization", re.IGNORECASE)
REDACTED = "[redacted]"


def extra_fields(record: logging.LogRecord) -> dict[str, Any]:
    """The fields a ``log.x(..., extra={...})`` call added to the record, secrets redacted."""
    fields = {}
    for key, value in vars(record).items():
        if key in _STANDARD_ATTRIBUTES or key.startswith("_"):
            continue
        fields[key] = REDACTED if _SECRET.search(key) else value
    return fields


class JsonFormatter(logging.Formatter):
    """Formats a record as one line of JSON (see the module docstring)."""

    def format(self, record: logging.LogRecord) -> str:
        created = datetime.datetime.fromtimestamp(record.created, tz=datetime.UTC)
        entry: dict[str, Any] = {
            "time": created.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in extra_fields(record).items():
            entry[f"extra_{key}" if key in _CORE_FIELDS else key] = value
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            entry["exception"] = record.exc_text
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        return jsonlib.dumps(entry, default=str)


class TextFormatter(logging.Formatter):
    """``2025-01-02 03:04:05,678 INFO rsnet.broker: message key=value ...``"""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        fields = extra_fields(record)
        if not fields:
            return text
        head, newline, rest = text.partition("\n")  # keep a traceback below the fields
        suffix = " ".join(
            f"{key}={value!r}" if isinstance(value, str) else f"{key}={value}" for key, value in fields.items()
        )
        return f"{head} {suffix}{newline}{rest}"


class _BrokerHandler(logging.StreamHandler):
    """The handler :func:`configure_logging` installs (so that a second call replaces it)."""


def configure_logging(json: bool, level: str | int = "info", stream: IO[str] | None = None) -> logging.Handler:
    """Send every log record at ``level`` or above to ``stream`` (default stderr), as JSON lines
    or text; replaces the handler a previous call installed, leaves others alone. Returns the handler."""
    handler = _BrokerHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(JsonFormatter() if json else TextFormatter())
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _BrokerHandler)]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper() if isinstance(level, str) else level)
    return handler
