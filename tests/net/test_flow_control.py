"""End-to-end flow control: a fast infinite publisher, a slow client, bounded everything."""

from __future__ import annotations

import itertools
import os

import rsnet
from rsnet import ops

from .support import running

PREFETCH = 16
ITEMS = 1_000_000


def rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


async def test_the_server_never_runs_ahead_of_remote_demand_and_memory_stays_flat():
    produced = 0
    outstanding_seen = []
    server = rsnet.Server()

    def count(item):
        nonlocal produced
        produced += 1
        return item

    @server.publisher("firehose")
    def firehose(params, ctx):  # synchronous and infinite: it would emit forever if asked
        return rsnet.from_iterable(itertools.count()).pipe(ops.map(count))

    async with running(server) as urls, rsnet.connect(urls["tcp"]) as conn:
        (session,) = server.sessions
        consumed = 0
        worst_ahead = 0
        rss_after_warmup = 0
        async with conn.subscribe("firehose", prefetch=PREFETCH) as items:
            async for item in items:
                assert item == consumed  # in order, none lost
                consumed += 1
                # What the publisher emitted but the client has not consumed: in the
                # client's buffer, in flight, or in the server's output buffer. All of it
                # was requested by the client, so it can never exceed the prefetch.
                worst_ahead = max(worst_ahead, produced - consumed)
                if consumed % 4096 == 0:
                    (stream_id,) = list(session._outbound)
                    outstanding_seen.append(session.conn.outstanding_demand(stream_id))
                if consumed == 100_000:
                    rss_after_warmup = rss_bytes()
                if consumed == ITEMS:
                    break
        growth = rss_bytes() - rss_after_warmup
    assert worst_ahead <= PREFETCH
    assert max(outstanding_seen) <= PREFETCH  # the server's view of the remote demand
    assert growth < 8 * 1024 * 1024, f"memory grew by {growth / 1e6:.1f} MB over {ITEMS:,} items"


class RequestsSeen(rsnet.Publisher):
    """Endless items of ``size`` bytes, recording every request(n) the server's session makes."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.requests: list[int] = []
        self.emitted = 0

    def subscribe(self, subscriber) -> None:
        publisher = self

        class Subscription(rsnet.Subscription):
            def request(self, n: int) -> None:
                publisher.requests.append(n)
                for _ in range(n):
                    publisher.emitted += 1
                    subscriber.on_next(b"x" * publisher.size)

            def cancel(self) -> None:
                pass

        subscriber.on_subscribe(Subscription())


async def test_the_servers_window_for_a_stream_is_bounded_in_bytes_as_well_as_items():
    """The session asks its publisher for at most ``send_window`` items and about 4 MiB of them
    (DEFAULT_SEND_WINDOW_BYTES): large items are asked for a few at a time, small ones by the
    thousand, and the very first request, before any size is known, counts each as the largest
    frame the client takes."""
    server = rsnet.Server()
    large, small = RequestsSeen(256 * 1024), RequestsSeen(16)
    server.add_publisher("large", lambda params, ctx: large)
    server.add_publisher("small", lambda params, ctx: small)
    held: list[int] = []
    async with running(server) as urls, rsnet.connect(urls["tcp"]) as conn:
        (session,) = server.sessions
        for name in ("large", "small"):
            async with conn.subscribe(name, prefetch=10_000) as items:
                received = 0
                async for _ in items:
                    received += 1
                    if name == "large":
                        # What the server holds of this stream: items requested from the
                        # publisher and not yet taken, items taken and not yet encoded, and
                        # encoded bytes not yet written to the socket.
                        (outbound,) = session._outbound.values()
                        items_held = outbound.local + len(outbound.pending)
                        held.append(items_held * large.size + session.conn.buffered)
                    if received == (200 if name == "large" else 5000):
                        break
    assert max(held) <= 4 * 1024 * 1024 + 16 * 1024  # the byte window, and frame headers
    assert large.requests[0] == 4  # 4 MiB over the client's 1 MiB max_frame_size
    assert max(large.requests) <= 16
    assert max(small.requests) > 256  # small items: the item window, not the byte budget
