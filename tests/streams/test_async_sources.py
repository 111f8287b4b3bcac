"""Sources driven by trio tasks: demand-bounded pulling, cancel, ownership by a nursery."""

from __future__ import annotations

import pytest
import trio
import trio.testing

import rsnet
from rsnet.streams import ProducerCancelledError

from .support import Recorder


async def test_rule_1_1_the_producer_pulls_from_the_source_only_under_demand():
    pulled = []

    async def numbers():
        for i in range(100):
            pulled.append(i)
            yield i

    async with trio.open_nursery() as nursery:
        recorder = Recorder()
        rsnet.from_async_iterable(numbers, nursery=nursery).subscribe(recorder)
        await trio.testing.wait_all_tasks_blocked()
        assert pulled == []  # nothing before demand
        recorder.request(3)
        await trio.testing.wait_all_tasks_blocked()
        assert recorder.items == [0, 1, 2]
        assert pulled == [0, 1, 2]  # rule 1.1: the generator never ran ahead
        recorder.request(2)
        await trio.testing.wait_all_tasks_blocked()
        assert recorder.items == [0, 1, 2, 3, 4]
        recorder.cancel()


async def test_rule_3_12_cancel_stops_the_producer_and_runs_its_cleanup():
    cleaned_up = trio.Event()

    async def endless():
        try:
            i = 0
            while True:
                i += 1
                yield i
                await trio.sleep(1)
        finally:
            cleaned_up.set()

    async with trio.open_nursery() as nursery:
        recorder = Recorder(initial=10)
        rsnet.from_async_iterable(endless, nursery=nursery).subscribe(recorder)
        await trio.testing.wait_all_tasks_blocked()
        recorder.cancel()
        with trio.fail_after(1):
            await cleaned_up.wait()
    # the nursery closed by itself: no task outlived the cancelled subscription
    assert recorder.items == [1]
    assert not recorder.terminated


async def test_completion_and_failure_of_the_async_iterable():
    async def two():
        yield "a"
        yield "b"

    async def failing():
        yield 1
        raise LookupError("source broke")

    async with trio.open_nursery() as nursery:
        done = Recorder(initial=5)
        rsnet.from_async_iterable(two, nursery=nursery).subscribe(done)
        failed = Recorder(initial=5)
        rsnet.from_async_iterable(failing, nursery=nursery).subscribe(failed)
    assert done.items == ["a", "b"] and done.completions == 1
    assert failed.items == [1] and isinstance(failed.errors[0], LookupError)


async def test_producer_cancelled_with_its_owner_nursery_signals_an_error():
    async def endless():
        while True:
            await trio.sleep(1)
            yield 1

    recorder = Recorder(initial=1)
    async with trio.open_nursery() as owner:
        async with trio.open_nursery() as producers:
            rsnet.from_async_iterable(endless, nursery=producers).subscribe(recorder)
            await trio.testing.wait_all_tasks_blocked()
            producers.cancel_scope.cancel()
        owner.cancel_scope.cancel()
    assert [type(e) for e in recorder.errors] == [ProducerCancelledError]


async def test_rule_1_9_a_closed_nursery_rejects_the_subscription_with_on_error():
    async with trio.open_nursery() as nursery:
        pass

    async def one():
        yield 1

    recorder = Recorder()  # no request needed to learn of the rejection
    rsnet.from_async_iterable(one, nursery=nursery).subscribe(recorder)
    assert recorder.signals == ["on_subscribe", "on_error"]


async def test_rule_1_9_a_failing_source_factory_rejects_the_subscription():
    def factory():
        raise ConnectionRefusedError("no source today")

    async with trio.open_nursery() as nursery:
        recorder = Recorder()
        rsnet.from_async_iterable(factory, nursery=nursery).subscribe(recorder)
    assert recorder.signals == ["on_subscribe", "on_error"]
    assert isinstance(recorder.errors[0], ConnectionRefusedError)


async def test_rule_3_9_request_zero_on_async_source():
    async def one():
        yield 1

    async with trio.open_nursery() as nursery:
        recorder = Recorder()
        rsnet.from_async_iterable(one, nursery=nursery).subscribe(recorder)
        recorder.request(0)
    assert isinstance(recorder.errors[0], ValueError)


async def test_request_zero_from_on_next_of_an_async_source_is_not_nested():
    trace = []

    class Zero(Recorder):
        def on_next(self, item):
            trace.append("enter")
            self.request(-1)
            trace.append("leave")

        def on_error(self, error):
            trace.append("error")

    async def numbers():
        for i in range(5):
            yield i

    async with trio.open_nursery() as nursery:
        rsnet.from_async_iterable(numbers, nursery=nursery).subscribe(Zero(initial=5))
    assert trace == ["enter", "leave", "error"]


async def test_from_channel_cancel_reaches_the_sender():
    send, receive = trio.open_memory_channel(0)
    sent = []
    sender_saw_cancel = trio.Event()

    async def sender():
        try:
            for i in range(1000):
                await send.send(i)
                sent.append(i)
        except trio.BrokenResourceError:
            sender_saw_cancel.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(sender)
        recorder = Recorder(initial=3)
        rsnet.from_channel(receive, nursery=nursery).subscribe(recorder)
        await trio.testing.wait_all_tasks_blocked()
        assert recorder.items == [0, 1, 2]
        assert len(sent) <= 4  # an unbuffered channel: the sender is held back by demand
        recorder.cancel()
        with trio.fail_after(1):
            await sender_saw_cancel.wait()


async def test_from_channel_is_unicast_and_closes_when_cancelled_before_any_request():
    send, receive = trio.open_memory_channel(1)
    async with trio.open_nursery() as nursery:
        publisher = rsnet.from_channel(receive, nursery=nursery)
        first, second = Recorder(), Recorder()
        publisher.subscribe(first)
        publisher.subscribe(second)
        assert second.signals == ["on_subscribe", "on_error"]
        first.cancel()
        with pytest.raises(trio.BrokenResourceError):
            await send.send(1)


async def test_from_channel_completes_when_senders_close():
    send, receive = trio.open_memory_channel(10)
    async with send:
        for i in range(3):
            await send.send(i)
    async with trio.open_nursery() as nursery:
        items = [x async for x in rsnet.iterate(rsnet.from_channel(receive, nursery=nursery))]
    assert items == [0, 1, 2]
