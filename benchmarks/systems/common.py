"""Helpers every system's worker uses: payloads, pacing, latency lists, the process's own
resource figures. No event loop here: both trio and asyncio workers import it."""

from __future__ import annotations

import resource
import time

PACE_BATCH = 1000
"""A paced (slow) consumer checks its schedule every this many items."""


def payload(size: int) -> bytes:
    """The ``size``-byte item every system sends."""
    return b"x" * size


class Pacer:
    """Keeps a consumer at most ``rate`` items/s: ``delay(k)`` is how long to sleep after the
    k-th item (0 unless a batch boundary is ahead of schedule). ``rate`` 0 means no pacing."""

    def __init__(self, rate: float) -> None:
        self.rate = rate
        self.start = time.perf_counter()

    def delay(self, consumed: int) -> float:
        if not self.rate or consumed % PACE_BATCH:
            return 0.0
        return max(0.0, self.start + consumed / self.rate - time.perf_counter())


class Clock:
    """Wall and CPU time of the measured part of a client (not its start-up)."""

    def __init__(self) -> None:
        self.wall = time.perf_counter()
        self.cpu = time.process_time()

    def elapsed(self) -> dict[str, float]:
        return {"seconds": time.perf_counter() - self.wall, "cpu_s": time.process_time() - self.cpu}


def raise_fd_limit() -> None:
    """Lift the soft open-files limit to the hard one (1,000 connections need 1,000+ fds)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def own_usage() -> dict[str, float]:
    """This process's CPU seconds (start-up included) and peak RSS (MiB), for the result record."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return {"process_cpu_s": usage.ru_utime + usage.ru_stime, "peak_rss_mib": usage.ru_maxrss / 1024}
