"""Logging of unexpected failures, bounded: a peer that can trigger a failure (a bug in a hosted
publisher's factory, say) must not be able to grow the log without limit.

Tracebacks of unexpected failures go to the log at most :data:`TRACEBACKS_PER_MINUTE` times a
minute per process; the rest are counted and reported in one line when the minute is over. Peer
misbehaviour the protocol expects (bad frames, resets, refused handshakes) is not a failure: it
is logged in one line at INFO by whoever sees it, at most :data:`CONNECTION_LINES_PER_MINUTE`
such lines a minute per server (the rest counted the same way).
"""

from __future__ import annotations

import logging
import time
from typing import Any

TRACEBACKS_PER_MINUTE = 10

CONNECTION_LINES_PER_MINUTE = 100
"""One-line reports of connections (refused, timed out in the handshake, ended by a reset) that
the log takes a minute: a peer can open connections as fast as the server accepts them, and each
would otherwise be a line (resource budget, server/README.md)."""


class RateLimitedLog:
    """Log lines at most ``per_minute`` times in any minute-long window; beyond that, one line
    per window (``left_out``, at ``left_out_level``, formatted with the count) says how many
    were left out."""

    def __init__(
        self,
        log: logging.Logger,
        per_minute: int,
        left_out: str = "%d more failures in the last minute; their tracebacks were left out",
        left_out_level: int = logging.ERROR,
    ) -> None:
        self._log = log
        self._per_minute = per_minute
        self._left_out = left_out
        self._left_out_level = left_out_level
        self._window_start = float("-inf")
        self._logged = 0
        self._suppressed = 0

    def exception(self, message: str, *args: Any) -> None:
        """As :meth:`logging.Logger.exception` (the traceback included), if the window has room."""
        if self._admit():
            self._log.exception(message, *args)

    def log(self, level: int, message: str, *args: Any) -> None:
        """As :meth:`logging.Logger.log`, if the window has room."""
        if self._admit():
            self._log.log(level, message, *args)

    def _admit(self) -> bool:
        now = time.monotonic()
        if now - self._window_start >= 60:
            if self._suppressed:
                self._log.log(self._left_out_level, self._left_out, self._suppressed)
            self._window_start, self._logged, self._suppressed = now, 0, 0
        if self._logged < self._per_minute:
            self._logged += 1
            return True
        self._suppressed += 1
        return False


failure_log = RateLimitedLog(logging.getLogger("rsnet.net"), TRACEBACKS_PER_MINUTE)
