"""The documented path for threads other than the trio thread."""

from __future__ import annotations

import threading

import pytest
import trio

import rsnet
from rsnet.streams import ThreadSafeSubscription, blocking_iterate, subscribe_from_thread

from .support import ManualPublisher


async def test_blocking_iterate_from_a_worker_thread():
    token = trio.lowlevel.current_trio_token()
    publisher = rsnet.range_(0, 1000).pipe(rsnet.ops.map(lambda x: x + 1))
    items = await trio.to_thread.run_sync(lambda: list(blocking_iterate(publisher, token, prefetch=16)))
    assert items == list(range(1, 1001))


async def test_blocking_iterate_raises_the_error_and_cancels_when_closed_early():
    token = trio.lowlevel.current_trio_token()

    def consume_failing():
        with pytest.raises(KeyError):
            for _ in blocking_iterate(rsnet.error(KeyError("x")), token):
                pass

    await trio.to_thread.run_sync(consume_failing)

    source = ManualPublisher()

    def consume_two():
        iterator = blocking_iterate(source, token, prefetch=4)
        first = next(iterator)
        iterator.close()
        return first

    async with trio.open_nursery() as nursery:

        async def feed():
            while not source.subscriptions:
                await trio.sleep(0.001)
            source.last.emit(1, 2)

        nursery.start_soon(feed)
        assert await trio.to_thread.run_sync(consume_two) == 1
    await trio.sleep(0)  # let the cancel scheduled from the thread run
    assert source.last.cancelled


async def test_subscribe_and_request_from_a_foreign_thread():
    token = trio.lowlevel.current_trio_token()
    received = []
    done = threading.Event()

    class ThreadSubscriber(rsnet.Subscriber):
        def on_subscribe(self, subscription):
            assert isinstance(subscription, ThreadSafeSubscription)
            threading.Thread(target=subscription.request, args=(3,)).start()

        def on_next(self, item):
            received.append(item)

        def on_error(self, error):
            done.set()

        def on_complete(self):
            done.set()

    await trio.to_thread.run_sync(lambda: subscribe_from_thread(rsnet.just(1, 2, 3), ThreadSubscriber(), token))
    with trio.fail_after(5):
        while not done.is_set():
            await trio.sleep(0.001)
    assert received == [1, 2, 3]
