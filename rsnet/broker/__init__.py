"""The rsnet stream broker: topics with durable, replayable logs, fan-out, auth and operations."""

from . import codes as _codes  # noqa: F401 - registers the broker's code names (StreamError.code_name)
