"""Scenario 7: NATS JetStream, the product a user would pick instead of rsnet's broker (issue 13).

The server is ``nats-server`` (the Debian package, 2.9.10 here) with JetStream enabled, its
store in a fresh directory under ``$RSNET_BENCH_SCRATCH``, listening on 127.0.0.1 only (an
ephemeral port, read from its log). The worker starts it as a child that dies with the worker
(``PR_SET_PDEATHSIG``), and reports the child's pid, so the runner samples the CPU and memory
of ``nats-server`` itself.

The client is ``nats-py`` on asyncio, used as its documentation shows: one stream ``BENCH``
on subject ``bench.records``, file storage (``storage`` param ``"file"``; ``"memory"`` for a
memory stream), one replica;

- ``publish``: one producer, ``js.publish_async`` with up to ``in_flight`` (4,000, nats-py's
  default) acknowledgements outstanding, then ``publish_async_completed``; records/s counts
  acknowledged records. A JetStream acknowledgement (PubAck) means the server has appended
  the message to the stream's file store, i.e. written it to the OS; it does not wait for an
  fsync (2.9 syncs in the background and has no option to sync per write; 2.10 added
  ``sync_interval``, default 2 minutes), so an acknowledged record survives a crash of
  ``nats-server`` but not necessarily a crash of the machine.
- ``fanout``: ``subscribers`` ordered push consumers over ``connections`` connections (default:
  one each), round-robin (nats-py's
  ``ordered_consumer=True``: deliver all, no acknowledgements, flow control, in order, gaps
  repaired), the equivalent of rsnet's subscription from the earliest offset; then the same
  producer as ``publish``. Deliveries/s = records x subscribers / (first publish to last
  record at the last subscriber).
- ``replay``: ``count`` records are stored first (core-NATS publishes into the stream, then
  waiting until the stream holds them all: not timed), then one ordered consumer reads them
  all from the start.
- ``latency``: one subscriber (an ordered consumer) and one producer publishing at ``rate``
  records/s for ``seconds``; each record carries the time it was *scheduled* to be sent, and
  the subscriber records arrival minus that time (so a producer held back by flow control
  counts its wait: no coordinated omission).

Records are ``size`` bytes (100 in scenario 7). ``unavailable()`` says why JetStream cannot be
measured on this machine (no ``nats-server``, no ``nats-py``), and the rows say "not available".
"""

from __future__ import annotations

import asyncio
import ctypes
import importlib.util
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from typing import Any

from .common import Clock, latency_payload, latency_us, payload, raise_fd_limit, scheduled_time

STREAM = "BENCH"
SUBJECT = "bench.records"
IN_FLIGHT = 4000
"""Acknowledgements a producer may wait for at once: nats-py's default ``publish_async_max_pending``."""
LISTENING = re.compile(rb"Listening for client connections on [\d.]+:(\d+)")
START_TIMEOUT = 15.0


def server_binary() -> str | None:
    """Where ``nats-server`` is (Debian installs it in /usr/sbin, not always on PATH)."""
    return shutil.which("nats-server") or next(
        (p for p in ("/usr/sbin/nats-server", "/usr/bin/nats-server") if os.access(p, os.X_OK)), None
    )


def unavailable() -> str | None:
    """Why JetStream cannot be measured here, or None."""
    missing = []
    if server_binary() is None:
        missing.append("nats-server is not installed (make test installs it as root: apt-get install nats-server)")
    if importlib.util.find_spec("nats") is None:
        missing.append("nats-py is not installed (pip install -e '.[bench]')")
    return "; ".join(missing) or None


# -- server ---------------------------------------------------------------------------------------


def _die_with_parent() -> Any:
    """A ``preexec_fn`` that makes the child get SIGKILL when the worker that started it dies.

    libc is loaded here, in the parent: the child (forked while the worker's watchdog thread
    runs) only makes the one system call before it execs, taking no lock.
    """
    prctl = ctypes.CDLL(None, use_errno=True).prctl

    def set_death_signal() -> None:
        prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG = 1

    return set_death_signal


def serve(
    transport: str, ready: Any, storage: str = "durable", fsync: str | None = None, fsync_interval: float = 0.1
) -> None:
    """Run nats-server with JetStream on 127.0.0.1 until killed.

    ``storage``, ``fsync`` and ``fsync_interval`` are accepted because scenario 7's rows give
    every system the same server parameters (they configure rsnet's broker); a JetStream
    stream's storage is chosen by the client when it creates the stream, and 2.9 has no fsync
    setting.
    """
    if transport != "tcp":
        raise ValueError("JetStream is measured over TCP only")
    binary = server_binary()
    if binary is None:
        raise RuntimeError(unavailable() or "nats-server not found")
    raise_fd_limit()
    scratch = os.environ.get("RSNET_BENCH_SCRATCH")
    if not scratch:
        raise RuntimeError("JetStream needs $RSNET_BENCH_SCRATCH for its store (the runner sets it)")
    store = os.path.join(scratch, "jetstream")
    child = subprocess.Popen(
        [binary, "-a", "127.0.0.1", "-p", "-1", "-js", "-sd", store],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        preexec_fn=_die_with_parent(),
    )
    assert child.stderr is not None
    deadline = time.monotonic() + START_TIMEOUT
    port = None
    log: list[bytes] = []
    while port is None and time.monotonic() < deadline:
        line = child.stderr.readline()
        if not line:
            break
        log.append(line)
        match = LISTENING.search(line)
        if match:
            port = int(match.group(1))
    if port is None:
        child.kill()
        raise RuntimeError("nats-server did not start: " + b"".join(log[-5:]).decode(errors="replace"))
    ready(port, child.pid)
    # Keep draining its log (an unread pipe would block it), echoing warnings and errors.
    for line in child.stderr:
        if b"[ERR]" in line or b"[WRN]" in line or b"[FTL]" in line:
            sys.stderr.write(line.decode(errors="replace"))
    sys.exit(child.wait())


# -- client ---------------------------------------------------------------------------------------


async def _connect(port: int) -> Any:
    import nats

    return await nats.connect(
        f"nats://127.0.0.1:{port}",
        allow_reconnect=False,
        max_reconnect_attempts=0,
        pending_size=8 * 2**20,
    )


async def _create_stream(nc: Any, storage: str) -> Any:
    from nats.js.api import StorageType, StreamConfig

    js = nc.jetstream(publish_async_max_pending=IN_FLIGHT)
    kind = StorageType.MEMORY if storage == "memory" else StorageType.FILE
    await js.add_stream(StreamConfig(name=STREAM, subjects=[SUBJECT], storage=kind, num_replicas=1))
    return js


async def _publish_acked(js: Any, records: Any) -> int:
    """Publish every record with ``publish_async``, then wait for every acknowledgement."""
    sent = 0
    futures = []
    for record in records:
        futures.append(await js.publish_async(SUBJECT, record))
        sent += 1
    await js.publish_async_completed()
    for future in futures:  # every PubAck must say "stored", not an error
        future.result()
    return sent


class _Reader:
    """An ordered push consumer that counts records (and latencies) until it has ``count``."""

    def __init__(self, count: int, latencies: list[float] | None = None) -> None:
        self.count = count
        self.received = 0
        self.last_sequence = 0
        self.latencies = latencies
        self.done = asyncio.get_running_loop().create_future()
        self.finished = 0.0

    async def on_message(self, msg: Any) -> None:
        if self.latencies is not None:
            self.latencies.append(latency_us(msg.data))
        self.received += 1
        if self.received == self.count:
            self.last_sequence = msg.metadata.sequence.stream
            self.finished = time.perf_counter()
            if not self.done.done():
                self.done.set_result(None)

    async def subscribe(self, js: Any) -> Any:
        return await js.subscribe(SUBJECT, cb=self.on_message, ordered_consumer=True, idle_heartbeat=5)

    def check(self) -> None:
        # The ordered consumer delivers in order and repairs gaps; count + last sequence confirm it.
        if self.received != self.count or self.last_sequence != self.count:
            raise RuntimeError(f"got {self.received} records ending at {self.last_sequence}, expected {self.count}")


async def publish_rows(kind: str, port: int, params: dict[str, Any]) -> dict[str, Any]:
    size, count, storage = params["size"], params.get("count", 0), params.get("storage", "file")
    nc = await _connect(port)
    connections = [nc]
    try:
        js = await _create_stream(nc, storage)
        record = payload(size)
        if kind == "publish":
            clock = Clock()
            sent = await _publish_acked(js, (record for _ in range(count)))
            return {"items": sent, "published": sent, **clock.elapsed()}
        if kind == "fanout":
            subscribers = params["subscribers"]
            readers = [_Reader(count) for _ in range(subscribers)]
            readers_conns = [await _connect(port) for _ in range(params.get("connections", subscribers))]
            connections += readers_conns
            for index, reader in enumerate(readers):
                await reader.subscribe(readers_conns[index % len(readers_conns)].jetstream())
            clock = Clock()
            published = await _publish_acked(js, (record for _ in range(count)))
            publish_s = time.perf_counter() - clock.wall
            await asyncio.gather(*(r.done for r in readers))
            elapsed = clock.elapsed()
            for reader in readers:
                reader.check()
            elapsed["seconds"] = max(r.finished for r in readers) - clock.wall
            received = sum(r.received for r in readers)
            return {
                "subscribers": subscribers,
                "published": published,
                "items": received,
                "publish_s": publish_s,
                **elapsed,
            }
        if kind == "replay":
            # Fill the stream (not timed): core publishes, flushed, until the stream holds them all.
            for _ in range(count):
                await nc.publish(SUBJECT, record)
            await nc.flush(timeout=60)
            while (await js.stream_info(STREAM)).state.messages < count:
                await asyncio.sleep(0.01)
            reader = _Reader(count)
            clock = Clock()
            subscription = await reader.subscribe(js)
            await reader.done
            elapsed = clock.elapsed()
            await subscription.unsubscribe()
            reader.check()
            return {"items": reader.received, **elapsed}
        if kind == "latency":
            rate, seconds = params["rate"], params["seconds"]
            count = max(1, int(rate * seconds))
            latencies: list[float] = []
            reader = _Reader(count, latencies)
            sub_conn = await _connect(port)
            connections.append(sub_conn)
            await reader.subscribe(sub_conn.jetstream())
            clock = Clock()
            start = time.perf_counter_ns()
            sent = 0
            futures = []
            while sent < count:
                due = scheduled_time(start, sent, rate)
                wait = (due - time.perf_counter_ns()) / 1e9
                if wait > 0:
                    await asyncio.sleep(wait)
                # Every record whose time has come, stamped with the time it was due.
                now = time.perf_counter_ns()
                while sent < count and (due := scheduled_time(start, sent, rate)) <= now:
                    futures.append(await js.publish_async(SUBJECT, latency_payload(due, size)))
                    sent += 1
            await js.publish_async_completed()
            await reader.done
            elapsed = clock.elapsed()
            for future in futures:
                future.result()
            reader.check()
            return {"items": reader.received, "rate": rate, "latencies_us": latencies, **elapsed}
    finally:
        for conn in reversed(connections):
            await conn.close()
    raise ValueError(f"unknown kind {kind!r}")


def run_client(kind: str, transport: str, port: int, params: dict[str, Any], deadline: float) -> dict[str, Any]:
    async def main() -> dict[str, Any]:
        raise_fd_limit()
        return await asyncio.wait_for(publish_rows(kind, port, params), deadline)

    return asyncio.run(main())
