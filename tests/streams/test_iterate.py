"""rsnet.iterate: async for over a publisher, with limit-rate replenishment."""

from __future__ import annotations

import pytest
import trio
import trio.testing

import rsnet
from rsnet.streams import MissingBackpressureError

from .support import ManualPublisher


async def test_iterates_all_items_then_stops():
    assert [x async for x in rsnet.iterate(rsnet.range_(0, 1000), prefetch=7)] == list(range(1000))


async def test_replenishes_in_batches_at_three_quarters_of_prefetch():
    source = ManualPublisher()
    received = []
    async with trio.open_nursery() as nursery:

        async def consume():
            async for item in rsnet.iterate(source, prefetch=16):
                received.append(item)

        nursery.start_soon(consume)
        await trio.testing.wait_all_tasks_blocked()
        subscription = source.last
        assert subscription.requests == [16]
        subscription.emit(*range(11))
        await trio.testing.wait_all_tasks_blocked()
        assert subscription.requests == [16]  # not yet: 11 < 12 consumed
        subscription.emit(11)
        await trio.testing.wait_all_tasks_blocked()
        assert subscription.requests == [16, 12]  # one batched request, not one per item
        subscription.emit(*range(12, 28))
        subscription.complete()
    assert received == list(range(28))


async def test_error_is_raised_after_the_items_before_it():
    publisher = rsnet.ops.concat(rsnet.just(1, 2), rsnet.error(KeyError("late")))
    seen = []
    with pytest.raises(KeyError):
        async for item in rsnet.iterate(publisher):
            seen.append(item)
    assert seen == [1, 2]


async def test_leaving_the_async_with_block_cancels_the_subscription():
    source = ManualPublisher()
    async with rsnet.iterate(source, prefetch=4) as items:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(lambda: items.__anext__())
            await trio.testing.wait_all_tasks_blocked()
            source.last.emit(1)
    assert source.last.cancelled


async def test_breaking_out_of_a_plain_async_for_cancels_the_producer():
    stopped = trio.Event()

    async def endless():
        try:
            i = 0
            while True:
                i += 1
                yield i
        finally:
            stopped.set()

    async with trio.open_nursery() as nursery:
        async for item in rsnet.iterate(rsnet.from_async_iterable(endless, nursery=nursery)):
            if item == 10:
                break
        with trio.fail_after(1):
            await stopped.wait()


async def test_rule_1_1_a_publisher_sending_more_than_requested_is_an_error():
    source = ManualPublisher()
    iterator = rsnet.iterate(source, prefetch=2)
    received = []

    async def consume():
        received.append(await iterator.__anext__())
        received.append(await iterator.__anext__())
        with pytest.raises(MissingBackpressureError):
            await iterator.__anext__()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(consume)
        await trio.testing.wait_all_tasks_blocked()
        subscription = source.last
        subscription.outstanding = 10  # the publisher misbehaves: it sends 3 for 2 requested
        subscription.emit(1, 2, 3)
    assert subscription.cancelled
    assert received == [1, 2]  # what was requested is delivered, then the violation


def test_prefetch_must_be_positive():
    with pytest.raises(ValueError):
        rsnet.iterate(rsnet.empty(), prefetch=0)


async def test_a_fast_synchronous_source_does_not_starve_other_tasks():
    ticks = 0

    async def ticker():
        nonlocal ticks
        while True:
            ticks += 1
            await trio.sleep(0)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(ticker)
        count = 0
        async for _ in rsnet.iterate(rsnet.range_(0, 10_000), prefetch=64):
            count += 1
        nursery.cancel_scope.cancel()
    assert count == 10_000
    assert ticks > 100  # it yields once per replenishment (every 48 items), not never
