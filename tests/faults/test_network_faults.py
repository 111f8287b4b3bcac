"""Real peers through a bad network (tests/faults/proxy.py): latency, resets in the middle of
frames, partitions. Resuming gets every record exactly once; keepalive notices a partition
within its configured bound, on both sides and in both clients (issue 10)."""

from __future__ import annotations

import pytest
import trio

import rsnet
import rsnet.sync
from rsnet.broker.broker import Broker
from rsnet.broker.client import follow, publish
from rsnet.protocol import ErrorCode

from ..broker.support import broker_serving
from ..net.support import endless_server
from .proxy import FaultyProxy

KEEPALIVE = 0.2
SLACK = 1.0  # scheduling on a loaded 2-core machine; the bound under test is 3 intervals


async def test_follow_through_latency_and_mid_frame_resets_gets_every_record_once():
    total = 3000
    received: list[dict] = []

    async def paced():
        for value in range(total):
            yield {"n": value, "pad": "x" * 40}
            if value % 100 == 0:
                await trio.sleep(0.01)

    async with broker_serving(Broker()) as (url, _), FaultyProxy(int(url.rsplit(":", 1)[1])) as proxy:
        proxy.latency = 0.001
        proxy.reset_after_bytes = 30_000  # every connection through the proxy dies mid-stream

        async def consume():
            async with follow(proxy.url, "faults", start="earliest", prefetch=64, retry_delay=0.01) as records:
                async for record in records:
                    received.append(record)
                    if len(received) == total:
                        return

        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(consume)
                async with rsnet.connect(url) as conn:  # the producer's path is clean
                    await publish(conn, "faults", paced(), producer="p")
    assert [record["offset"] for record in received] == list(range(total))
    assert [record["value"]["n"] for record in received] == list(range(total))
    assert proxy.resets >= 3, "the resets really happened, mid-stream"


async def test_keepalive_notices_a_partition_within_three_intervals_on_both_sides():
    server = rsnet.Server(keepalive_interval=KEEPALIVE)
    server.include(endless_server(pause=0.05)[0])
    async with trio.open_nursery() as nursery:
        port = await nursery.start(server.serve_tcp, "127.0.0.1", 0)
        async with FaultyProxy(port) as proxy:
            with pytest.raises(rsnet.ConnectionLost) as lost:
                async with rsnet.connect(proxy.url, keepalive_interval=KEEPALIVE) as conn:
                    async with conn.subscribe("endless", prefetch=4) as items:
                        await items.__anext__()
                        proxy.partition()
                        partitioned_at = trio.current_time()
                        with trio.fail_after(3 * KEEPALIVE + SLACK):
                            async for _ in items:
                                pass
            noticed_after = trio.current_time() - partitioned_at
            assert lost.value.code == ErrorCode.TIMEOUT
            assert noticed_after >= 3 * KEEPALIVE * 0.9  # not before three silent intervals
            with trio.fail_after(3 * KEEPALIVE + SLACK):  # the server side gives up too
                while server.sessions:
                    await trio.sleep(0.01)
        nursery.cancel_scope.cancel()


async def test_the_blocking_client_notices_a_partition_too():
    server = rsnet.Server(keepalive_interval=KEEPALIVE)
    server.include(endless_server(pause=0.05)[0])
    async with trio.open_nursery() as nursery:
        port = await nursery.start(server.serve_tcp, "127.0.0.1", 0)
        async with FaultyProxy(port) as proxy:

            def read_through_the_partition() -> BaseException:
                with rsnet.sync.connect(proxy.url, keepalive_interval=KEEPALIVE) as client:
                    items = client.subscribe("endless", prefetch=4)
                    next(items)
                    proxy_partition()
                    try:
                        for _ in items:
                            pass
                    except rsnet.ConnectionLost as error:
                        return error
                raise AssertionError("the stream ended without an error")

            token = trio.lowlevel.current_trio_token()

            def proxy_partition() -> None:
                trio.from_thread.run_sync(proxy.partition, trio_token=token)

            with trio.fail_after(3 * KEEPALIVE + SLACK + 2):
                error = await trio.to_thread.run_sync(read_through_the_partition)
            assert isinstance(error, rsnet.ConnectionLost) and error.code == ErrorCode.TIMEOUT
        nursery.cancel_scope.cancel()
