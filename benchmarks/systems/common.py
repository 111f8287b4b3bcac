"""Helpers every system's worker uses: payloads, pacing, latency lists, the process's own
resource figures. No event loop here: both trio and asyncio workers import it."""

from __future__ import annotations

import json
import os
import resource
import signal
import time
from typing import Any

import trio

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


def scheduled_time(start_ns: int, index: int, rate: float) -> int:
    """When (``perf_counter_ns``) record ``index`` of a producer paced at ``rate`` records/s is due."""
    return start_ns + int(index * 1e9 / rate)


def latency_payload(due_ns: int, size: int) -> bytes:
    """A ``size``-byte record (at least 8) that starts with the time it was due to be sent: the
    subscriber's latency is its arrival minus that time (``perf_counter_ns``, one process)."""
    return due_ns.to_bytes(8, "big") + b"x" * (size - 8)


def latency_us(record: bytes) -> float:
    """Microseconds from when ``record`` (made by :func:`latency_payload`) was due until now."""
    return (time.perf_counter_ns() - int.from_bytes(record[:8], "big")) / 1e3


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


# -- connections at scale: the server's memory, read by the client ------------------------------------

LIVE_CONCURRENCY = 200
"""Connections a live-connections client has in their handshake at once (a burst of 10,000
SYNs would overflow the listen backlog and stall in TCP's retry timers, timing the kernel)."""


def rss_mib(pid: int) -> float:
    """Resident set size of process ``pid`` in MiB."""
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def traced(pid: int, scratch: str, timeout: float = 60.0) -> dict[str, Any]:
    """Ask a server started with ``tracemalloc`` (see :func:`benchmarks.worker.trace_on_signal`)
    how many bytes its Python heap holds now, and which allocation sites grew since it was
    last asked: a SIGUSR1, then its answer's line in the file."""
    path = os.path.join(scratch, "tracemalloc")

    def answers() -> list[str]:
        try:
            with open(path) as f:
                return f.read().splitlines()
        except FileNotFoundError:
            return []

    before = len(answers())
    os.kill(pid, signal.SIGUSR1)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        lines = answers()
        if len(lines) > before:
            return json.loads(lines[before])
        time.sleep(0.01)
    raise TimeoutError(f"the server (pid {pid}) did not report its traced memory within {timeout:.0f} s")


class LiveCount:
    """Book-keeping of a live-connections client: the server's memory before any connection
    and once every connection has its stream open, and how long that took."""

    GIVE_UP_MARGIN = 20.0
    """Seconds left before the client's deadline when it stops waiting and reports what it has
    (closing thousands of connections takes a while): a stuck connection is a finding, said."""

    def __init__(self, params: dict[str, Any]) -> None:
        self.params = params
        self.pid: int = params["server_pid"]
        self.give_up_s = max(1.0, params.get("deadline", 120.0) - self.GIVE_UP_MARGIN)
        self.served = 0
        self.failed: list[str] = []  # connections that failed before their first item
        self.dropped: list[str] = []  # connections that failed after it
        self.stopped = ""  # why the client stopped waiting, if it did
        self.result: dict[str, Any] = {"server_rss_base_mib": rss_mib(self.pid)}
        if params.get("traced"):
            self.result["server_traced_base"] = traced(self.pid, params["server_scratch"])["traced"]
        self.clock = Clock()
        self.everyone = trio.Event()
        """Set once every connection has its first item or failed (the memory was read then)."""

    @property
    def settled(self) -> bool:
        return self.served + len(self.failed) == self.params["connections"]

    def first_item(self) -> None:
        """A connection has its first item: its stream is open on the server."""
        self.served += 1
        self._settle()

    def failed_connection(self, error: str, *, served: bool) -> None:
        """A connection failed; ``served``: after its first item (it was counted as served, and
        does not count again towards :attr:`settled`)."""
        (self.dropped if served else self.failed).append(error)
        self._settle()

    def _settle(self) -> None:
        if self.settled and not self.everyone.is_set():
            self.all_live()
            self.everyone.set()

    def gave_up(self) -> None:
        """The client stopped waiting (see :data:`GIVE_UP_MARGIN`): say how far it got."""
        unsettled = self.params["connections"] - self.served - len(self.failed)
        self.stopped = (
            f"gave up after {self.give_up_s:.0f} s: {self.served} served, {len(self.failed)} failed before"
            f" their first item, {unsettled} neither (still connecting or waiting for it),"
            f" {len(self.dropped)} failed after it"
        )

    def all_live(self) -> None:
        """Every connection has its stream open (or failed): read the server's memory now."""
        self.result["setup_s"] = time.perf_counter() - self.clock.wall
        self.result["server_rss_live_mib"] = rss_mib(self.pid)
        if self.params.get("traced"):
            answer = traced(self.pid, self.params["server_scratch"])
            self.result["server_traced_live"] = answer["traced"]
            self.result["server_traced_top"] = answer["top"]  # where the connections' memory went

    def report(self, items: int) -> dict[str, Any]:
        problems = self.failed + self.dropped
        notes = [self.stopped] if self.stopped else []
        if problems:
            notes.append(f"{len(self.failed)} failed before their first item, {len(self.dropped)} after it")
            notes.append(f"first: {problems[0]}")
        failure = "; ".join(notes)
        return {"served": self.served, "items": items, "failure": failure, **self.result, **self.clock.elapsed()}


async def served_port(process: trio.Process, what: str) -> int:
    """The port of the first ``serving tcp://`` line an ``rsnet serve``/``rsnet broker`` child
    prints on its stderr (a pipe); RuntimeError naming ``what`` if it exits first."""
    assert process.stderr is not None
    printed = b""
    with trio.fail_after(30):
        while b"serving tcp://" not in printed or not printed.endswith(b"\n"):
            data = await process.stderr.receive_some(4096)
            if not data:
                raise RuntimeError(f"the {what} exited: {printed.decode()}")
            printed += data
    url = printed.decode().split("serving ", 1)[1].split()[0]
    return int(url.rsplit(":", 1)[1])
