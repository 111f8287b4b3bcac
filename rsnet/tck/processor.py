"""``IdentityProcessorVerification``: a Processor obeys both contracts (rule 4.1).

Port of ``org.reactivestreams.tck.IdentityProcessorVerification`` (TCK 1.0.4): 68 tests, the
38 of :class:`~rsnet.tck.PublisherVerification` and the 27 of
:class:`~rsnet.tck.SubscriberWhiteboxVerification` (inherited: Python's multiple inheritance
replaces Java's delegation), plus 3 of its own.

As a publisher, the processor under test is fed by the TCK's helper publisher of ``elements``
items; as a subscriber, it is driven by the TCK and watched through a subscriber of the TCK
subscribed to it (which plays the whitebox probe: its ``request`` is ``trigger_request``).

Factories are methods, settings are class attributes:

``create_identity_processor(buffer_size) -> Processor``
    A processor that passes every element on unchanged and can buffer ``buffer_size`` of them.
``create_failed_publisher() -> Publisher | None``
    As for :class:`~rsnet.tck.PublisherVerification`.
``create_element(element: int) -> T``
    The element the TCK sends as number ``element``; never ``None``.
``create_helper_publisher(elements)`` (optional)
    The upstream source; the default is the TCK's asynchronous helper publisher.
``processor_buffer_size`` (16)
    The ``buffer_size`` passed to ``create_identity_processor``.
``max_supported_subscribers`` (``MAX_DEMAND``)
    How many subscribers the processor serves at once; below 2 the two multi-subscriber tests
    are skipped.
``does_coordinated_emission`` (False)
    True for a processor that emits to all subscribers in lockstep; the two multi-subscriber
    tests then let every subscriber request first (Java's ``doesCoordinatedEmission``).
``max_elements_from_publisher``, ``bounded_depth_of_on_next_and_request_recursion``,
``skip_stochastic_tests``
    As for :class:`~rsnet.tck.PublisherVerification`.

Plus the settings of :class:`rsnet.tck.environment.Verification`. All factories are called
inside the test's ``trio.run``, where ``self.nursery`` is available.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import ClassVar, TypeVar

import pytest

from rsnet.streams.interfaces import Processor, Publisher, Subscriber, Subscription
from rsnet.streams.rules import MAX_DEMAND, validate_subscription
from rsnet.tck.environment import (
    TEST_BUFFER_SIZE,
    ManualPublisher,
    ManualSubscriber,
    Promise,
    TestEnvironment,
)
from rsnet.tck.publisher import PublisherVerification
from rsnet.tck.subscriber_whitebox import (
    SubscriberPuppet,
    SubscriberWhiteboxVerification,
    WhiteboxSubscriberProbe,
)

T = TypeVar("T")


class _ProcessorStage(ManualPublisher[T]):
    """Feeds the processor under test by hand, with unique elements from ``tees`` (Java: TestSetup)."""

    tees: ManualSubscriber[T]
    processor: Processor[T, T]

    def __init__(self, env: TestEnvironment) -> None:
        super().__init__(env)
        self._seen: list[T] = []

    async def new_subscriber(self) -> ManualSubscriber[T]:
        return await self.env.new_manual_subscriber(self.processor)

    async def send_next_from_upstream(self) -> T:
        element = await self.tees.request_next_element()
        if element in self._seen:
            raise AssertionError(f"Helper publisher illegally produced the same element {element!r} twice")
        self._seen.append(element)
        self.send_next(element)
        return element

    async def expect_next_element(self, sub: ManualSubscriber[T], expected: T, hint: str = "") -> None:
        element = await sub.next_element(f"timeout while awaiting {expected!r}{hint}")
        if element != expected:
            raise AssertionError(f"Received `on_next({element!r})` on downstream but expected `on_next({expected!r})`")


_COORDINATION_HINT = (
    ". If the processor coordinates emission across its subscribers (an element goes out only"
    " when all of them have demand), set does_coordinated_emission = True on the verification"
)


class _ErrorCollectingSubscriber(ManualSubscriber[T]):
    """A manual subscriber for which ``on_error`` is expected, not a failure."""

    def __init__(self, env: TestEnvironment) -> None:
        super().__init__(env)
        self.error: Promise[BaseException] = Promise(env)

    def on_error(self, error: BaseException) -> None:
        self.error.complete(error)

    async def expect_error_instance(self, expected: BaseException) -> None:
        error = await self.error.expect_completion("Did not receive expected error on downstream")
        if error is not expected:
            raise AssertionError(f"Expected error {expected!r} but got {error!r}")


class _SubscriptionPuppet:
    """The whitebox puppet of the TCK's subscriber downstream of the processor."""

    def __init__(self, subscription: Subscription) -> None:
        self._subscription = subscription

    def trigger_request(self, elements: int) -> None:
        self._subscription.request(elements)

    def signal_cancel(self) -> None:
        self._subscription.cancel()


class _ProbeSubscriber(Subscriber[T]):
    """The TCK's subscriber downstream of the processor under test, reporting to the probe."""

    def __init__(self, probe: WhiteboxSubscriberProbe[T]) -> None:
        self._probe = probe
        self._subscription: Subscription | None = None

    def on_subscribe(self, subscription: Subscription) -> None:
        if not validate_subscription(self._subscription, subscription):  # the probe obeys rule 2.5 too
            return
        self._subscription = subscription
        puppet: SubscriberPuppet = _SubscriptionPuppet(subscription)
        self._probe.register_on_subscribe(puppet)

    def on_next(self, element: T) -> None:
        self._probe.register_on_next(element)

    def on_error(self, error: BaseException) -> None:
        self._probe.register_on_error(error)

    def on_complete(self) -> None:
        self._probe.register_on_complete()


class IdentityProcessorVerification(PublisherVerification[T], SubscriberWhiteboxVerification[T]):
    """The Publisher and Subscriber rules for a processor, and the Processor rules (section 4)."""

    processor_buffer_size: ClassVar[int] = TEST_BUFFER_SIZE
    max_supported_subscribers: ClassVar[int] = MAX_DEMAND
    does_coordinated_emission: ClassVar[bool] = False
    """True for a processor that emits to all its subscribers in lockstep (an element goes out
    only when every subscriber has demand for it); the two multi-subscriber tests then have
    every subscriber request before expecting elements (Java's ``doesCoordinatedEmission``)."""

    def create_identity_processor(self, buffer_size: int) -> Processor[T, T]:
        """A processor passing elements on unchanged, able to buffer ``buffer_size`` of them."""
        raise NotImplementedError(f"{type(self).__name__} must implement create_identity_processor(buffer_size)")

    def create_publisher(self, elements: int) -> Publisher[T]:
        """The processor under test, fed by a helper publisher of ``elements`` items."""
        processor = self.create_identity_processor(self.processor_buffer_size)
        self.create_helper_publisher(elements).subscribe(processor)
        return processor

    def create_subscriber(self, probe: WhiteboxSubscriberProbe[T]) -> Subscriber[T]:
        """The processor under test, with a subscriber of the TCK downstream reporting to ``probe``."""
        processor = self.create_identity_processor(self.processor_buffer_size)
        processor.subscribe(_ProbeSubscriber(probe))
        return processor

    # -- harness ------------------------------------------------------------------------------

    def _processor_test(self, body: Callable[[_ProcessorStage[T]], Awaitable[None]], *, subscribers: int = 1) -> None:
        """Run ``body(stage)`` with the processor under test subscribed to a manual publisher."""
        if subscribers > self.max_supported_subscribers:
            pytest.skip(
                f"The Publisher under test only supports {self.max_supported_subscribers} subscriber(s), "
                f"while this test requires at least {subscribers} to run"
            )

        async def run() -> None:
            stage: _ProcessorStage[T] = _ProcessorStage(self.env)
            stage.tees = await self.env.new_manual_subscriber(self.create_helper_publisher(MAX_DEMAND))
            stage.processor = self.create_identity_processor(self.processor_buffer_size)
            stage.subscribe(stage.processor)
            await body(stage)

        self.run_test(run)

    # -- processor rules ----------------------------------------------------------------------

    def test_required_spec104_must_call_on_error_on_all_its_subscribers_if_it_encounters_a_non_recoverable_error(
        self,
    ) -> None:
        """Rules 1.4, 4.1: an upstream on_error reaches both subscribers, whatever their demand."""

        async def body(stage: _ProcessorStage[T]) -> None:
            env = self.env
            sub1: _ErrorCollectingSubscriber[T] = _ErrorCollectingSubscriber(env)
            await env.subscribe(stage.processor, sub1)
            sub2: _ErrorCollectingSubscriber[T] = _ErrorCollectingSubscriber(env)
            await env.subscribe(stage.processor, sub2)

            if self.does_coordinated_emission:
                sub1.request(1)
                sub2.request(1)
                await stage.expect_request()
                x = await stage.send_next_from_upstream()
                await stage.expect_next_element(sub1, x)
                await stage.expect_next_element(sub2, x)
                sub1.request(1)
                sub2.request(1)
            else:
                sub1.request(1)
                await stage.expect_request("Did not receive expected `request` call" + _COORDINATION_HINT)
                x = await stage.send_next_from_upstream()
                await stage.expect_next_element(sub1, x, _COORDINATION_HINT)
                sub1.request(1)
                # sub1 has received one element and has one demand pending; sub2 requested nothing.

            error = RuntimeError("Test exception")
            stage.send_error(error)
            await sub1.expect_error_instance(error)
            await sub2.expect_error_instance(error)
            env.verify_no_async_errors_no_delay()

        self._processor_test(body, subscribers=2)

    def test_required_must_immediately_pass_on_on_error_events_received_from_its_upstream_to_its_downstream(
        self,
    ) -> None:
        """Rule 4.2: an upstream on_error reaches the subscriber at once, without any request.

        The Java name has no status prefix; the Java TCK treats this test as required.
        """

        async def body(stage: _ProcessorStage[T]) -> None:
            sub: _ErrorCollectingSubscriber[T] = _ErrorCollectingSubscriber(self.env)
            await self.env.subscribe(stage.processor, sub)
            error = RuntimeError("Test exception")
            stage.send_error(error)
            await sub.expect_error_instance(error)  # "immediately": no request preceded it
            self.env.verify_no_async_errors_no_delay()

        self._processor_test(body)

    def test_required_must_request_from_upstream_for_elements_that_have_been_requested_long_ago(
        self,
    ) -> None:
        """Rule 4.1: the processor keeps requesting upstream for an old demand while a new subscriber joins."""

        async def body(stage: _ProcessorStage[T]) -> None:
            sub1 = await stage.new_subscriber()
            sub1.request(20)

            total_requests = await stage.expect_request()
            x = await stage.send_next_from_upstream()
            await stage.expect_next_element(sub1, x)

            if total_requests == 1:
                total_requests += await stage.expect_request()
            y = await stage.send_next_from_upstream()
            await stage.expect_next_element(sub1, y)

            if total_requests == 2:
                total_requests += await stage.expect_request()

            sub2 = await stage.new_subscriber()
            # sub1 now has 18 pending, sub2 has 0 pending.
            if self.does_coordinated_emission:
                await sub2.expect_none("Subscriber 2 requested nothing yet, but got")
                sub2.request(1)
                z = await stage.send_next_from_upstream()
                await stage.expect_next_element(sub1, z)
                await stage.expect_next_element(sub2, z)
            else:
                z = await stage.send_next_from_upstream()
                await stage.expect_next_element(sub1, z, _COORDINATION_HINT)
                await sub2.expect_none("Subscriber 2 requested nothing yet, but got")
                sub2.request(1)
                await stage.expect_next_element(sub2, z)

            if total_requests == 3:
                await stage.expect_request()

            # End the stream, so that the harness shuts down quietly.
            stage.send_completion()
            await sub1.expect_completion()
            await sub2.expect_completion()
            self.env.verify_no_async_errors_no_delay()

        self._processor_test(body, subscribers=2)
