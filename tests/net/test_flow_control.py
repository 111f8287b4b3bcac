"""End-to-end flow control: a fast infinite publisher, a slow client, bounded everything."""

from __future__ import annotations

import itertools
import os
import socket

import pytest
import trio
import trio.testing

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


@pytest.mark.parametrize("transport", ["tcp", "ws"])
async def test_both_ends_writing_flat_out_at_once_never_deadlock_nor_reorder(transport):
    """Each end streams large items to the other at the same time, so the socket buffers fill
    both ways: both readers keep reading (their own writes never wait), every item arrives
    once and in order, through writes cut wherever the socket was full."""
    count, size = 100, 60_000
    received_up: list[bytes] = []
    up_done = trio.Event()
    server = rsnet.Server()

    def numbered(i: int) -> bytes:
        return i.to_bytes(4, "big") * (size // 4)

    class Sink(rsnet.Subscriber):
        def on_subscribe(self, subscription):
            subscription.request(count)

        def on_next(self, item):
            received_up.append(item)

        def on_error(self, error):
            received_up.append(error)
            up_done.set()

        def on_complete(self):
            up_done.set()

    server.add_sink("up", lambda params, ctx: Sink())

    @server.publisher("down")
    def down(params, ctx):
        return rsnet.from_iterable(map(numbered, range(count)))

    async with running(server) as urls, rsnet.connect(urls[transport]) as conn:
        # Small socket buffers, so a few megabytes fill them whatever the kernel's autotuning.
        for session in (conn._session, *server.sessions):
            sock = session.transport._stream.socket
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 65536)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
        received_down = []
        with trio.fail_after(60):  # a deadlock would hang here for ever
            async with trio.open_nursery() as nursery:
                nursery.start_soon(conn.offer, "up", rsnet.from_iterable(map(numbered, range(count))))
                async for item in conn.subscribe("down", prefetch=count):
                    received_down.append(item)
            await up_done.wait()
    assert received_down == [numbered(i) for i in range(count)]
    assert received_up == [numbered(i) for i in range(count)]


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


async def test_a_short_stream_of_small_items_leaves_the_server_in_one_write():
    """The first request counts each item as the largest frame the client takes (4 of them);
    once those are encoded their size is known, and the session asks for the rest that fits
    the byte window before it writes: 100 small items and COMPLETE, one write, not two."""
    server = rsnet.Server()
    server.add_publisher("hundred", lambda params, ctx: rsnet.from_iterable(range(100)))
    async with running(server) as urls, rsnet.connect(urls["tcp"]) as conn:
        (session,) = server.sessions
        transport = session.transport
        writes: list[int] = []
        send, send_nowait = transport.send, transport.send_nowait

        async def counted_send(chunks):
            writes.append(sum(map(len, chunks)))
            return await send(chunks)

        def counted_send_nowait(chunks):
            writes.append(sum(map(len, chunks)))
            return send_nowait(chunks)

        transport.send, transport.send_nowait = counted_send, counted_send_nowait
        items = [item async for item in conn.subscribe("hundred", prefetch=1000)]
    assert items == list(range(100))
    assert len(writes) == 1, writes


async def test_rule_2_13_a_remote_subscriber_raising_from_on_next_cancels_only_its_stream():
    """An exception from a network subscriber's on_next is reported (rule 2.13), no item follows
    it, the cancel travels back to the publisher, and the connection stays usable."""
    reported = []
    server = rsnet.Server()

    @server.publisher("numbers")
    def numbers(params, ctx):
        return rsnet.from_iterable(itertools.count())

    class Raising(rsnet.Subscriber):
        def __init__(self):
            self.items = []

        def on_subscribe(self, subscription):
            subscription.request(100)  # one REQUEST: the items arrive in batches

        def on_next(self, item):
            self.items.append(item)
            if item == 3:
                raise RuntimeError("subscriber bug")

        def on_error(self, error):
            raise AssertionError(error)

        def on_complete(self):
            raise AssertionError("cancelled streams do not complete")

    previous = rsnet.streams.rules.set_undeliverable_handler(reported.append)
    try:
        async with running(server) as urls, rsnet.connect(urls["tcp"]) as conn:
            (session,) = server.sessions
            subscriber = Raising()
            conn.publisher("numbers").subscribe(subscriber)
            await trio.testing.wait_all_tasks_blocked()  # the items, the CANCEL, all taken in
            assert not session._outbound  # the server's stream ended: its publisher was cancelled
            assert [item async for item in conn.subscribe("numbers", limit=3)] == [0, 1, 2]
    finally:
        rsnet.streams.rules.set_undeliverable_handler(previous)
    assert subscriber.items == [0, 1, 2, 3]
    assert [str(error) for error in reported] == ["subscriber bug"]
