"""The live progress line of ``rsnet pub`` and ``rsnet sub`` on stderr, and their summary.

Shown only when stderr is a terminal and ``--quiet`` was not given, so pipes, logs and tests
that capture stderr see nothing of it. Written by hand (a carriage return and an erase-line
sequence, redrawn four times a second by a task): one line needs neither ``rich`` nor
``tqdm`` as a dependency.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

import trio

REDRAW_INTERVAL = 0.25
"""Seconds between redraws of the live line."""


class Progress:
    """Counts items and draws ``12,345 records  4,100/s  <extra>`` on stderr while enabled."""

    def __init__(self, command: str, *, quiet: bool, unit: str = "records") -> None:
        self.command = command
        self.enabled = not quiet and sys.stderr.isatty()
        self.unit = unit
        self.count = 0
        self.extra: Callable[[], str] | None = None  # more to show, e.g. "lag 40"
        self._started = time.monotonic()
        self._last = (self._started, 0)
        self._rate = 0.0
        self._drawn = False

    async def run(self) -> None:
        """Redraw until cancelled (start it in the command's nursery when enabled)."""
        while True:
            await trio.sleep(REDRAW_INTERVAL)
            self._draw()

    def _draw(self) -> None:
        now = time.monotonic()
        then, count = self._last
        if now - then >= 1.0:  # the rate over about the last second
            self._rate = (self.count - count) / (now - then)
            self._last = (now, self.count)
        extra = self.extra() if self.extra is not None else ""
        text = f"{self.count:,} {self.unit}  {self._rate:,.0f}/s" + (f"  {extra}" if extra else "")
        sys.stderr.write(f"\r\x1b[2K{text}")
        sys.stderr.flush()
        self._drawn = True

    def clear(self) -> None:
        """Erase the live line (before another message goes to stderr)."""
        if self._drawn:
            sys.stderr.write("\r\x1b[2K")
            sys.stderr.flush()
            self._drawn = False

    def summary(self, verb: str) -> None:
        """``rsnet pub: 1,234 records stored in t`` (with the time and rate on a terminal)."""
        self.clear()
        elapsed = max(time.monotonic() - self._started, 1e-9)
        timing = f" in {duration(elapsed)} ({self.count / elapsed:,.0f}/s)" if self.enabled else ""
        unit = self.unit.removesuffix("s") if self.count == 1 else self.unit
        print(f"rsnet {self.command}: {self.count} {unit} {verb}{timing}", file=sys.stderr, flush=True)


def duration(seconds: float) -> str:
    """``12.3 s``; under a second in milliseconds with three digits (``250 ms``, ``11.7 ms``,
    ``2.50 ms``): enough for the rate shown beside it to follow from it (``0.0 s`` beside
    256/s did not)."""
    if seconds >= 1:
        return f"{seconds:.1f} s"
    milliseconds = seconds * 1000
    decimals = 0 if milliseconds >= 100 else 1 if milliseconds >= 10 else 2
    return f"{milliseconds:.{decimals}f} ms"
