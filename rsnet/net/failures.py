"""Logging of unexpected failures, bounded: a peer that can trigger a failure (a bug in a hosted
publisher's factory, say) must not be able to grow the log without limit.

Tracebacks of unexpected failures go to the log at most :data:`TRACEBACKS_PER_MINUTE` times a
minute per process; the rest are counted and reported in one line when the minute is over. Peer
misbehaviour the protocol expects (bad frames, resets) is not a failure: it is logged in one line
at INFO by whoever sees it.
"""

from __future__ import annotations

import logging
import time
from typing import Any

TRACEBACKS_PER_MINUTE = 10


class RateLimitedLog:
    """``exception(...)`` as :meth:`logging.Logger.exception`, at most ``per_minute`` times in
    any minute-long window; beyond that, one ERROR line per window counts what was left out."""

    def __init__(self, log: logging.Logger, per_minute: int) -> None:
        self._log = log
        self._per_minute = per_minute
        self._window_start = float("-inf")
        self._logged = 0
        self._suppressed = 0

    def exception(self, message: str, *args: Any) -> None:
        now = time.monotonic()
        if now - self._window_start >= 60:
            if self._suppressed:
                self._log.error("%d more failures in the last minute; their tracebacks were left out", self._suppressed)
            self._window_start, self._logged, self._suppressed = now, 0, 0
        if self._logged < self._per_minute:
            self._logged += 1
            self._log.exception(message, *args)
        else:
            self._suppressed += 1


failure_log = RateLimitedLog(logging.getLogger("rsnet.net"), TRACEBACKS_PER_MINUTE)
