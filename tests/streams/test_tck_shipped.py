"""The Python TCK run against every publisher, operator, processor and subscriber rsnet ships.

Each publisher class supplies ``create_publisher(n)``: exactly n items then on_complete, built
with the component under test as the outermost stage, and ``create_failed_publisher()``: the
component's own way of rejecting or failing a subscriber, so that no required test is
skipped for want of a failed publisher. Sources are lazy (``range`` objects, generators), so
the 2**31-1 element test of rule 3.17 runs for all of them.
"""

from __future__ import annotations

import itertools
import operator
from typing import Any

import pytest
import trio

import rsnet
from rsnet import ops
from rsnet.streams import Publisher, Subscriber, Subscription
from rsnet.streams.iterate import PublisherIterator
from rsnet.streams.threads import _QueueSubscriber
from rsnet.tck import (
    IdentityProcessorVerification,
    PublisherVerification,
    SubscriberBlackboxVerification,
)


def failing(message: str = "failed publisher") -> Publisher[Any]:
    return rsnet.error(lambda: RuntimeError(message))


class _SourceFailure(Exception):
    pass


def _failing_source(*_: Any) -> Any:
    raise _SourceFailure("the source could not be opened")


# -- sources ------------------------------------------------------------------------------------


class TestRange(PublisherVerification):
    def create_publisher(self, elements):
        return rsnet.range_(0, elements)

    def create_failed_publisher(self):
        return failing()


class TestFromIterable(PublisherVerification):
    """A generator-based iterable: lazy, single-pass per subscriber (rule 1.11: fresh iter)."""

    def create_publisher(self, elements):
        return rsnet.from_iterable(itertools.islice(itertools.count(), elements))

    def create_failed_publisher(self):
        class Unreadable:
            def __iter__(self):
                raise _SourceFailure("cannot iterate")

        return rsnet.from_iterable(Unreadable())


class TestDefer(PublisherVerification):
    def create_publisher(self, elements):
        return rsnet.defer(lambda: rsnet.range_(0, elements))

    def create_failed_publisher(self):
        return rsnet.defer(_failing_source)


class TestFromAsyncIterable(PublisherVerification):
    def create_publisher(self, elements):
        async def numbers():
            for i in range(elements):
                yield i

        return rsnet.from_async_iterable(numbers, nursery=self.nursery)

    def create_failed_publisher(self):
        return rsnet.from_async_iterable(_failing_source, nursery=self.nursery)


class TestFromChannel(PublisherVerification):
    def create_publisher(self, elements):
        send, receive = trio.open_memory_channel(0)

        async def sender():
            async with send:
                for i in range(elements):
                    try:
                        await send.send(i)
                    except trio.BrokenResourceError:
                        return  # the subscriber cancelled: cancel reached the source

        self.nursery.start_soon(sender)
        return rsnet.from_channel(receive, nursery=self.nursery)

    def create_failed_publisher(self):
        # Its rejection path: the channel is unicast and already taken.
        _, receive = trio.open_memory_channel(0)
        publisher = rsnet.from_channel(receive, nursery=self.nursery)
        publisher.subscribe(_CancelAtOnce())
        return publisher


class _CancelAtOnce(Subscriber[Any]):
    def on_subscribe(self, subscription: Subscription) -> None:
        subscription.cancel()

    def on_next(self, item: Any) -> None: ...

    def on_error(self, error: BaseException) -> None: ...

    def on_complete(self) -> None: ...


# -- operators: the operator under test is the last stage ---------------------------------------


class OperatorVerification(PublisherVerification):
    """create_failed_publisher: the operator applied to a failing upstream."""

    def operator(self):
        raise NotImplementedError

    def source(self, elements):
        return rsnet.range_(0, elements)

    def create_publisher(self, elements):
        return self.source(elements).pipe(self.operator())

    def create_failed_publisher(self):
        return failing().pipe(self.operator())


class TestMap(OperatorVerification):
    def operator(self):
        return ops.map(lambda x: x + 1)


class TestFilter(OperatorVerification):
    def source(self, elements):
        return rsnet.range_(0, 2 * elements if elements < 2**62 else elements)

    def operator(self):
        return ops.filter(lambda x: x % 2 == 0)


class TestDistinctUntilChanged(OperatorVerification):
    def source(self, elements):
        return rsnet.range_(0, 2 * elements if elements < 2**62 else elements).pipe(ops.map(lambda x: x // 2))

    def operator(self):
        return ops.distinct_until_changed()


class TestTake(OperatorVerification):
    def source(self, elements):
        return rsnet.range_(0, elements + 5)

    def create_publisher(self, elements):
        return self.source(elements).pipe(ops.take(elements))

    def operator(self):
        return ops.take(10)


class TestSkip(OperatorVerification):
    def source(self, elements):
        return rsnet.range_(0, elements + 3)

    def operator(self):
        return ops.skip(3)


class TestTakeWhile(OperatorVerification):
    def source(self, elements):
        return rsnet.range_(0, elements + 5)

    def create_publisher(self, elements):
        return self.source(elements).pipe(ops.take_while(lambda x: x < elements))

    def operator(self):
        return ops.take_while(lambda x: True)


class TestScan(OperatorVerification):
    def operator(self):
        return ops.scan(operator.add, seed=0)


class TestReduce(PublisherVerification):
    """reduce emits one value: the stream of n values is n reductions, concatenated."""

    def create_publisher(self, elements):
        return rsnet.range_(0, elements).pipe(
            ops.flat_map(lambda i: rsnet.just(i, i, i).pipe(ops.reduce(operator.add)), max_concurrency=1)
        )

    def create_failed_publisher(self):
        return rsnet.just(1).pipe(ops.flat_map(lambda _: failing().pipe(ops.reduce(operator.add))))


class TestReduceAlone(PublisherVerification):
    """reduce as the outermost stage: it can only produce 0 or 1 items."""

    max_elements_from_publisher = 1

    def create_publisher(self, elements):
        source = rsnet.range_(1, 10) if elements else rsnet.empty()
        return source.pipe(ops.reduce(operator.add))

    def create_failed_publisher(self):
        return failing().pipe(ops.reduce(operator.add))


class TestBuffer(OperatorVerification):
    def source(self, elements):
        return rsnet.range_(0, 3 * elements if elements < 2**62 else elements)

    def operator(self):
        return ops.buffer(3)


class TestConcat(PublisherVerification):
    def create_publisher(self, elements):
        half = elements // 2
        return ops.concat(rsnet.range_(0, half), rsnet.empty(), rsnet.range_(half, elements - half))

    def create_failed_publisher(self):
        return ops.concat(rsnet.empty(), failing())


class TestMerge(PublisherVerification):
    def create_publisher(self, elements):
        half = elements // 2
        return ops.merge(rsnet.range_(0, half), rsnet.range_(half, elements - half))

    def create_failed_publisher(self):
        return ops.merge(rsnet.empty(), failing())


class TestFlatMap(OperatorVerification):
    """Each item becomes a publisher of one to three items; three at a time."""

    def create_publisher(self, elements):
        full, rest = divmod(elements, 3)
        sizes = itertools.chain(itertools.repeat(3, full), [rest] if rest else [])
        return rsnet.from_iterable(sizes).pipe(self.operator())

    def operator(self):
        return ops.flat_map(lambda size: rsnet.range_(0, size), max_concurrency=3, prefetch=2)


class TestFlatMapOfAsyncInners(PublisherVerification):
    def create_publisher(self, elements):
        nursery = self.nursery

        def inner(i):
            async def one():
                yield i

            return rsnet.from_async_iterable(one, nursery=nursery)

        return rsnet.range_(0, elements).pipe(ops.flat_map(inner, max_concurrency=4))

    def create_failed_publisher(self):
        return rsnet.just(1).pipe(ops.flat_map(lambda _: failing()))

    # Rule 1.11's same-sequence tests compare subscribers' orders, and concurrent async inners
    # are merged in the order trio happens to run them: the two orders mostly differ (the test
    # then skips, "does not implement OPTIONAL") and now and then agree (it passes), so the
    # suite's outcome changed from run to run. Not promised here; said so every time instead.
    _ORDER = "async inners are merged in the scheduler's order: one sequence for all subscribers is not promised"

    def test_optional_spec111_multicast_must_produce_the_same_elements_in_the_same_sequence_to_all_of_its_subscribers_when_requesting_one_by_one(
        self,
    ):
        pytest.skip(self._ORDER)

    def test_optional_spec111_multicast_must_produce_the_same_elements_in_the_same_sequence_to_all_of_its_subscribers_when_requesting_many_upfront(
        self,
    ):
        pytest.skip(self._ORDER)

    def test_optional_spec111_multicast_must_produce_the_same_elements_in_the_same_sequence_to_all_of_its_subscribers_when_requesting_many_upfront_and_complete_as_expected(
        self,
    ):
        pytest.skip(self._ORDER)


class TestZip(PublisherVerification):
    def create_publisher(self, elements):
        return ops.zip(rsnet.range_(0, elements), rsnet.range_(0, elements + 1), combine=operator.add)

    def create_failed_publisher(self):
        return ops.zip(rsnet.range_(0, 10), failing())


class TestLimitRate(OperatorVerification):
    def operator(self):
        return ops.limit_rate(4)


class TestOnBackpressureBuffer(OperatorVerification):
    """Over an async producer, which stops at each item until the buffer has room."""

    def source(self, elements):
        async def numbers():
            for i in range(elements):
                yield i
                await trio.sleep(0.001)  # a paced producer: the buffer absorbs the bursts

        return rsnet.from_async_iterable(numbers, nursery=self.nursery)

    def operator(self):
        return ops.on_backpressure_buffer(64)


class _DemandGate:
    """Counts the demand seen downstream of the operator under test."""

    def __init__(self) -> None:
        self.demand = 0
        self.changed = trio.Event()

    def add(self, n: int) -> None:
        if n > 0:
            self.demand = rsnet.streams.rules.add_demand(self.demand, n)
            self.changed.set()

    async def take_one(self) -> None:
        while self.demand == 0:
            self.changed = trio.Event()
            await self.changed.wait()
        if self.demand != rsnet.MAX_DEMAND:
            self.demand -= 1


class _GatedSubscription(Subscription):
    def __init__(self, inner: Subscription, gate: _DemandGate) -> None:
        self._inner, self._gate = inner, gate

    def request(self, n: int) -> None:
        self._gate.add(n)
        self._inner.request(n)

    def cancel(self) -> None:
        self._inner.cancel()


class _GatedSubscriber(Subscriber[Any]):
    def __init__(self, downstream: Subscriber[Any], gate: _DemandGate) -> None:
        self._downstream, self._gate = downstream, gate

    def on_subscribe(self, subscription: Subscription) -> None:
        self._downstream.on_subscribe(_GatedSubscription(subscription, self._gate))

    def on_next(self, item: Any) -> None:
        self._downstream.on_next(item)

    def on_error(self, error: BaseException) -> None:
        self._downstream.on_error(error)

    def on_complete(self) -> None:
        self._downstream.on_complete()


class _Gated(Publisher[Any]):
    def __init__(self, publisher: Publisher[Any], gate: _DemandGate) -> None:
        self._publisher, self._gate = publisher, gate

    def subscribe(self, subscriber: Subscriber[Any]) -> None:
        rsnet.streams.rules.check_subscriber(subscriber)
        self._publisher.subscribe(_GatedSubscriber(subscriber, self._gate))


class DroppingOperatorVerification(OperatorVerification):
    """A dropping operator emits exactly n items only if nothing arrives without demand.

    So the source here is a hot producer that emits one item per unit of demand it sees
    *downstream* of the operator (the demand is observed, not changed). The TCK then checks
    the operator's signalling rules; dropping itself is tested in test_operators.py.
    """

    def create_publisher(self, elements):
        # A gate, a source and an operator per subscriber (rule 1.11's tests subscribe twice):
        # two producers sharing one gate would race for its demand, and trio's scheduler
        # decides that race differently from run to run.
        def gated():
            gate = _DemandGate()

            async def paced():
                for i in range(elements):
                    await gate.take_one()
                    yield i

            source = rsnet.from_async_iterable(paced, nursery=self.nursery)
            return _Gated(source.pipe(self.operator()), gate)

        return rsnet.defer(gated)


class TestOnBackpressureDrop(DroppingOperatorVerification):
    def operator(self):
        return ops.on_backpressure_drop()


class TestOnBackpressureLatest(DroppingOperatorVerification):
    def operator(self):
        return ops.on_backpressure_latest()


class TestTimeout(OperatorVerification):
    def source(self, elements):
        async def numbers():
            for i in range(elements):
                yield i

        return rsnet.from_async_iterable(numbers, nursery=self.nursery)

    def operator(self):
        return ops.timeout(3600, nursery=self.nursery)


class TestTimeoutFiring(PublisherVerification):
    """The failed variant is the timeout itself firing on a silent source."""

    def create_publisher(self, elements):
        return rsnet.range_(0, elements).pipe(ops.timeout(3600, nursery=self.nursery))

    def create_failed_publisher(self):
        async def silent():
            await trio.sleep_forever()
            yield 0  # pragma: no cover - never reached

        return rsnet.from_async_iterable(silent, nursery=self.nursery).pipe(ops.timeout(0.001, nursery=self.nursery))


class TestRetry(OperatorVerification):
    """A source that fails on its first two subscriptions and succeeds on the third."""

    def create_publisher(self, elements):
        attempts = itertools.count()

        def source():
            if next(attempts) < 2:
                return failing("transient")
            return rsnet.range_(0, elements)

        return rsnet.defer(source).pipe(ops.retry(5))

    def operator(self):
        return ops.retry(3)


# -- processor and subscribers -------------------------------------------------------------------


class TestMulticastProcessor(IdentityProcessorVerification):
    does_coordinated_emission = True  # the slowest subscriber sets the pace

    def create_identity_processor(self, buffer_size):
        return rsnet.MulticastProcessor(buffer_size)

    def create_failed_publisher(self):
        processor = rsnet.MulticastProcessor(4)
        failing().subscribe(processor)
        return processor

    def create_element(self, element):
        return element


class _Unsubscribed(Publisher[Any]):
    """A stand-in source: the TCK subscribes the subscriber to its own publisher instead."""

    def subscribe(self, subscriber: Subscriber[Any]) -> None:
        pass


class TestIterateSubscriber(SubscriberBlackboxVerification):
    """The subscriber behind ``rsnet.iterate``, with a task consuming its items."""

    def create_subscriber(self):
        iterator = PublisherIterator(_Unsubscribed(), prefetch=16)

        async def consume():
            try:
                async for _ in iterator:
                    pass
            except Exception:
                pass

        self.nursery.start_soon(consume)
        return iterator._subscriber

    def create_element(self, element):
        return element


class TestBlockingIterateSubscriber(SubscriberBlackboxVerification):
    """The trio-side subscriber behind ``rsnet.blocking_iterate``."""

    def create_subscriber(self):
        import queue

        return _QueueSubscriber(queue.Queue(maxsize=17), 16)

    def create_element(self, element):
        return element
