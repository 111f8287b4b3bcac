"""Subscribe-to-first-item's own work in a hot loop: no socket, no scheduler, no wait between.

The round trip's legs (``benchmarks/round_trip.py``) time each side's work where it runs, after
a wait in epoll. Here the same work runs back to back in one process, rsnet's through its real
protocol connections, sessions, stream objects and a real ``rsnet.Server`` host, the ceiling's
through the same msgpack calls its scenario 2 makes:

- server: the SUBSCRIBE's bytes in, its answer's bytes (ACCEPT, the item, COMPLETE) out;
- client: opening the stream up to the SUBSCRIBE's bytes, then the answer's bytes in up to the
  item in the consumer's hands (rsnet: its iterator's queue and demand bookkeeping; the ceiling:
  the item out of its unpacker).

The ratio between a leg and this is what the work costs cold, after each wait, against warm.
Timings are never asserted.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import msgpack
import trio

WARMUP = 1000


class _Captured:
    """A transport that keeps what the session writes (no socket)."""

    peer = "hot loop"
    half_closable = True
    message_based = False

    def __init__(self) -> None:
        self.written: list[bytes] = []

    def send_nowait(self, chunks: Any) -> bool:
        self.written.extend(bytes(chunk) for chunk in chunks)
        return True

    def take(self) -> bytes:
        data, self.written = b"".join(self.written), []
        return data


Samples = dict[str, list[float]]
"""Seconds of each round's work, by side: ``{"server": [...], "client": [...]}``."""


def rounds(system: str, iterations: int, on_round: Callable[[int], None] | None = None) -> Samples:
    """Run ``WARMUP + iterations`` rounds of ``system``'s ("rsnet" or "ceiling") work, calling
    ``on_round`` with each round's number (from 0) before it starts; the samples of every round."""
    if system == "rsnet":
        return trio.run(_rsnet, iterations, on_round)
    return _ceiling(iterations, on_round)


def _median_us(samples: list[float]) -> float:
    return statistics.median(samples[WARMUP:]) * 1e6


async def _rsnet(iterations: int, on_round: Callable[[int], None] | None) -> Samples:
    from rsnet.client_rules import demand_policy
    from rsnet.net.iterator import StreamIterator
    from rsnet.net.session import Session
    from rsnet.protocol import Connection
    from rsnet.protocol.connection import Role

    from .systems.rsnet_system import make_server

    client_conn, server_conn = Connection(Role.CLIENT), Connection(Role.SERVER)
    server_conn.receive_data(client_conn.data_to_send())
    server_conn.events_received()
    server_conn.send_welcome()
    client_conn.receive_data(server_conn.data_to_send())
    client_conn.events_received()
    to_server, to_client = _Captured(), _Captured()
    samples: Samples = {"server": [], "client": []}
    async with trio.open_nursery() as nursery:
        server = Session(to_client, server_conn, host=make_server())  # type: ignore[arg-type]
        client = Session(to_server, client_conn)  # type: ignore[arg-type]
        server._nursery = client._nursery = nursery
        clock = trio.current_time
        for number in range(iterations + WARMUP):
            if on_round is not None:
                on_round(number)
            t0 = time.perf_counter()  # the client opens the stream (Client.subscribe, first __anext__)
            stream = StreamIterator(
                client.publisher("items", {"count": 1, "size": 16}),
                demand_policy(clock, prefetch=1, limit=None, budget=None, max_item_bytes=1 << 20),
            )
            publisher, stream._publisher = stream._publisher, None
            assert publisher is not None
            publisher.subscribe(stream)
            subscribe = to_server.take()
            t1 = time.perf_counter()  # the server: SUBSCRIBE in, the answer out (its reader's steps)
            _handle(server, server_conn, subscribe)
            answer = to_client.take()
            t2 = time.perf_counter()  # the client: the answer in, the item taken
            _handle(client, client_conn, answer)
            stream._queue.popleft()
            stream._taken(1)
            t3 = time.perf_counter()
            samples["client"].append((t1 - t0) + (t3 - t2))
            samples["server"].append(t2 - t1)
        nursery.cancel_scope.cancel()
    return samples


def _handle(session: Any, conn: Any, data: bytes) -> None:
    """What the session's reader does with received bytes, without its waits."""
    session._holding = True
    try:
        conn.receive_data(data)
        session._dispatch(conn.events_received(), 0)
    finally:
        session._holding = False
    session._write_scheduled = True
    session._send_now()


def _ceiling(iterations: int, on_round: Callable[[int], None] | None) -> Samples:
    from .systems import ceiling
    from .systems.common import payload

    pack = msgpack.Packer(autoreset=False)
    samples: Samples = {"server": [], "client": []}
    unpacker, reader = msgpack.Unpacker(), msgpack.Unpacker()  # one per connection, as its peers keep
    for stream_id in range(1, iterations + WARMUP + 1):
        if on_round is not None:
            on_round(stream_id - 1)
        t0 = time.perf_counter()
        subscribe = ceiling.subscribe_frame(stream_id, 1, 16, 1)
        t1 = time.perf_counter()
        unpacker.feed(subscribe)
        for frame in unpacker:
            item = payload(frame[3]["size"])
            out = [ceiling.packb([ceiling.ACCEPT, frame[1], {}])]
            pack.pack([ceiling.NEXT, frame[1], item])
            out.append(pack.bytes())
            pack.reset()
            out.append(ceiling.packb([ceiling.COMPLETE, frame[1]]))
        answer = b"".join(out)
        t2 = time.perf_counter()
        reader.feed(answer)
        taken = [frame[2] for frame in reader if frame[0] == ceiling.NEXT]
        t3 = time.perf_counter()
        assert taken
        samples["client"].append((t1 - t0) + (t3 - t2))
        samples["server"].append(t2 - t1)
    return samples


def measure(iterations: int) -> dict[str, dict[str, float]]:
    """µs per round trip, median over ``iterations``: ``{system: {"server", "client"}}``."""
    return {
        system: {side: _median_us(values) for side, values in rounds(system, iterations).items()}
        for system in ("rsnet", "ceiling")
    }
